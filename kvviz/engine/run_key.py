"""What makes two runs one computation (``kvviz.engine.shared_runs``): a greedy run is a pure function of
its key (``run_key``): the pair, the fingerprints of its models and of every shipped or cached fuser and
translator, the question, the note, the handoffs, their options, the generation settings, the code's
version and the server's ``KVVIZ_*`` settings (the numeric mode among them)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Iterable

import kvviz
from kvviz.core.paths import ASSETS, cache_dir
from kvviz.core.results import HandoffRequest
from kvviz.runtime.models import EMBEDDED_MODELS, converted_dir, resolve_pair


def _files_identity(root: Path) -> list:
    """(path, size, mtime) of every file under ``root`` (none when it does not exist)."""
    if not root.exists():
        return []
    if root.is_file():
        stat = root.stat()
        return [(str(root), stat.st_size, stat.st_mtime_ns)]
    found = []
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            path = Path(folder) / name
            try:
                stat = path.stat()
            except OSError:
                continue
            found.append((str(path), stat.st_size, stat.st_mtime_ns))
    return sorted(found)


def model_identity(name: str) -> list:
    """What a model's answers depend on that is not in the request: its files on disk (a local
    folder or file, an embedded model's converted folder); a hub id by its name."""
    if name in EMBEDDED_MODELS:
        return [name, _files_identity(converted_dir(name))]
    path = Path(name).expanduser()
    return [name, _files_identity(path) if path.exists() else None]


def fingerprint(pair_name: str) -> str:
    """The pair's fingerprint: its models' files, every shipped or cached fuser and translator, the
    code's version (``code_version``) and the server's ``KVVIZ_*`` settings (dtype, device, batched
    decode ...). A ValueError for a pair that does not resolve (``resolve_pair``)."""
    spec = resolve_pair(pair_name)
    parts = {
        "pair": dataclasses.asdict(spec),
        "models": [model_identity(name) for name in dict.fromkeys(spec.model_names())],
        "checkpoints": [_files_identity(root) for root in (ASSETS / "fusers", ASSETS / "translators",
                                                           cache_dir() / "fusers", cache_dir() / "translators")],
        "code": code_version(),
        "settings": sorted((k, v) for k, v in os.environ.items() if k.startswith("KVVIZ_") and k != "KVVIZ_DATA_DIR"),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


_code_version: str | None = None


def code_version() -> str:
    """kvviz's version and its source files' sizes and times (once per process)."""
    global _code_version
    if _code_version is None:
        source = Path(kvviz.__file__).parent
        files = [(str(p.relative_to(source)), s, m) for p, s, m in
                 ((Path(f), s, m) for f, s, m in _files_identity(source)) if p.suffix == ".py"]
        digest = hashlib.sha256(json.dumps(files).encode()).hexdigest()[:12]
        _code_version = f"{kvviz.__version__}+{digest}"
    return _code_version


def shareable(request: HandoffRequest) -> bool:
    """Only greedy runs are shared: a sampling run is the learner's own draw."""
    return bool(request.generation.greedy)


def run_key(pair_name: str, request: HandoffRequest, names: Iterable[str], workers: int, fingerprint_of: str) -> str:
    """The key of a run: everything its answers depend on (see the module's docstring)."""
    asked = {"pair": pair_name, "fingerprint": fingerprint_of, "request": request.to_dict(), "names": list(names),
             "workers": workers}
    return hashlib.sha256(json.dumps(asked, sort_keys=True, default=str).encode()).hexdigest()
