"""The figures across handoffs (kvviz.app.plots) on hand-made results, no models: stages stacked in
the handoff's colour, bytes on a log scale, the sweep, one colour per handoff everywhere, lists
not base64 arrays, fixed heights. Each handoff's own figure is tested with its handoff."""

from __future__ import annotations

import json

import pytest

from kvviz.app import plots
from kvviz.app.methods import c2c as c2c_page
from kvviz.app.methods import kvcomm as kvcomm_page
from kvviz.app.methods import registry as methods
from kvviz.core.results import STAGES, HandoffResult
from kvviz.handoffs import registry

NUM_LAYERS = 6
SELECTED = {0, 2, 3}


def kvcomm_result() -> dict:
    layers = [
        {
            "layer": layer,
            "sent": "context" if layer in SELECTED else "sink",
            "selected": layer in SELECTED,
            "forced": layer == 0,
            "calibration_attention": 0.1 * layer,
            "calibration_attention_norm": layer / (NUM_LAYERS - 1),
            "query_attention": 0.05 * layer,
            "query_attention_norm": layer / (NUM_LAYERS - 1),
            "prior": 1.0 - abs(layer - 2.5) / 2.5,
            "score": 0.5,
        }
        for layer in range(NUM_LAYERS)
    ]
    return HandoffResult(
        handoff="kvcomm",
        pair="hand",
        answer="4471",
        timings={"sharer_prefill": 0.05, "transfer": 0.001, "receiver_prefill": 0.1, "receiver_decode": 0.2, "total": 0.351},
        bytes_communicated=258048,
        communication="kv",
        tokens={"context": 13, "generated": 2},
        layers=layers,
        details={
            "selected_layers": sorted(SELECTED), "alpha": 0.8, "strategy": "kvcomm", "forced_layers": [0],
            "calibration": {"source": "sample", "context": "Peggy is at the Gevangenpoort.",
                            "query": "Which country is Peggy located in?"},
            "importance_spearman": 0.6,
        },
    ).to_dict()


def c2c_result(num_layers: int = 4, heads: int = 3) -> dict:
    layers = [
        {
            "layer": layer,
            "sharer_layer": layer + 2,
            "gate_k_logit": 1.0 if layer % 2 == 0 else -1.0,
            "gate_v_logit": 0.5 if layer < 2 else -0.5,
            "gate_k": 0.73 if layer % 2 == 0 else 0.27,
            "gate_v": 0.62 if layer < 2 else 0.38,
            "gate_k_open": layer % 2 == 0,
            "gate_v_open": layer < 2,
            "head_weights_k": [0.1 * (h + 1) for h in range(heads)],
            "head_weights_v": [0.9 - 0.1 * h for h in range(heads)],
        }
        for layer in range(num_layers)
    ]
    return HandoffResult(
        handoff="c2c",
        pair="hand",
        answer="100",
        timings={"sharer_prefill": 0.04, "transfer": 0.09, "receiver_prefill": 0.1, "receiver_decode": 0.1, "total": 0.33},
        bytes_communicated=100000,
        communication="kv",
        tokens={"fused": 12, "generated": 3},
        layers=layers,
        details={"fusion_seconds": 0.09, "parameters": 123456, "control": False},
    ).to_dict()


def simple(handoff: str, total: float, sent: int = 0, communication: str = "none", **extra) -> dict:
    timings = {stage: 0.0 for stage in STAGES}
    timings.update(receiver_prefill=total / 2, receiver_decode=total / 2, total=total)
    return HandoffResult(handoff=handoff, pair="hand", answer="x", timings=timings, bytes_communicated=sent,
                         communication=communication, **extra).to_dict()


def all_results() -> list[dict]:
    text = simple("text", 1.5, 36, "text", tokens={"message": 9, "generated": 3})
    text["timings"].update(sharer_prefill=0.3, sharer_decode=0.6)
    return [
        simple("receiver", 0.4),
        text,
        c2c_result(),
        kvcomm_result(),
        simple("skyline", 0.36),
    ]


def bar_traces(figure) -> list[dict]:
    """The bars drawn (not the legend's swatches)."""
    return [t for t in figure.to_dict()["data"] if t["type"] == "bar" and not (t.get("meta") or {}).get("legend_only")]


def test_latency_stacks_every_stage_with_the_handoff_colours():
    results = all_results()
    figure = plots.latency_figure(results)
    bars = bar_traces(figure)
    assert [t["meta"]["series"] for t in bars] == list(STAGES)
    assert figure.layout.barmode == "stack"
    # the legend shows each stage's pattern on a neutral swatch, not on one handoff's colour
    swatches = [t for t in figure.to_dict()["data"] if (t.get("meta") or {}).get("legend_only")]
    assert [t["marker"]["pattern"]["shape"] for t in swatches] == [plots.STAGE_PATTERNS[s] for s in STAGES]
    assert not any(t.get("showlegend", True) for t in bars)
    expected_colors = [plots.color_of(r["handoff"]) for r in results]
    for trace in bars:
        assert len(trace["y"]) == len(results)
        assert list(trace["marker"]["color"]) == expected_colors
    # the stages add up to the measured total
    for index, result in enumerate(results):
        stacked = sum(trace["y"][index] for trace in bars)
        assert stacked == pytest.approx(sum(result["timings"].get(s, 0.0) for s in STAGES))
    assert figure.layout.yaxis.title.text == "seconds"


def test_latency_skips_not_applicable_results():
    results = all_results() + [HandoffResult.not_applicable("c2c_control", "hand", "no").to_dict()]
    assert len(bar_traces(plots.latency_figure(results))[0]["y"]) == 5


def test_bytes_figure_log_scale_and_text_tokens():
    results = all_results()
    figure = plots.bytes_figure(results)
    bars = {t["meta"]["series"]: t for t in bar_traces(figure)}
    sent = [r for r in results if r["bytes_communicated"] > 0]
    assert list(bars["bytes"]["y"]) == [r["bytes_communicated"] for r in sent]
    assert list(bars["bytes"]["marker"]["color"]) == [plots.color_of(r["handoff"]) for r in sent]
    assert figure.layout.yaxis.type == "log"
    assert dict(zip(bars["tokens"]["x"], bars["tokens"]["y"])) == {"Text": 9, "C2C": 12, "KVComm": 13}
    assert "Receiver" in figure.layout.annotations[-1].text and "Skyline" in figure.layout.annotations[-1].text


def test_sweep_figure_one_line_per_strategy_and_baselines():
    points = [
        {"strategy": s, "ratio": r, "accuracy": r, "correct": int(6 * r), "n": 6, "layers": int(18 * r)}
        for s in ("kvcomm", "random")
        for r in (0.0, 0.5, 1.0)
    ]
    figure = plots.sweep_figure({"points": points, "baselines": {"receiver": 0.0, "skyline": 1.0}, "n": 6})
    data = figure.to_dict()["data"]
    series = [t["meta"]["series"] for t in data]
    assert series == ["kvcomm", "random", "receiver", "skyline"]
    assert all(t["line"]["color"] == plots.color_of(t["meta"]["series"]) for t in data[2:])
    assert all(t["line"]["color"] == plots.color_of("kvcomm") for t in data[:2])
    assert list(data[0]["x"]) == [0.0, 0.5, 1.0]
    assert "Run sweep" in plots.sweep_figure(None).layout.annotations[0].text


def test_one_colour_per_handoff_everywhere():
    results = all_results()
    figures = plots.all_figures(results)
    latency = bar_traces(figures["latency"])[0]
    by_label = dict(zip(latency["x"], latency["marker"]["color"]))
    bytes_bar = {t["meta"]["series"]: t for t in bar_traces(figures["bytes"])}["bytes"]
    for label, color in zip(bytes_bar["x"], bytes_bar["marker"]["color"]):
        assert by_label[label] == color
    colors = [handoff.color for handoff in registry.all_handoffs()]
    assert len(set(colors)) == len(colors)


def test_figures_are_plain_json_lists_not_base64():
    for figure in plots.all_figures(all_results()).values():
        text = figure.to_json()
        assert '"bdata"' not in text
        json.loads(text)


def test_each_figure_keeps_its_height_when_empty():
    """A figure that changes height while the page streams shifts its neighbours, and plotly.js
    then fails with "Something went wrong with axis scaling" (seen in Chromium)."""
    results = all_results()
    off = HandoffResult.not_applicable("c2c", "hand", "off").to_dict()
    pairs = {
        "latency": (plots.latency_figure([]), plots.latency_figure(results)),
        "bytes": (plots.bytes_figure([]), plots.bytes_figure(results)),
        "sweep": (plots.sweep_figure(None), plots.sweep_figure({"points": [{"strategy": "kvcomm", "ratio": 0.5, "accuracy": 1.0}]})),
    }
    for name, (empty, full) in pairs.items():
        assert empty.layout.height == full.layout.height == plots.HEIGHTS[name], name
    handoff_figures = {
        kvcomm_page.FIGURE_HEIGHT: (kvcomm_page.layers_figure(None), kvcomm_page.layers_figure(kvcomm_result())),
        c2c_page.FIGURE_HEIGHT: (c2c_page.gates_figure(off), c2c_page.gates_figure(c2c_result())),
    }
    for height, (empty, full) in handoff_figures.items():
        assert empty.layout.height == full.layout.height == height


def test_all_figures_has_each_handoffs_own_figure_and_the_shared_ones():
    figures = plots.all_figures(all_results())
    assert set(figures) == set(plots.layer_figure_handoffs()) | {"latency", "bytes"}
    assert {"kvcomm", "c2c"} <= set(figures)
    only = plots.all_figures(all_results(), ["receiver", "kvcomm"])
    assert set(only) == {"kvcomm", "latency", "bytes"}


def test_a_handoff_without_a_result_gets_the_same_not_run_figure_every_time():
    """Built once per process (the ``/run`` endpoint sends every column's figure at the end of
    each run): the figure equals a fresh one and is the same object on the next call."""
    without_kvcomm = [r for r in all_results() if r["handoff"] != "kvcomm"]
    first, again = plots.all_figures(without_kvcomm), plots.all_figures([])
    assert first["kvcomm"] is again["kvcomm"] is plots.figure_without_result("kvcomm")
    assert first["kvcomm"].to_dict() == methods.page_of("kvcomm").figure(None).to_dict()
    assert plots.all_figures(all_results())["kvcomm"] is not first["kvcomm"]  # with a result: its own figure


def test_figures_built_in_many_threads_at_once_all_get_the_house_template():
    """Two runs finishing at once draw their figures in two threads; plotly's objects raised
    "Invalid value" when the shared template was built or copied in both (seen on the page)."""
    import threading

    import plotly.graph_objects as go

    from kvviz.core import plotkit

    plotkit._house_template.cache_clear()
    start, errors, figures = threading.Barrier(8), [], []

    def draw():
        start.wait()
        try:
            for _ in range(20):
                figures.append(plotkit.layout(go.Figure(go.Bar(x=[1], y=[2])), "t"))
        except Exception as error:  # noqa: BLE001 - the test collects what any thread raised
            errors.append(error)

    threads = [threading.Thread(target=draw) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(figures) == 160
    assert all(f.layout.template.layout.plot_bgcolor == "white" for f in figures)
    assert plotkit.house_template() == plotkit.house_template()  # nothing drawn changed the shared template
