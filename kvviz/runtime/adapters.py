"""LoRA adapters on a model: ``BASE@ADAPTER`` names a base model with an adapter merged into it.

A model name with an ``@`` (``smollm2-135m@handbook``) is the base model (``smollm2-135m``, any
name ``kvviz.runtime.models`` loads) with a LoRA adapter merged into its weights, so that the result
is an ordinary model of the base's architecture: every handoff, the decode loop and the cache work
on it unchanged. ``ADAPTER`` is a shipped adapter's name, found in ``assets/adapters/BASE/ADAPTER``,
or a folder (a path with a ``/``: a trainer's output).

An adapter folder is what ``peft`` saves (``adapter_config.json`` and ``adapter_model.safetensors``)
plus kvviz's card (``adapter.json``: the base it was trained on, how, and what it was measured to
know). Weights are read as safetensors only; a folder holding pickle weights is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvviz.core.paths import ASSETS

SEPARATOR = "@"
SHIPPED_ADAPTERS = ASSETS / "adapters"
PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
CARD = "adapter.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


class AdapterError(ValueError):
    """An adapter is missing, unsafe to read, or made for another base model; the message says what to do."""


def split_name(name: str) -> tuple[str, str | None]:
    """(base model name, adapter or None): ``"smollm2-135m@handbook"`` -> ``("smollm2-135m", "handbook")``."""
    base, separator, adapter = name.partition(SEPARATOR)
    if not separator:
        return name, None
    if not base.strip() or not adapter.strip():
        raise AdapterError(f"'{name}' names an adapter without its base or an empty adapter: write BASE{SEPARATOR}ADAPTER.")
    return base.strip(), adapter.strip()


def adapter_folder(base: str, adapter: str) -> Path:
    """Where the adapter lives: a folder path as given, else the shipped ``assets/adapters/BASE/ADAPTER``."""
    if "/" in adapter or adapter.startswith((".", "~")):
        return Path(adapter).expanduser()
    return SHIPPED_ADAPTERS / base.replace("/", "--") / adapter


def read_card(folder: Path) -> dict:
    """The adapter's kvviz card (``adapter.json``), or {} when it has none."""
    path = Path(folder) / CARD
    if not path.is_file():
        return {}
    try:
        card = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise AdapterError(f"The adapter card {path} is not valid JSON: {error}") from error
    return card if isinstance(card, dict) else {}


def check_folder(folder: Path, name: str) -> None:
    """Refuse a folder that is missing, lacks peft's two files, or holds pickle weights."""
    if not folder.is_dir():
        shipped = sorted(p.name for p in folder.parent.iterdir() if p.is_dir()) if folder.parent.is_dir() else []
        raise AdapterError(
            f"No adapter for '{name}' at {folder}" + (f" (shipped for this base: {', '.join(shipped)})" if shipped else "")
            + ". Train one with: python -m kvviz train-sharer"
        )
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickled:
        raise AdapterError(f"The adapter folder {folder} holds pickle weights ({', '.join(pickled[:3])}); kvviz reads "
                           "safetensors only, because loading a pickle file can run code.")
    missing = [f for f in (PEFT_CONFIG, PEFT_WEIGHTS) if not (folder / f).is_file()]
    if missing:
        raise AdapterError(f"The adapter folder {folder} lacks {', '.join(missing)} (peft's save_pretrained writes both).")


def check_base(card: dict, config, folder: Path) -> None:
    """Refuse an adapter whose card says it was trained on another architecture than ``config``'s."""
    trained_on = card.get("base_config") or {}
    differ = [f"{key} {trained_on[key]!r} != {getattr(config, key, None)!r}"
              for key in ("model_type", "num_hidden_layers", "hidden_size") if key in trained_on
              and trained_on[key] != getattr(config, key, None)]
    if differ:
        raise AdapterError(f"The adapter at {folder} was trained on {card.get('base', 'another model')}, whose "
                           f"architecture differs from this base's: {'; '.join(differ)}.")


def merge(model, name: str, progress=print):
    """``model`` (the base, loaded for ``name``'s base) with ``name``'s adapter merged into its weights."""
    from peft import PeftModel

    base, adapter = split_name(name)
    if adapter is None:
        return model
    folder = adapter_folder(base, adapter)
    check_folder(folder, name)
    check_base(read_card(folder), model.config, folder)
    progress(f"Merging the LoRA adapter {folder} into {base} ...")
    try:
        wrapped = PeftModel.from_pretrained(model, str(folder), is_trainable=False)
    except (ValueError, KeyError, RuntimeError, OSError) as error:
        raise AdapterError(f"Could not apply the adapter at {folder} to {base}: {type(error).__name__}: {error}") from error
    return wrapped.merge_and_unload()
