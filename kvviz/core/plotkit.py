"""Building blocks every kvviz figure shares: the layout, the "nothing to plot" figure, colours
that mean the same in every figure. Knows no handoff (each handoff's own figure lives in its file,
the figures across handoffs in ``kvviz.app.plots``).

Figures are built from Python lists, not numpy arrays: plotly would base64-encode arrays in its
JSON, which scripts and tests then cannot read.
"""

from __future__ import annotations

import colorsys
import functools
import threading
from typing import Iterable

import plotly.graph_objects as go
import plotly.io as pio

FONT = dict(family="Inter, system-ui, sans-serif", size=12)
MIN_CONTRAST = 4.5  # WCAG AA for text
COMPACT_TITLE_CHARACTERS = 36  # a figure title line that fits a 390 px phone at 14 px
COMPACT_LEGEND_CHARACTERS = 40  # a legend entry's line at 10 px, beside its swatch
# Line heights of the compact figure's texts in px (plotly: 1.3 x the font size), measured in Chromium.
TITLE_PAD = 14
TITLE_LINE = 18  # 13 px title
SUP_LINE = 13  # its <sup> lines
NOTE_LINE = 13  # 10 px subplot titles and notes
AXIS_TITLE_LINE = 24  # 12 px axis title, with plotly's gap above it
LEGEND_LINE = 18  # 10 px legend entry with its swatch
TICK_CHARACTER = 6.2  # width of one character of an 11 px tick label
COMPACT_PLOT_CHARACTERS = 46  # 10 px characters across the plot area of a 390 px phone
SELECTED_OUTLINE = "#111111"  # outline of a highlighted bar (a selected layer, an open gate)
MUTED = "#bdbdbd"
TRACE_KINDS = ("bar", "heatmap", "scatter")  # every trace type a kvviz figure draws


_TEMPLATE_LOCK = threading.Lock()


@functools.cache
def _house_template() -> go.layout.Template:
    white = pio.templates["plotly_white"]
    return go.layout.Template(layout=white.layout, data={kind: white.data[kind] for kind in TRACE_KINDS})


def house_template() -> go.layout.Template:
    """Plotly's "plotly_white", cut to the trace types kvviz draws (``TRACE_KINDS``): the figures
    look the same, and each copies and sends half the template (plotly copies a figure's template
    into it; the whole one cost ~5 ms a figure, a run's last update builds a dozen).

    Built once under a lock: plotly's objects are not safe to build from two threads (two runs
    finishing at once on the page raised "Invalid value" inside plotly)."""
    with _TEMPLATE_LOCK:
        return _house_template()


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
        template=house_template(),
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
        if trace.get("type") == "bar" and not (trace.get("meta") or {}).get("legend_only"):
            key = (trace.get("meta") or {}).get("series") or trace.get("name")
            counts[key] = len(trace.get("y") or [])
    return counts


# --- colours as text: contrast and ink shades -----------------------------------------------------


def rgb(color: str) -> tuple[int, int, int]:
    """"#RRGGBB" as (r, g, b)."""
    value = color.lstrip("#")
    return int(value[0:2], 16), int(value[2:4], 16), int(value[4:6], 16)


def hex_color(rgb_value: Iterable[float]) -> str:
    return "#" + "".join(f"{round(v):02X}" for v in rgb_value)


def _luminance(rgb_value) -> float:
    def channel(v):
        v /= 255
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(v) for v in rgb_value)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(foreground: str, background: str) -> float:
    """WCAG 2 contrast ratio of two "#RRGGBB" colours (1 to 21)."""
    a, b = _luminance(rgb(foreground)), _luminance(rgb(background))
    return (max(a, b) + 0.05) / (min(a, b) + 0.05)


def tint(color: str, share: float = 0.08) -> str:
    """The colour at ``share`` over white: a card's pale background in its handoff's hue."""
    return hex_color(share * v + (1 - share) * 255 for v in rgb(color))


@functools.lru_cache(maxsize=64)
def ink(color: str, target: float = 4.6) -> str:
    """A shade of ``color`` for text: the same hue, its lightness lowered until the text is at least
    ``target``:1 on white and on the colour's tint (WCAG AA asks 4.5). A hue already dark enough
    is its own ink, so a new handoff's colour needs nothing from the page."""
    hue, lightness, saturation = colorsys.rgb_to_hls(*(v / 255 for v in rgb(color)))
    while lightness > 0:
        shade = hex_color(v * 255 for v in colorsys.hls_to_rgb(hue, lightness, saturation))
        if min(contrast_ratio(shade, "#FFFFFF"), contrast_ratio(shade, tint(color))) >= target:
            return shade
        lightness -= 0.005
    return "#000000"


# --- the phone form of a figure -------------------------------------------------------------------


def compact(fig: go.Figure) -> go.Figure:
    """The figure for a narrow screen (390 px): title, subplot titles and notes wrapped to short
    lines (a subplot title to its own column's width), the legend below in small type, narrow
    margins, no colour bars (values stay in the hover), category labels at 45 degrees, and the
    height grown by what the wrapped lines, the labels and the legend need, so nothing is cut and
    nothing overlaps. The title is pinned to the top, the subplot titles sit between it and the plot."""
    head, _, sub = (fig.layout.title.text or "").partition("<br>")
    title = wrap(_plain(head), COMPACT_TITLE_CHARACTERS)
    sub_lines = wrap(_plain(sub), COMPACT_TITLE_CHARACTERS + 12).split("<br>") if sub else []
    if sub_lines:
        title += "<br>" + "<br>".join(f"<sup>{line}</sup>" for line in sub_lines)
    title_px = TITLE_PAD + TITLE_LINE * (title.count("<br>") + 1 - len(sub_lines)) + SUP_LINE * len(sub_lines)
    above = 0  # lines of the subplot titles over the top row (they grow upwards, into the margin)
    below = 0  # lines of the notes under the plot (a paper annotation at y < 0)
    for annotation in fig.layout.annotations or ():
        if not annotation.text:
            continue
        characters = max(12, round(COMPACT_PLOT_CHARACTERS * _column_share(fig, annotation)))
        annotation.text = wrap(_plain(annotation.text), characters)
        annotation.font = dict(size=min(10, (annotation.font.size or 10)), color=annotation.font.color)
        lines = annotation.text.count("<br>") + 1
        if annotation.yanchor == "bottom" and (annotation.y or 0) >= 0.9:
            above = max(above, lines)
        elif annotation.yref == "paper" and (annotation.y or 0) < 0:
            below = max(below, lines)
    fig.update_traces(showscale=False, selector=dict(type="heatmap"))
    fig.for_each_xaxis(lambda axis: axis.update(title_text=wrap(_plain(axis.title.text), COMPACT_TITLE_CHARACTERS))
                       if axis.title.text else None)
    labels_px = _slant_category_labels(fig)
    for _, axis in _x_axes(fig):  # a right-hand column's y title would lie over its left neighbour's plot;
        if (axis.domain or (0, 1))[0] > 0.05 and axis.anchor:  # on a phone its subplot title names it
            fig.layout["yaxis" + axis.anchor[1:]].title.text = None
    for trace in fig.data:  # a legend entry longer than the screen is wrapped (plotly does not)
        if trace.name and len(trace.name) > COMPACT_LEGEND_CHARACTERS:
            trace.name = wrap(_plain(trace.name), COMPACT_LEGEND_CHARACTERS)
    rows = _legend_rows(fig)
    axis_lines = max([0] + [str(axis.title.text).count("<br>") + 1 for axis in fig.select_xaxes() if axis.title.text])
    top = title_px + NOTE_LINE * above + 8
    under_axis = labels_px + AXIS_TITLE_LINE * axis_lines + 10  # tick labels and the axis title, above the notes
    notes_px = NOTE_LINE * below + (4 if below else 0)
    bottom = max(under_axis + notes_px + 4 + LEGEND_LINE * rows, 40)
    old = fig.layout.margin
    plot_height = max(140, (fig.layout.height or 340) - (old.t or 64) - (old.b or 90))
    for annotation in fig.layout.annotations or ():  # the notes under the plot go under the tick labels
        if annotation.text and annotation.yref == "paper" and (annotation.y or 0) < 0:
            annotation.update(y=-under_axis / plot_height, yanchor="top")
    fig.update_layout(
        title=dict(text=title, font=dict(size=13), x=0.01, xanchor="left", y=1, yref="container", yanchor="top",
                   pad=dict(t=TITLE_PAD)),
        margin=dict(l=44, r=8, t=top, b=bottom),
        height=top + plot_height + bottom,
        legend=dict(orientation="h", yanchor="top", y=-(under_axis + notes_px) / plot_height, x=0.0, xanchor="left",
                    font=dict(size=10)),
    )
    return fig


def _column_share(fig: go.Figure, annotation) -> float:
    """The share of the plot's width that a subplot title's column takes (1 when it is not one)."""
    if annotation.xref != "paper" or annotation.x is None:
        return 1.0
    for axis in fig.select_xaxes():
        low, high = axis.domain or (0, 1)
        if high - low < 0.99 and low <= annotation.x <= high:
            return high - low
    return 1.0


def _slant_category_labels(fig: go.Figure) -> int:
    """Category axes whose labels would not fit side by side get them at 45 degrees; the px that the
    tallest label takes under its axis."""
    width = 390 - 44 - 8 - 30  # the plot area of a 390 px phone, the page's own padding out
    tallest = 24  # one line of horizontal tick labels, with its gap to the axis
    for name, axis in _x_axes(fig):
        labels = [str(x) for trace in fig.data if (getattr(trace, "xaxis", None) or "x") == name
                  for x in (getattr(trace, "x", None) or ()) if isinstance(x, str)]
        if not labels:
            continue
        low, high = axis.domain or (0, 1)
        longest = max(len(label) for label in labels)
        if len(set(labels)) * (longest + 1) * TICK_CHARACTER > (high - low) * width:
            axis.update(tickangle=-45, tickfont=dict(size=11))
            tallest = max(tallest, round(0.71 * longest * TICK_CHARACTER + 22))
    return tallest


def _x_axes(fig: go.Figure):
    """(the trace's name for it, "x", "x2", ...; the axis) for every x axis of the figure."""
    for key in fig.layout:
        if key.startswith("xaxis"):
            yield "x" + key[len("xaxis"):], fig.layout[key]


def _plain(text: str) -> str:
    """Plotly title text without its line breaks and <sup> marks (to wrap it again)."""
    return " ".join(str(text).replace("<br>", " ").replace("<sup>", "").replace("</sup>", "").split())


def _legend_rows(fig: go.Figure) -> int:
    """Text lines a small-type legend takes at 390 px: short entries share a row (about 46
    characters), a wrapped entry takes a row per line."""
    names = [trace.name for trace in fig.data if trace.name and trace.showlegend is not False]
    rows, width = 0, 0
    for name in names:
        lines = name.split("<br>")
        size = max(len(line) for line in lines) + 5
        if len(lines) > 1 or not width or width + size > 46:
            rows, width = rows + len(lines), 0
        width += size
    return rows
