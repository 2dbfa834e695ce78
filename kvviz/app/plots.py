"""Figures across handoffs: pure functions, data in, figure out.

Every function takes results (``HandoffResult``, as the reading of a run holds them, or their dicts)
and returns a ``plotly.graph_objects.Figure``. Nothing here runs a model or touches the UI, so the
same figures serve the app, the benchmark and the tests. Each handoff's own per-layer figure lives
in its file (its descriptor's ``figure``); colours, labels and titles come from the registry, one
colour per handoff in every figure.
"""

from __future__ import annotations

import functools
import math
from typing import Iterable

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvviz.app.methods import registry as methods
from kvviz.app.reading.reading import typed
from kvviz.core.plotkit import bar_counts, empty_figure, human_bytes, layout
from kvviz.core.results import STAGES, HandoffResult
from kvviz.handoffs.registry import color_of, label_of

STAGE_LABELS = {
    "sharer_prefill": "sharer reads (prefill)",
    "sharer_decode": "sharer writes (decode)",
    "transfer": "transfer / fusion (in memory)",
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
# What crosses between the models, by a result's ``communication`` kind.
SENT_AS = {
    "text": "UTF-8 bytes of the text message",
    "kv": "bytes of KV tensors sent (keys + values)",
    "activation": "bytes of the hidden-state vector(s) sent",
    "embeddings": "bytes of the embedding vectors sent",
}
HANDED_OVER = {
    "text": "tokens the sharer wrote in its message",
    "kv": "tokens whose KV is handed over",
    "activation": "hidden-state vectors handed over",
    "embeddings": "embedding vectors the sharer wrote",
}
# Sweep lines: one marker and dash per series, in order.
SERIES_SYMBOLS = ("circle", "diamond", "square", "x", "circle-open", "triangle-up")
SERIES_DASHES = ("solid", "dashdot", "dash", "longdash", "dot", "longdashdot")

# Each figure keeps one height whether it is empty or full (see ``kvviz.core.plotkit.layout``).
HEIGHTS = {"latency": 400, "bytes": 400, "sweep": 420}

__all__ = [
    "all_figures", "bar_counts", "bytes_figure", "color_of", "find", "human_bytes", "label_of", "latency_figure",
    "layer_figure_handoffs", "sweep_figure", "tokens_handed_over",
]


def _typed(results: Iterable) -> list[HandoffResult]:
    return [typed(result) for result in results or []]


def _applicable(results: Iterable) -> list[HandoffResult]:
    return [result for result in _typed(results) if result.applicable]


def find(results: Iterable, handoff: str) -> HandoffResult | None:
    return next((result for result in _typed(results) if result.handoff == handoff), None)


# --- 3. latency by stage ------------------------------------------------------------------------


def stage_label(handoff: str, stage: str) -> str:
    """The stage in words for this handoff (its page entry's ``stage_labels``), else the shared name."""
    return methods.stage_labels(handoff).get(stage, STAGE_LABELS[stage])


def first_token_hover(result: HandoffResult) -> str:
    """First-token times as measured: from the question to the receiver's first token (everything
    on the way), and the receiver's side alone where the handoff has one."""
    text = ""
    if result.first_token_seconds is not None:
        text += f"<br>first token {float(result.first_token_seconds):.2f} s (question to first answer token)"
    if result.receiver_first_token_seconds is not None:
        text += f"<br>receiver side alone {float(result.receiver_first_token_seconds):.2f} s"
    return text


def latency_figure(results, alone: bool | None = None) -> go.Figure:
    """Stacked bars per handoff, one segment per stage (seconds). The bar colour is the handoff's
    colour; stages are told apart by their fill pattern. ``alone``: whether each handoff was timed
    alone (the reading's ``Timing.timed``; default: whether the results are precomputed)."""
    rows = _applicable(results)
    alone = all(r.precomputed for r in rows) if alone is None else alone
    title = ("Latency by stage (seconds)" if not rows else
             "Latency by stage (seconds, each handoff timed alone)" if alone
             else "Latency by stage (seconds of wall clock in one run:<br><sup>its columns shared the CPU, so compare "
                  "them within this run only)</sup>")
    if not rows:
        return empty_figure(title, "No results yet: pick a preset or press Run.", HEIGHTS["latency"])
    names = [r.handoff for r in rows]
    x = [label_of(name) for name in names]
    fig = go.Figure()
    for stage in STAGES:
        values = [float((r.timings or {}).get(stage, 0.0)) for r in rows]
        hover = [
            f"{label_of(n)}<br>{stage_label(n, stage)}: {v * 1000:.0f} ms"
            f"<br>total {float((r.timings or {}).get('total', 0.0)):.2f} s" + first_token_hover(r)
            for n, v, r in zip(names, values, rows)
        ]
        fig.add_trace(
            go.Bar(
                x=x,
                y=values,
                name=STAGE_LABELS[stage],
                legendgroup=stage,
                showlegend=False,  # the legend shows the stage's pattern on a neutral swatch (below)
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
    for stage in STAGES:  # one swatch per stage: its pattern on grey (a bar's own colour is its handoff's)
        fig.add_trace(go.Bar(  # a zero-height bar: plotly lists no trace without data in the legend
            x=x[:1], y=[0], name=STAGE_LABELS[stage], legendgroup=stage, hoverinfo="skip",
            marker=dict(color="#e5e7eb", line=dict(color="#4b5563", width=1),
                        pattern=dict(shape=STAGE_PATTERNS[stage], fgcolor="#1f2937", size=6)),
            meta={"series": f"legend:{stage}", "legend_only": True},
        ))
    totals = [float((r.timings or {}).get("total", 0.0)) for r in rows]
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
    return layout(fig, title, height=HEIGHTS["latency"], barmode="stack")


# --- 4. bytes communicated and message length -------------------------------------------------


def tokens_handed_over(result) -> int:
    """How many tokens' (or vectors') worth of information crossed from sharer to receiver: a
    written message's tokens, the tokens whose KV was sent, or the vectors sent."""
    result = typed(result)
    tokens, kind = result.tokens or {}, result.communication
    if kind in ("text", "embeddings"):
        return int(tokens.get("message", 0))
    if kind == "kv":
        return int(tokens.get("context", tokens.get("fused", tokens.get("sharer_prompt", 0))))
    if kind == "activation":
        return int(tokens.get("vectors", 0))
    return 0


def bytes_figure(results) -> go.Figure:
    """Left: bytes sent from sharer to receiver per handoff (log scale; handoffs that send nothing
    are listed under the axis). Right: the text message's length in tokens next to the number of
    context tokens whose KV is sent."""
    title = "What crosses between the models"
    rows = _applicable(results)
    if not rows:
        return empty_figure(title, "No results yet: pick a preset or press Run.", HEIGHTS["bytes"])
    sending = [r for r in rows if int(r.bytes_communicated or 0) > 0]
    silent = [label_of(r.handoff) for r in rows if int(r.bytes_communicated or 0) <= 0]
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.6, 0.4],
        horizontal_spacing=0.14,
        subplot_titles=("bytes communicated (log scale)", "tokens handed over"),
    )
    names = [r.handoff for r in sending]
    values = [int(r.bytes_communicated) for r in sending]
    hover = [f"{label_of(r.handoff)}: {human_bytes(r.bytes_communicated)}<br>{SENT_AS.get(r.communication, 'bytes sent')}"
             for r in sending]
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
    token_hover = [f"{label_of(r.handoff)}: {v}<br>{HANDED_OVER.get(r.communication, 'handed over')}"
                   for r, v in zip(token_rows, token_values)]
    fig.add_trace(
        go.Bar(
            x=[label_of(r.handoff) for r in token_rows],
            y=token_values,
            marker=dict(color=[color_of(r.handoff) for r in token_rows]),
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
    return layout(fig, title, height=HEIGHTS["bytes"], margin=dict(l=60, r=20, t=64, b=70))


# --- 5. sweep: one handoff's quality against one of its options --------------------------------


def sweep_figure(sweep: dict | None) -> go.Figure:
    """Accuracy (share of the built-in questions answered right) against the swept option, one line
    per value of the series option, with the floor and ceiling handoffs as reference lines.

    ``sweep`` is ``kvviz.app.sweep.run_sweep``'s data: ``{"handoff": name, "points": [{X, SERIES,
    "accuracy", "correct", "n", COUNT}], "baselines": {handoff: accuracy}, "n": items, "metric"}``,
    where X, SERIES and COUNT are the names the handoff's ``Sweep`` gives.
    """
    spec = sweep_spec(sweep)
    title = "Sweep: answer quality against a handoff's setting"
    if spec is None:
        return empty_figure(title, "No handoff declares a sweep.", HEIGHTS["sweep"])
    handoff, experiment = spec
    title = f"{handoff.label} sweep: answer quality against its {experiment.x_option}"
    if not sweep or not sweep.get("points"):
        return empty_figure(title, f"Press 'Run sweep' to measure {handoff.label} on the built-in questions.", HEIGHTS["sweep"])
    x_key, series_key, count_key = experiment.x_option, experiment.series_option, experiment.count_name
    fig = go.Figure()
    series = list(dict.fromkeys(p[series_key] for p in sweep["points"]))
    for index, value in enumerate(series):
        points = sorted((p for p in sweep["points"] if p[series_key] == value), key=lambda p: p[x_key])
        fig.add_trace(
            go.Scatter(
                x=[float(p[x_key]) for p in points],
                y=[float(p["accuracy"]) for p in points],
                mode="lines+markers",
                name=f"{handoff.label}, {series_key} {value}",
                line=dict(color=handoff.color, dash=SERIES_DASHES[index % len(SERIES_DASHES)], width=2.5),
                marker=dict(size=8, symbol=SERIES_SYMBOLS[index % len(SERIES_SYMBOLS)]),
                hovertext=[
                    f"{series_key} {value}, {x_key} {p[x_key]:.2f}"
                    + (f" ({p.get(count_key, '?')} {count_key})" if count_key else "")
                    + f"<br>{p.get('correct', '?')} of {p.get('n', '?')} right ({100 * p['accuracy']:.0f}%)"
                    for p in points
                ],
                hoverinfo="text",
                meta={"series": value},
            )
        )
    low, high = min(experiment.x_values), max(experiment.x_values)
    for name, value in (sweep.get("baselines") or {}).items():
        fig.add_trace(
            go.Scatter(
                x=[low, high],
                y=[float(value), float(value)],
                mode="lines",
                name=f"{label_of(name)} ({100 * float(value):.0f}%)",
                line=dict(color=color_of(name), dash="dot", width=2),
                hovertext=[f"{label_of(name)}: {100 * float(value):.0f}% right"] * 2,
                hoverinfo="text",
                meta={"series": name},
            )
        )
    margin = 0.03 * (high - low or 1.0)
    fig.update_xaxes(title_text=experiment.x_label, range=[low - margin, high + margin])
    fig.update_yaxes(title_text="answers right (share)", range=[-0.05, 1.08], tickformat=".0%")
    subtitle = f"{sweep.get('n', '?')} built-in questions, metric: {sweep.get('metric', 'answer contains the gold answer')}"
    return layout(fig, f"{title}<br><sup>{subtitle}</sup>", height=HEIGHTS["sweep"])


def sweep_spec(sweep: dict | None):
    """(handoff, its Sweep) for sweep data: the one it names, else the first handoff with a sweep."""
    page = methods.page_of((sweep or {}).get("handoff"))
    if page is None or page.sweep is None:
        candidates = methods.with_sweep()
        page = candidates[0] if candidates else None
    return (page.handoff, page.sweep) if page is not None else None


# --- everything at once -------------------------------------------------------------------------


def layer_figure_handoffs(names: Iterable[str] | None = None) -> list[str]:
    """The handoffs (of ``names``, default every page column) whose page entry draws its own figure,
    in the order given."""
    with_figure = {page.name for page in methods.with_figure()}
    return [name for name in (methods.column_names() if names is None else names) if name in with_figure]


def own_figure(handoff: str, result) -> go.Figure:
    """A handoff's own figure (its page entry's ``figure``) of one result, or of None (it says how to get one)."""
    return methods.page_of(handoff).figure(result)


@functools.lru_cache(maxsize=None)
def figure_without_result(handoff: str) -> go.Figure:
    """A handoff's own figure when it has no result (it says how to get one): the same for every
    run, so built once per process and shared (do not change it in place; ~20 ms to build each)."""
    return own_figure(handoff, None)


def all_figures(results, names: Iterable[str] | None = None, built: dict[str, go.Figure] | None = None) -> dict[str, go.Figure]:
    """Each handoff's own figure (keyed by its name) and the latency and bytes figures. A handoff
    without a result gets ``figure_without_result``, the one object every call shares. ``built``:
    figures already drawn from these results (a live run draws each handoff's own as it finishes,
    while the others still run; a shared computation's are drawn once for every request)."""
    results, built = _typed(results), built or {}
    figures = {}
    for name in layer_figure_handoffs(names):
        result = find(results, name)
        if result is None:
            figures[name] = figure_without_result(name)
        else:
            figures[name] = built[name] if name in built else own_figure(name, result)
    figures["latency"] = built["latency"] if "latency" in built else latency_figure(results)
    figures["bytes"] = built["bytes"] if "bytes" in built else bytes_figure(results)
    return figures
