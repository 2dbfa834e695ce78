"""Where kvviz's files are: the project folder and its assets, the shared data beside it, the cache.

A leaf: it imports nothing from kvviz, so every module (the lowest included) can ask it.

* ``PROJECT_ROOT``: the folder that holds ``kvviz/``, ``assets/`` and ``app.py`` (a clone, or an
  exported Space);
* ``ASSETS`` and its parts: the shipped fusers, the handoffs' diagrams, the precomputed results;
* ``SHARED_DATA``: ``../shared/data`` beside the project (the datasets; ``KVVIZ_DATA_DIR``
  overrides it, see ``kvviz.data``);
* ``cache_dir()``: where converted models, output-head indexes and converted fusers live;
* ``state_dir()``: what kvviz itself keeps (the workshop store's SQLite file), never shared data.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
ASSETS = PROJECT_ROOT / "assets"
SHIPPED_FUSERS = ASSETS / "fusers"
PRECOMPUTED = ASSETS / "precomputed"
# the shared folder sits next to the repository checkout, not inside it: the data is never committed
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"


def cache_dir() -> Path:
    """Where converted models live: $KVVIZ_CACHE_DIR, else $XDG_CACHE_HOME/kvviz, else ~/.cache/kvviz."""
    if os.environ.get("KVVIZ_CACHE_DIR"):
        return Path(os.environ["KVVIZ_CACHE_DIR"]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kvviz"


def state_dir() -> Path:
    """kvviz's own data folder: $KVVIZ_STATE_DIR, else $XDG_DATA_HOME/kvviz, else ~/.local/share/kvviz
    (the datasets' folder, shared and read-only in CI, is not written to)."""
    if os.environ.get("KVVIZ_STATE_DIR"):
        return Path(os.environ["KVVIZ_STATE_DIR"]).expanduser()
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "kvviz"


def project_label(path: str | Path) -> str:
    """A path as results and reports show it: relative to the project when inside it, so that
    shipped results name no machine-specific folder."""
    resolved = Path(path).resolve()
    try:
        return str(resolved.relative_to(PROJECT_ROOT))
    except ValueError:
        return str(resolved)


def git(*arguments: str) -> str | None:
    """The output of a git command run in the project folder, or None outside a clone."""
    try:
        return subprocess.run(["git", *arguments], capture_output=True, text=True, check=True, cwd=PROJECT_ROOT).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
