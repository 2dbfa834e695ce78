"""The figures of kvviz.plots on hand-made results (no models): bars per layer, highlighting of
selected layers and open gates, one colour per handoff everywhere, lists not base64 arrays."""

from __future__ import annotations

import json

import pytest

from kvviz import plots
from kvviz.results import STAGES, HandoffResult

NUM_LAYERS = 6
SELECTED = {0, 2, 3}


def kvcomm_result() -> dict:
    layers = [
        {
            "layer": layer,
            "attention_raw": 0.1 * layer,
            "attention_norm": layer / (NUM_LAYERS - 1),
            "prior": 1.0 - abs(layer - 2.5) / 2.5,
            "score": 0.5,
            "selected": layer in SELECTED,
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
        details={"selected_layers": sorted(SELECTED), "alpha": 0.8, "strategy": "kvcomm"},
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
    return [t for t in figure.to_dict()["data"] if t["type"] == "bar"]


def test_kvcomm_figure_has_one_bar_per_layer_per_series_and_highlights_selected():
    figure = plots.kvcomm_layers_figure(kvcomm_result())
    bars = bar_traces(figure)
    assert [t["meta"]["series"] for t in bars] == ["attention_norm", "prior", "score"]
    for trace in bars:
        assert list(trace["x"]) == list(range(NUM_LAYERS))
        assert len(trace["y"]) == NUM_LAYERS
        outlined = {layer for layer, color in zip(trace["x"], trace["marker"]["line"]["color"]) if color == plots.SELECTED_OUTLINE}
        assert outlined == SELECTED
        opaque = {layer for layer, opacity in zip(trace["x"], trace["marker"]["opacity"]) if opacity == 1.0}
        assert opaque == SELECTED
    markers = [t for t in figure.to_dict()["data"] if t["meta"]["series"] == "selected"][0]
    assert sorted(markers["x"]) == sorted(SELECTED)
    assert markers["marker"]["color"] == plots.color_of("kvcomm")
    assert plots.bar_counts(figure) == {"attention_norm": NUM_LAYERS, "prior": NUM_LAYERS, "score": NUM_LAYERS}
    assert "3 of 6 layers sent" in figure.layout.title.text


def test_kvcomm_figure_for_not_applicable_result_says_why():
    result = HandoffResult.not_applicable("kvcomm", "hand", "KVComm needs a private context.").to_dict()
    figure = plots.kvcomm_layers_figure(result)
    assert not bar_traces(figure)
    assert "needs a private context" in figure.layout.annotations[0].text
    assert "Run a preset" in plots.kvcomm_layers_figure(None).layout.annotations[0].text


def test_c2c_figure_gates_and_head_heatmaps():
    result = c2c_result(num_layers=4, heads=3)
    figure = plots.c2c_figure(result)
    data = figure.to_dict()["data"]
    gates = {t["meta"]["series"]: t for t in data if t["type"] == "bar"}
    assert set(gates) == {"gate_k", "gate_v"}
    for kind in ("k", "v"):
        trace = gates[f"gate_{kind}"]
        assert list(trace["x"]) == [0, 1, 2, 3]
        assert list(trace["y"]) == [r[f"gate_{kind}"] for r in result["layers"]]
        opened = [r[f"gate_{kind}_open"] for r in result["layers"]]
        # open gates in colour, closed ones pale grey
        assert [c != plots.GATE_CLOSED_COLOR for c in trace["marker"]["color"]] == opened
    heatmaps = {t["meta"]["series"]: t for t in data if t["type"] == "heatmap"}
    assert set(heatmaps) == {"head_weights_k", "head_weights_v"}
    for kind in ("k", "v"):
        z = heatmaps[f"head_weights_{kind}"]["z"]
        assert len(z) == 3 and all(len(row) == 4 for row in z)  # KV heads x layers
        assert list(heatmaps[f"head_weights_{kind}"]["x"]) == [0, 1, 2, 3]
        per_layer = [list(column) for column in zip(*z)]
        assert per_layer == [r[f"head_weights_{kind}"] for r in result["layers"]]
    assert "2 K gates and 2 V gates open of 4 layers" in figure.layout.title.text


def test_c2c_figure_off_says_why():
    off = HandoffResult.not_applicable("c2c", "hand", "C2C is off in this build: not registered.").to_dict()
    figure = plots.c2c_figure(off)
    assert not figure.to_dict()["data"]
    assert "C2C is off" in figure.layout.annotations[0].text.replace("<br>", " ")


def test_latency_stacks_every_stage_with_the_handoff_colours():
    results = all_results()
    figure = plots.latency_figure(results)
    bars = bar_traces(figure)
    assert [t["meta"]["series"] for t in bars] == list(STAGES)
    assert figure.layout.barmode == "stack"
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
    assert len(set(plots.HANDOFF_COLORS.values())) == len(plots.HANDOFF_COLORS)


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
        "kvcomm": (plots.kvcomm_layers_figure(None), plots.kvcomm_layers_figure(kvcomm_result())),
        "c2c": (plots.c2c_figure(off), plots.c2c_figure(c2c_result())),
        "latency": (plots.latency_figure([]), plots.latency_figure(results)),
        "bytes": (plots.bytes_figure([]), plots.bytes_figure(results)),
        "sweep": (plots.sweep_figure(None), plots.sweep_figure({"points": [{"strategy": "kvcomm", "ratio": 0.5, "accuracy": 1.0}]})),
    }
    for name, (empty, full) in pairs.items():
        assert empty.layout.height == full.layout.height == plots.HEIGHTS[name], name
