"""kvviz.app.sweep: one handoff's accuracy against one of its options, on a tiny pair."""

from __future__ import annotations

import pytest

from kvviz.app import plots
from kvviz.app.sweep import default_handoff, run_sweep
from kvviz.handoffs import registry
from tests.conftest import tiny_pair

pytestmark = pytest.mark.usefixtures("one_thread")


def test_sweep_runs_every_point_once_and_shares_the_same_ones():
    items = [{"context": "The code is 4471.", "query": "What is the code?", "answers": ["4471"]}]
    calls = []
    data = run_sweep(tiny_pair("llama"), ["kvcomm", "random"], 2, items=items, progress=lambda f, desc: calls.append(f))
    spec = default_handoff().sweep
    x, series, count = spec.x_option, spec.series_option, spec.count_name
    assert data["handoff"] == default_handoff().name
    assert len(data["points"]) == 2 * len(spec.x_values)
    references = {h.name for h in registry.with_role("floor") + registry.with_role("ceiling")}
    assert set(data["baselines"]) == references
    by_key = {(p[series], p[x]): p for p in data["points"]}
    assert by_key[("kvcomm", 0.0)][count] == 0 and by_key[("random", 1.0)][count] == by_key[("kvcomm", 1.0)][count] > 0
    # shared x values run once for every series; the progress bar reaches the end
    shared, inner = len(spec.shared_x), len(spec.x_values) - len(spec.shared_x)
    assert len(data["answers"]) == len(references) + shared + 2 * inner
    assert calls and calls[-1] == pytest.approx(1.0)
    figure = plots.sweep_figure(data)
    assert [t["meta"]["series"] for t in figure.to_dict()["data"]][:2] == ["kvcomm", "random"]


def test_unknown_series_values_fall_back_to_the_first_default():
    items = [{"context": "The code is 4471.", "query": "What is the code?", "answers": ["4471"]}]
    data = run_sweep(tiny_pair("llama"), ["best"], 1, items=items)
    assert data["series"] == [default_handoff().sweep.series_default[0]]
