"""Gate 3 of issue 42: the stored presets (assets/precomputed/presets.json) are what a live run gives
on this machine in the numeric mode they were computed in (``kvviz.runtime.numerics``)."""

from __future__ import annotations

import pytest

from kvviz.app.presets import DEFAULT_PRESET, load_precomputed, preset
from kvviz.core.results import HandoffRequest
from kvviz.engine import stream


@pytest.mark.real_model
def test_the_opening_presets_stored_answers_are_a_live_runs_in_the_mode_they_were_stored_in(embedded_pair, one_thread):
    stored = load_precomputed()
    mode, here = stored.get("numerics", "fp32"), embedded_pair.receiver.numerics
    if mode != here:
        pytest.skip(f"the presets were stored in the {mode} numeric mode; this process computes in {here} "
                    f"(KVVIZ_NUMERICS={mode} on a CPU that has it)")
    entry = stored["presets"][DEFAULT_PRESET]
    request = HandoffRequest.from_dict(entry["request"])
    assert request.query == preset(DEFAULT_PRESET).query
    names = preset(DEFAULT_PRESET).columns
    kept = {result["handoff"]: result for result in entry["results"]}
    live = {result.handoff: result for result in stream.results(embedded_pair, request, names)}
    for name in names:
        assert live[name].answer_ids == kept[name]["answer_ids"], (name, live[name].answer, kept[name]["answer"])
