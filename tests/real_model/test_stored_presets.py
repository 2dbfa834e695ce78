"""Gate 3 of issue 42: the stored presets the page shows (``load_precomputed``: the file of this machine's
numeric mode, ``kvviz.runtime.numerics``: presets.json in bf16, presets-fp32.json in fp32) are what a
live run gives on this machine."""

from __future__ import annotations

import pytest

from kvviz.app.presets import DEFAULT_PRESET, load_precomputed, preset
from kvviz.core.results import HandoffRequest
from kvviz.engine import stream


@pytest.mark.real_model
def test_the_stored_answers_the_page_shows_are_a_live_runs_on_this_machine(embedded_pair, one_thread):
    stored = load_precomputed()
    assert stored.get("numerics") == embedded_pair.receiver.numerics, "the page shows another mode's stored runs"
    entry = stored["presets"][DEFAULT_PRESET]
    request = HandoffRequest.from_dict(entry["request"])
    assert request.query == preset(DEFAULT_PRESET).query
    names = preset(DEFAULT_PRESET).columns
    kept = {result["handoff"]: result for result in entry["results"]}
    live = {result.handoff: result for result in stream.results(embedded_pair, request, names)}
    for name in names:
        assert live[name].answer_ids == kept[name]["answer_ids"], (name, live[name].answer, kept[name]["answer"])
