"""The page shows the stored runs of the numeric mode its live runs compute in (issue 42, gate 3):
``presets.json`` and ``sweep.json`` in bf16, ``presets-fp32.json`` and ``sweep-fp32.json`` in fp32
(``kvviz.app.presets.stored_in``), so that Run live on a preset gives the answers its lesson was checked
against on a CPU without bfloat16 products too. (Each mode's lessons and exercises: test_presets.py and
test_exercises.py, once per mode.)"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kvviz.app.presets import (FIRST_MODE, PRECOMPUTED_PATH, PRECOMPUTED_SWEEP_PATH, PRESETS, live_mode,
                               load_precomputed, load_precomputed_sweep, stored_for_this_machine, stored_in)
from kvviz.runtime import numerics
from tests.stored_runs import STORED_BY_MODE

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_each_mode_has_its_own_files_beside_the_first_modes():
    assert FIRST_MODE in numerics.MODES
    assert stored_in(PRECOMPUTED_PATH, FIRST_MODE) == PRECOMPUTED_PATH
    assert stored_in(PRECOMPUTED_PATH, "fp32") == PRECOMPUTED_PATH.with_name("presets-fp32.json")
    assert stored_in(PRECOMPUTED_SWEEP_PATH, "fp32") == PRECOMPUTED_SWEEP_PATH.with_name("sweep-fp32.json")
    for mode in numerics.MODES:
        for path in (PRECOMPUTED_PATH, PRECOMPUTED_SWEEP_PATH):
            stored = json.loads(stored_in(path, mode).read_text(encoding="utf-8"))
            assert stored["numerics"] == mode, (stored_in(path, mode).name, stored["numerics"])


def test_a_page_computing_in_fp32_shows_the_fp32_runs(monkeypatch):
    monkeypatch.setenv("KVVIZ_NUMERICS", "fp32")
    assert live_mode() == "fp32"
    assert load_precomputed()["numerics"] == "fp32"
    assert load_precomputed_sweep()["numerics"] == "fp32"


def test_a_page_computing_in_bf16_or_refused_it_shows_the_first_modes_runs(monkeypatch):
    """bf16 asked for on a CPU without bfloat16 products is refused when the models load (they say
    why); the page still opens, on the first mode's runs."""
    monkeypatch.setenv("KVVIZ_NUMERICS", "bf16")
    assert live_mode() == ("bf16" if numerics.native_bf16() else FIRST_MODE)
    assert load_precomputed()["numerics"] == "bf16"
    assert load_precomputed_sweep()["numerics"] == "bf16"


def test_auto_shows_the_runs_of_what_this_cpu_computes_in(monkeypatch):
    monkeypatch.setenv("KVVIZ_NUMERICS", "auto")
    assert load_precomputed()["numerics"] == ("bf16" if numerics.native_bf16() else "fp32")


def test_a_mode_without_stored_runs_falls_back_to_the_first_modes(tmp_path, monkeypatch):
    monkeypatch.setenv("KVVIZ_NUMERICS", "fp32")
    first = tmp_path / "presets.json"
    first.write_text('{"numerics": "bf16", "presets": {}}', encoding="utf-8")
    assert stored_for_this_machine(first) == first
    (tmp_path / "presets-fp32.json").write_text('{"numerics": "fp32", "presets": {}}', encoding="utf-8")
    assert stored_for_this_machine(first) == tmp_path / "presets-fp32.json"


def test_every_mode_stores_the_same_questions_and_runs():
    """Only the numbers differ between the modes' files: every preset, asked the same way, with the
    same extra runs."""
    for preset in PRESETS:
        entries = [files["presets"][preset.key] for files in STORED_BY_MODE.values()]
        assert all(entry["request"] == entries[0]["request"] for entry in entries), preset.key
        assert all(sorted(entry.get("runs") or {}) == sorted(entries[0].get("runs") or {}) for entry in entries), preset.key
        assert all({r["handoff"] for r in entry["results"]} == {r["handoff"] for r in entries[0]["results"]}
                   for entry in entries), preset.key


def precompute_script():
    spec = importlib.util.spec_from_file_location("precompute_presets", REPO_ROOT / "scripts" / "precompute_presets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_precompute_script_writes_and_updates_only_the_file_of_its_own_mode(tmp_path, monkeypatch, capsys):
    script = precompute_script()
    monkeypatch.setattr(script, "ROOT", tmp_path)
    monkeypatch.setattr(script, "PRECOMPUTED_PATH", tmp_path / "presets.json")
    monkeypatch.setenv("KVVIZ_NUMERICS", "fp32")
    with pytest.raises(SystemExit, match="presets-fp32.json does not exist yet"):
        script.stored_file()  # a partial update (--preset, --only) needs this mode's file
    script.write_and_check(STORED_BY_MODE["fp32"], "wrote")
    assert "every preset's lesson holds" in capsys.readouterr().out
    assert (tmp_path / "presets-fp32.json").is_file() and not (tmp_path / "presets.json").exists()
    assert script.stored_file()["numerics"] == "fp32"
