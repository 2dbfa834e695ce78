"""The presets' stored runs of every numeric mode (``kvviz.app.presets.stored_in``), read once for all
the test modules that check them (two files of about 9 MB each)."""

from __future__ import annotations

from kvviz.app.presets import PRECOMPUTED_PATH, load_precomputed, stored_in
from kvviz.runtime.numerics import MODES

STORED_BY_MODE = {mode: load_precomputed(stored_in(PRECOMPUTED_PATH, mode)) for mode in MODES}
