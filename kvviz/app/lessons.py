"""Does a preset's precomputed run still show its lesson? Each preset's ``check`` (assets/presets.toml)
holds what its lesson says its run shows, as questions of the one vocabulary
(``kvviz.app.reading.questions``); ``failures`` reads the stored run once (``kvviz.app.reading``)
and lists every claim it does not show, and the same for each of its stored ``runs``.
``tests/unit/test_presets.py`` runs it over assets/precomputed/presets.json (so a regenerated
preset that stops showing its lesson fails the tests) and ``scripts/precompute_presets.py`` prints
it after writing the file.

Verdicts are the page's (``kvviz.data.metrics.verdict``), evidence is the page's one rule
(``kvviz.app.reading.evidence``): the lessons are checked against what the page says.
"""

from __future__ import annotations

from kvviz.app.presets import Preset
from kvviz.app.reading.reading import Reading, read


def stored_reading(preset: Preset, entry: dict, pair: str = "") -> Reading:
    """A preset's stored run (``entry``: ``{"results": [...]}``), read by its own answers."""
    return read({**entry, "pair": pair, "preset": preset.key, "precomputed": True}, preset.answers, preset.subject)


def failures(preset: Preset, entry: dict | None) -> list[str]:
    """Every claim of ``preset.check`` and of its runs' checks that its precomputed ``entry``
    (``{"results": [...], "runs": {label: {"results": [...]}}}``) does not show."""
    if not entry:
        return [f"{preset.key}: no precomputed results"]
    out = stored_reading(preset, entry).failures(preset.claims, preset.key)
    for run in preset.runs:
        stored = (entry.get("runs") or {}).get(run.label)
        if stored is None:
            out.append(f"{preset.key}, {run.label}: not precomputed")
            continue
        out += stored_reading(preset, stored).failures(run.claims, f"{preset.key}, {run.label}")
    return out
