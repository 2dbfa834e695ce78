"""Which translator a run reads: the one the request names (its ``translator`` option) or the pair's
shipped one (found by the pair's fingerprints in ``assets/translators/``), loaded once per process,
with the held-out numbers measured for it (``measured.json`` beside it)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from kvviz.core import policy
from kvviz.core.paths import ASSETS
from kvviz.core.results import HandoffRequest
from kvviz.handoffs.registry import Option, option_values
from kvviz.handoffs.translate import translator as tr
from kvviz.runtime.models import LoadedPair

NAME, CONTROL = "c2c_translate", "c2c_translate_control"  # the translation handoff and its control
ASSETS_DIR = ASSETS / "translators"
MEASURED_FILE = "measured.json"  # the translator evaluator's held-out numbers, beside the weights


def shipped_translator(pair: LoadedPair, root: Path | None = None) -> Path | None:
    """The shipped translator whose fingerprints match the pair, or None."""
    root = ASSETS_DIR if root is None else root
    if not root.is_dir():
        return None
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            config = tr.read_config(folder)
            tr.check_pair(config, folder, pair.sharer.facts, pair.receiver.facts, pair.name)
        except tr.TranslatorError:
            continue
        return folder
    return None


def translator_option(request: HandoffRequest) -> str:
    """The translator folder the request names ("" for the pair's shipped one)."""
    return (option_values(request, NAME, OPTIONS).get("translator") or "").strip()


def locate(pair: LoadedPair, request: HandoffRequest) -> tuple[Path | None, str]:
    """(the translator folder, "") or (None, why there is none)."""
    given = translator_option(request)
    if given:
        folder = Path(given).expanduser()
        if not (folder / tr.CONFIG_FILE).is_file():
            return None, f"No KV translator at {folder}: it has no {tr.CONFIG_FILE}."
        refusal = policy.fuser_folder_refusal(folder, (tr.CONFIG_FILE, tr.WEIGHTS_FILE))
        return (None, refusal) if refusal else (folder, "")
    found = shipped_translator(pair)
    if found is None:
        return None, (
            f"No KV translator for pair '{pair.name}' (sharer {pair.sharer.name} -> receiver {pair.receiver.name}) in "
            f"{ASSETS_DIR}; name one with --translator DIR, or fit one (docs/C2C.md, Translation)."
        )
    return found, ""


_loaded: dict[tuple, tr.KVTranslator] = {}


_lock = threading.Lock()


def get_translator(folder: Path, pair: LoadedPair) -> tr.KVTranslator:
    """The translator in ``folder`` for this pair, loaded once (refused with TranslatorError)."""
    weights = folder / tr.WEIGHTS_FILE
    key = (str(folder.resolve()), weights.stat().st_mtime_ns if weights.exists() else 0, pair.sharer.name, pair.receiver.name)
    with _lock:
        if key not in _loaded:
            _loaded[key] = tr.load_translator(folder, pair.sharer.facts, pair.receiver.facts, pair.name, pair.receiver.device)
        return _loaded[key]


def measured_numbers(folder: Path) -> dict | None:
    """The held-out numbers measured for this translator (``measured.json`` beside it), or None."""
    path = Path(folder) / MEASURED_FILE
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None


def translator_found(pair: LoadedPair, request: HandoffRequest) -> str | None:
    folder, reason = locate(pair, request)
    return reason if folder is None else None


def refuse_in_public_mode(folder: str) -> None:
    """A public server runs the shipped translator only (``kvviz.core.policy``)."""
    if folder.strip() and policy.public_mode():
        raise ValueError(policy.PUBLIC_FUSER_REFUSAL)


OPTIONS = (
    Option("translator", "KV translator folder (default: the pair's shipped one)", "", kind="text", flag="--translator",
           on_page=False, check=refuse_in_public_mode),
)
