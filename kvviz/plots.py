"""Plotly figures from handoff results: pure functions, data in, figure out.

Every function takes result dicts (``HandoffResult.to_dict()``, or the result objects themselves)
and returns a ``plotly.graph_objects.Figure``. Nothing here runs a model or touches the UI, so the
same figures serve the app, the benchmark and the tests. Figures are built from Python lists, not
numpy arrays (plotly would base64-encode arrays in its JSON, which scripts and tests then cannot
read).

One colour per handoff, the same in every figure: ``HANDOFF_COLORS``.
"""

from __future__ import annotations

import math
from typing import Iterable

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvviz.results import STAGES

# One colour per handoff, used by every figure and by the columns in the app (Okabe-Ito palette:
# distinguishable for the common forms of colour blindness).
HANDOFF_COLORS = {
    "receiver": "#7f7f7f",  # grey: nothing shared
    "text": "#E69F00",  # orange
    "c2c": "#0072B2",  # blue
    "c2c_control": "#56B4E9",  # light blue
    "kvcomm": "#009E73",  # green
    "skyline": "#CC79A7",  # purple
    "sharer": "#D55E00",  # vermillion
}
HANDOFF_LABELS = {
    "receiver": "Receiver alone",
    "text": "Text message",
    "c2c": "C2C (cache fusion)",
    "c2c_control": "C2C control",
    "kvcomm": "KVComm (selected layers)",
    "skyline": "Skyline (receiver sees context)",
    "sharer": "Sharer alone",
}
SHORT_LABELS = {
    "receiver": "Receiver",
    "text": "Text",
    "c2c": "C2C",
    "c2c_control": "C2C control",
    "kvcomm": "KVComm",
    "skyline": "Skyline",
    "sharer": "Sharer",
}
STAGE_LABELS = {
    "sharer_prefill": "sharer reads (prefill)",
    "sharer_decode": "sharer writes (decode)",
    "transfer": "transfer / fusion",
    "receiver_prefill": "receiver reads (prefill)",
    "receiver_decode": "receiver answers (decode)",
}
# Stages are told apart by a fill pattern so that the bar colour can stay the handoff's colour.
STAGE_PATTERNS = {
    "sharer_prefill": "/",
    "sharer_decode": "x",
    "transfer": ".",
    "receiver_prefill": "",
    "receiver_decode": "+",
}
STAGE_OPACITY = {
    "sharer_prefill": 0.45,
    "sharer_decode": 0.6,
    "transfer": 0.75,
    "receiver_prefill": 0.9,
    "receiver_decode": 1.0,
}
# KVComm layer figure: the three series per layer.
KVCOMM_SERIES_COLORS = {"attention_norm": "#009E73", "prior": "#bdbdbd", "score": "#004D38"}
SELECTED_OUTLINE = "#111111"
GATE_OPEN_COLOR = "#0072B2"
GATE_CLOSED_COLOR = "#d9d9d9"
STRATEGY_SYMBOL = {"kvcomm": "circle", "attention": "circle-open", "prior": "square", "contiguous": "diamond", "random": "x"}
STRATEGY_DASH = {"kvcomm": "solid", "attention": "dot", "prior": "dash", "contiguous": "dashdot", "random": "longdash"}

# Each figure keeps one height whether it is empty or full: a plot that changes height while the
# page streams updates shifts the layout under its neighbours, and plotly.js then throws
# "Something went wrong with axis scaling" and the page stops updating (seen in Chromium).
HEIGHTS = {"kvcomm": 400, "c2c": 500, "latency": 400, "bytes": 400, "sweep": 420}

FONT = dict(family="Inter, system-ui, sans-serif", size=12)


def color_of(handoff: str) -> str:
    return HANDOFF_COLORS.get(handoff, "#444444")


def label_of(handoff: str) -> str:
    return SHORT_LABELS.get(handoff, handoff)


def as_dict(result) -> dict:
    """Accept a HandoffResult or its dict."""
    return result if isinstance(result, dict) else result.to_dict()


def _results(results: Iterable) -> list[dict]:
    return [as_dict(r) for r in results or []]


def _applicable(results: Iterable) -> list[dict]:
    return [r for r in _results(results) if r.get("applicable", True)]


def _layout(fig: go.Figure, title: str, height: int = 340, **extra) -> go.Figure:
    settings = dict(
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=14)),
        height=height,
        margin=dict(l=60, r=20, t=64, b=90),
        font=FONT,
        template="plotly_white",
        legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0.0),
        hoverlabel=dict(namelength=-1),
    )
    settings.update(extra)
    fig.update_layout(**settings)
    return fig


def wrap(text: str, width: int = 70) -> str:
    """Break a long message into lines (plotly annotations do not wrap by themselves)."""
    lines, line = [], ""
    for word in str(text).split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    if line:
        lines.append(line)
    return "<br>".join(lines)


def empty_figure(title: str, message: str, height: int = 300) -> go.Figure:
    """A figure that says, in words, why there is nothing to plot."""
    message = wrap(message)
    fig = go.Figure()
    fig.add_annotation(
        text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=13, color="#555")
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, title, height=height)


def find(results: Iterable, handoff: str) -> dict | None:
    for result in _results(results):
        if result.get("handoff") == handoff:
            return result
    return None


# --- 1. KVComm: per-layer importance, prior, combined score, selection --------------------------


def kvcomm_layers_figure(result) -> go.Figure:
    """Grouped bars per receiver layer: attention importance, Gaussian prior, combined score.

    Selected layers (the ones whose context KV is sent) get a dark outline, full opacity and a
    marker above the group; the others are faded.
    """
    title = "KVComm: which layers get the context (per receiver layer)"
    if result is None:
        return empty_figure(title, "Run a preset with a private context to see KVComm's layer choice.", HEIGHTS["kvcomm"])
    result = as_dict(result)
    if not result.get("applicable", True) or not result.get("layers"):
        return empty_figure(title, "KVComm did not run: " + (result.get("reason") or "no per-layer data."), HEIGHTS["kvcomm"])
    records = sorted(result["layers"], key=lambda r: r["layer"])
    layers = [int(r["layer"]) for r in records]
    selected = [bool(r.get("selected")) for r in records]
    details = result.get("details", {})
    alpha = details.get("alpha")
    series = [
        ("attention_norm", "attention importance (normalised)", "share of attention on the context, min-max over layers"),
        ("prior", "Gaussian prior (normalised)", "favours middle layers"),
        ("score", "combined score", "alpha x importance + (1 - alpha) x prior"),
    ]
    fig = go.Figure()
    for key, name, explain in series:
        values = [float(r.get(key, 0.0)) for r in records]
        hover = [
            f"layer {layer}<br>{name}: {value:.3f}<br>{explain}<br>"
            + ("<b>selected: context KV sent</b>" if sel else "not selected: only the sink token")
            for layer, value, sel in zip(layers, values, selected)
        ]
        fig.add_trace(
            go.Bar(
                x=layers,
                y=values,
                name=name,
                marker=dict(
                    color=KVCOMM_SERIES_COLORS[key],
                    opacity=[1.0 if sel else 0.35 for sel in selected],
                    line=dict(color=[SELECTED_OUTLINE if sel else "rgba(0,0,0,0)" for sel in selected], width=1.5),
                ),
                hovertext=hover,
                hoverinfo="text",
                meta={"series": key},
            )
        )
    chosen = [layer for layer, sel in zip(layers, selected) if sel]
    fig.add_trace(
        go.Scatter(
            x=chosen,
            y=[1.08] * len(chosen),
            mode="markers",
            name="selected layer (context KV sent)",
            marker=dict(symbol="triangle-down", size=11, color=color_of("kvcomm"), line=dict(color=SELECTED_OUTLINE, width=1)),
            hovertext=[f"layer {layer}: selected" for layer in chosen],
            hoverinfo="text",
            meta={"series": "selected"},
        )
    )
    subtitle = f"{len(chosen)} of {len(layers)} layers sent"
    if alpha is not None:
        subtitle += f", alpha = {float(alpha):.2f}"
    if details.get("strategy"):
        subtitle += f", strategy {details['strategy']}"
    fig.update_xaxes(
        title_text="receiver layer", dtick=1 if len(layers) <= 40 else None, range=[min(layers) - 0.6, max(layers) + 0.6]
    )
    fig.update_yaxes(title_text="normalised value (0 to 1)", range=[0, 1.15])
    return _layout(fig, f"{title}<br><sup>{subtitle}</sup>", height=HEIGHTS["kvcomm"], barmode="group", bargap=0.2)


# --- 2. C2C: gates per layer and head weights ---------------------------------------------------


def c2c_figure(result) -> go.Figure:
    """Top: soft gate value per receiver layer for K and V (coloured = open at inference, pale =
    closed). Below, on the same layer axis: head weights as KV head x layer heatmaps for K and V."""
    title = "C2C: gates and head weights per receiver layer"
    if result is None:
        return empty_figure(title, "C2C did not run.", HEIGHTS["c2c"])
    result = as_dict(result)
    if not result.get("applicable", True) or not result.get("layers"):
        return empty_figure(title, "C2C did not run: " + (result.get("reason") or "no per-layer data."), HEIGHTS["c2c"])
    records = sorted(result["layers"], key=lambda r: r["layer"])
    layers = [int(r["layer"]) for r in records]
    heads = max((len(r.get("head_weights_k") or []) for r in records), default=0)
    heat_share = min(0.25, 0.13 + 0.015 * heads)
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07,
        row_heights=[1 - 2 * heat_share, heat_share, heat_share],
        subplot_titles=(
            "gate per layer, sigmoid(logit): K solid, V hatched; coloured = open (sharer KV added), pale = closed",
            "head weights for K (mean over tokens)",
            "head weights for V",
        ),
    )
    for kind, label in (("k", "K"), ("v", "V")):
        soft = [float(r.get(f"gate_{kind}", 0.0)) for r in records]
        logits = [float(r.get(f"gate_{kind}_logit", 0.0)) for r in records]
        opened = [bool(r.get(f"gate_{kind}_open", False)) for r in records]
        sharer = [r.get("sharer_layer") for r in records]
        base = GATE_OPEN_COLOR if kind == "k" else "#56B4E9"
        hover = [
            f"receiver layer {layer} (reads sharer layer {s})<br>{label} gate: sigmoid(logit) = {g:.3f}, "
            f"logit {lg:+.2f}<br>" + ("<b>open</b>: the projected sharer KV is added" if o else "closed: the receiver keeps its own KV")
            for layer, s, g, lg, o in zip(layers, sharer, soft, logits, opened)
        ]
        fig.add_trace(
            go.Bar(
                x=layers,
                y=soft,
                name=f"{label} gate",
                marker=dict(
                    color=[base if o else GATE_CLOSED_COLOR for o in opened],
                    line=dict(color=[SELECTED_OUTLINE if o else "#999999" for o in opened], width=1),
                    pattern=dict(shape="" if kind == "k" else "/"),
                ),
                hovertext=hover,
                hoverinfo="text",
                showlegend=False,
                meta={"series": f"gate_{kind}"},
            ),
            row=1,
            col=1,
        )
    for row, kind in ((2, "k"), (3, "v")):
        weights = [list(map(float, r.get(f"head_weights_{kind}") or [])) for r in records]
        # z[head][layer]: one strip per KV head, sharing the gates' layer axis
        z = [[w[head] if head < len(w) else None for w in weights] for head in range(heads)]
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=layers,
                y=list(range(heads)),
                zmin=0,
                zmax=1,
                colorscale="Blues",
                showscale=row == 2,
                colorbar=dict(title=dict(text="head<br>weight"), len=0.35, y=0.2, thickness=12),
                hovertemplate="layer %{x}, KV head %{y}<br>" + kind.upper() + " weight %{z:.3f} (mean over tokens)<extra></extra>",
                name=f"head weights {kind.upper()}",
                meta={"series": f"head_weights_{kind}"},
            ),
            row=row,
            col=1,
        )
        fig.update_yaxes(title_text=f"{kind.upper()} head", dtick=1 if heads <= 8 else None, title_standoff=4, row=row, col=1)
    fig.update_xaxes(dtick=1 if len(layers) <= 40 else None)
    fig.update_xaxes(title_text="receiver layer", row=3, col=1)
    fig.update_yaxes(title_text="gate (0 to 1)", range=[0, 1.05], row=1, col=1)
    fig.update_annotations(font_size=11)
    details = result.get("details", {})
    open_k = sum(bool(r.get("gate_k_open")) for r in records)
    open_v = sum(bool(r.get("gate_v_open")) for r in records)
    subtitle = f"{open_k} K gates and {open_v} V gates open of {len(layers)} layers"
    if details.get("fusion_seconds") is not None:
        subtitle += f"; fusion {1000 * float(details['fusion_seconds']):.0f} ms"
    if details.get("control"):
        subtitle += "; control fuser (no sharer information)"
    return _layout(fig, f"{title}<br><sup>{subtitle}</sup>", height=HEIGHTS["c2c"], barmode="group", margin=dict(l=60, r=20, t=70, b=50))


# --- 3. latency by stage ------------------------------------------------------------------------


def latency_figure(results) -> go.Figure:
    """Stacked bars per handoff, one segment per stage (seconds). The bar colour is the handoff's
    colour; stages are told apart by their fill pattern."""
    title = "Latency by stage (seconds, wall clock)"
    rows = _applicable(results)
    if not rows:
        return empty_figure(title, "No results yet: pick a preset or press Run.", HEIGHTS["latency"])
    names = [r["handoff"] for r in rows]
    x = [label_of(name) for name in names]
    fig = go.Figure()
    for stage in STAGES:
        values = [float(r.get("timings", {}).get(stage, 0.0)) for r in rows]
        hover = [
            f"{label_of(n)}<br>{STAGE_LABELS[stage]}: {v * 1000:.0f} ms"
            f"<br>total {float(r.get('timings', {}).get('total', 0.0)):.2f} s"
            for n, v, r in zip(names, values, rows)
        ]
        fig.add_trace(
            go.Bar(
                x=x,
                y=values,
                name=STAGE_LABELS[stage],
                marker=dict(
                    color=[color_of(n) for n in names],
                    opacity=STAGE_OPACITY[stage],
                    line=dict(color="white", width=1),
                    pattern=dict(shape=STAGE_PATTERNS[stage], fgcolor="rgba(0,0,0,0.45)", size=6),
                ),
                hovertext=hover,
                hoverinfo="text",
                meta={"series": stage},
            )
        )
    totals = [float(r.get("timings", {}).get("total", 0.0)) for r in rows]
    fig.add_trace(
        go.Scatter(
            x=x,
            y=totals,
            mode="text",
            text=[f"{t:.2f} s" for t in totals],
            textposition="top center",
            showlegend=False,
            hoverinfo="skip",
            meta={"series": "total"},
        )
    )
    top = max(totals + [0.01])
    fig.update_yaxes(title_text="seconds", range=[0, top * 1.2])
    fig.update_xaxes(title_text="handoff")
    return _layout(fig, title, height=HEIGHTS["latency"], barmode="stack")


# --- 4. bytes communicated and text message length ---------------------------------------------


def tokens_handed_over(result: dict) -> int:
    """How many tokens' worth of information crossed from sharer to receiver."""
    tokens = result.get("tokens", {})
    if result.get("handoff") == "text":
        return int(tokens.get("message", 0))
    if result.get("communication") == "kv":
        return int(tokens.get("context", tokens.get("fused", tokens.get("sharer_prompt", 0))))
    return 0


def human_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} GB"


def bytes_figure(results) -> go.Figure:
    """Left: bytes sent from sharer to receiver per handoff (log scale; handoffs that send nothing
    are listed under the axis). Right: the text message's length in tokens next to the number of
    context tokens whose KV is sent."""
    title = "What crosses between the models"
    rows = _applicable(results)
    if not rows:
        return empty_figure(title, "No results yet: pick a preset or press Run.", HEIGHTS["bytes"])
    sending = [r for r in rows if int(r.get("bytes_communicated", 0)) > 0]
    silent = [label_of(r["handoff"]) for r in rows if int(r.get("bytes_communicated", 0)) <= 0]
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.6, 0.4],
        horizontal_spacing=0.14,
        subplot_titles=("bytes communicated (log scale)", "tokens handed over"),
    )
    names = [r["handoff"] for r in sending]
    values = [int(r["bytes_communicated"]) for r in sending]
    hover = []
    for r in sending:
        kind = r.get("communication", "")
        what = "UTF-8 bytes of the text message" if kind == "text" else "bytes of KV tensors sent (keys + values)"
        hover.append(f"{label_of(r['handoff'])}: {human_bytes(r['bytes_communicated'])}<br>{what}")
    fig.add_trace(
        go.Bar(
            x=[label_of(n) for n in names],
            y=values,
            marker=dict(color=[color_of(n) for n in names]),
            text=[human_bytes(v) for v in values],
            textposition="outside",
            hovertext=hover,
            hoverinfo="text",
            showlegend=False,
            meta={"series": "bytes"},
        ),
        row=1,
        col=1,
    )
    token_rows = [r for r in rows if tokens_handed_over(r) > 0]
    token_values = [tokens_handed_over(r) for r in token_rows]
    token_hover = [
        f"{label_of(r['handoff'])}: {v} tokens<br>"
        + ("tokens the sharer wrote in its message" if r["handoff"] == "text" else "tokens whose KV is handed over")
        for r, v in zip(token_rows, token_values)
    ]
    fig.add_trace(
        go.Bar(
            x=[label_of(r["handoff"]) for r in token_rows],
            y=token_values,
            marker=dict(color=[color_of(r["handoff"]) for r in token_rows]),
            text=[str(v) for v in token_values],
            textposition="outside",
            hovertext=token_hover,
            hoverinfo="text",
            showlegend=False,
            meta={"series": "tokens"},
        ),
        row=1,
        col=2,
    )
    if values:
        low, high = min(values), max(values)
        fig.update_yaxes(type="log", range=[math.log10(max(1, low)) - 0.5, math.log10(high) + 0.8], row=1, col=1)
    fig.update_yaxes(title_text="bytes (log scale)", row=1, col=1)
    fig.update_yaxes(title_text="tokens", range=[0, max(token_values + [1]) * 1.25], row=1, col=2)
    if silent:
        fig.add_annotation(
            text="send nothing: " + ", ".join(silent),
            xref="paper",
            yref="paper",
            x=0.0,
            y=-0.16,
            showarrow=False,
            font=dict(size=11, color="#666"),
            xanchor="left",
        )
    return _layout(fig, title, height=HEIGHTS["bytes"], margin=dict(l=60, r=20, t=64, b=70))


# --- 5. sweep: KVComm quality against ratio and strategy ---------------------------------------


def sweep_figure(sweep: dict | None) -> go.Figure:
    """Accuracy (share of the built-in questions answered right) against the share of layers sent,
    one line per selection strategy, with the receiver alone and Skyline as reference lines.

    ``sweep`` is ``{"points": [{"strategy", "ratio", "accuracy", "correct", "n"}], "baselines":
    {"receiver": accuracy, "skyline": accuracy}, "n": items, "metric": str}``.
    """
    title = "KVComm sweep: answer quality against the share of layers sent"
    if not sweep or not sweep.get("points"):
        return empty_figure(title, "Press 'Run sweep' to measure KVComm on the built-in questions.", HEIGHTS["sweep"])
    fig = go.Figure()
    strategies = list(dict.fromkeys(p["strategy"] for p in sweep["points"]))
    for strategy in strategies:
        points = sorted((p for p in sweep["points"] if p["strategy"] == strategy), key=lambda p: p["ratio"])
        fig.add_trace(
            go.Scatter(
                x=[float(p["ratio"]) for p in points],
                y=[float(p["accuracy"]) for p in points],
                mode="lines+markers",
                name=f"KVComm, {strategy} layers",
                line=dict(color=color_of("kvcomm"), dash=STRATEGY_DASH.get(strategy, "solid"), width=2.5),
                marker=dict(size=8, symbol=STRATEGY_SYMBOL.get(strategy, "circle")),
                hovertext=[
                    f"{strategy}, ratio {p['ratio']:.2f} ({p.get('layers', '?')} layers)<br>"
                    f"{p.get('correct', '?')} of {p.get('n', '?')} right ({100 * p['accuracy']:.0f}%)"
                    for p in points
                ],
                hoverinfo="text",
                meta={"series": strategy},
            )
        )
    for name, value in (sweep.get("baselines") or {}).items():
        fig.add_trace(
            go.Scatter(
                x=[0.0, 1.0],
                y=[float(value), float(value)],
                mode="lines",
                name=f"{label_of(name)} ({100 * float(value):.0f}%)",
                line=dict(color=color_of(name), dash="dot", width=2),
                hovertext=[f"{label_of(name)}: {100 * float(value):.0f}% right"] * 2,
                hoverinfo="text",
                meta={"series": name},
            )
        )
    fig.update_xaxes(title_text="share of receiver layers that get the context (ratio r)", range=[-0.03, 1.03])
    fig.update_yaxes(title_text="answers right (share)", range=[-0.05, 1.08], tickformat=".0%")
    subtitle = f"{sweep.get('n', '?')} built-in questions, metric: {sweep.get('metric', 'answer contains the gold answer')}"
    return _layout(fig, f"{title}<br><sup>{subtitle}</sup>", height=HEIGHTS["sweep"])


# --- everything at once -------------------------------------------------------------------------


def all_figures(results) -> dict[str, go.Figure]:
    """The four per-run figures, keyed by name (the sweep has its own data)."""
    results = _results(results)
    return {
        "kvcomm": kvcomm_layers_figure(find(results, "kvcomm")),
        "c2c": c2c_figure(find(results, "c2c")),
        "latency": latency_figure(results),
        "bytes": bytes_figure(results),
    }


def bar_counts(figure: go.Figure | dict) -> dict[str, int]:
    """Number of bars per bar trace, keyed by the trace's series name (for tests and scripts)."""
    data = figure["data"] if isinstance(figure, dict) else figure.to_dict()["data"]
    counts = {}
    for trace in data:
        if trace.get("type") == "bar":
            key = (trace.get("meta") or {}).get("series") or trace.get("name")
            counts[key] = len(trace.get("y") or [])
    return counts
