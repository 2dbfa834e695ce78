"""Building blocks every kvviz figure shares: the layout, the "nothing to plot" figure, colours
that mean the same in every figure. Knows no handoff (each handoff's own figure lives in its file,
the figures across handoffs in ``kvviz.plots``).

Figures are built from Python lists, not numpy arrays: plotly would base64-encode arrays in its
JSON, which scripts and tests then cannot read.
"""

from __future__ import annotations

from typing import Iterable

import plotly.graph_objects as go

FONT = dict(family="Inter, system-ui, sans-serif", size=12)
SELECTED_OUTLINE = "#111111"  # outline of a highlighted bar (a selected layer, an open gate)
MUTED = "#bdbdbd"


def as_dict(result) -> dict:
    """Accept a HandoffResult or its dict."""
    return result if isinstance(result, dict) else result.to_dict()


def as_dicts(results: Iterable) -> list[dict]:
    return [as_dict(r) for r in results or []]


def layout(fig: go.Figure, title: str, height: int = 340, **extra) -> go.Figure:
    """The one house style: title top left, legend under the plot, a fixed height.

    Each figure keeps one height whether it is empty or full: a plot that changes height while the
    page streams updates shifts the layout under its neighbours, and plotly.js then throws
    "Something went wrong with axis scaling" and the page stops updating (seen in Chromium).
    """
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
    fig = go.Figure()
    fig.add_annotation(
        text=wrap(message), x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=13, color="#555")
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return layout(fig, title, height=height)


def not_run_figure(title: str, result, height: int, hint: str, label: str) -> go.Figure | None:
    """The empty figure for a result that is missing (``hint`` says how to get one), not
    applicable, or without per-layer records (it says why, naming the handoff by ``label``);
    None when there is something to plot."""
    if result is None:
        return empty_figure(title, hint, height)
    result = as_dict(result)
    if not result.get("applicable", True) or not result.get("layers"):
        return empty_figure(title, f"{label} did not run: " + (result.get("reason") or "no per-layer data."), height)
    return None


def human_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} GB"


def bar_counts(figure: go.Figure | dict) -> dict[str, int]:
    """Number of bars per bar trace, keyed by the trace's series name (for tests and scripts)."""
    data = figure["data"] if isinstance(figure, dict) else figure.to_dict()["data"]
    counts = {}
    for trace in data:
        if trace.get("type") == "bar":
            key = (trace.get("meta") or {}).get("series") or trace.get("name")
            counts[key] = len(trace.get("y") or [])
    return counts
