"""What the tabs under the cards draw for a run: each tab's figures built only when it is in view
and only when their content changed since it drew them (``tab_updates``), the What crossed tab's
column and view, the Data tab's table and JSON. A preset's and a shared computation's figures are
built once per process (``FigureCache``). Everything is read from the run's reading
(``kvviz.app.reading``); no Gradio.
"""

from __future__ import annotations

import collections
import itertools
import threading

import plotly.graph_objects as go

from kvviz.app import plots, present, tokenview
from kvviz.app.page.spec import FIXED_PLOTS, LENS_PLOT, TAB_PARTS, column_names, tab_figures, tab_parts, token_view_column
from kvviz.app.reading import catalog
from kvviz.app.reading.reading import Reading
from kvviz.core.plotkit import compact as compact_figure

SHARED_STAMP = "shared:"
_run_numbers = itertools.count(1)


def live_stamp() -> str:
    """The stamp of a run's own results (a sampling run; a run stopped, failed or out of time)."""
    return f"run:{next(_run_numbers)}"


def shared_stamp(identity: str) -> str:
    """The stamp of a computation's whole results, the same for every request that shares it
    (``kvviz.engine.events.Computation``)."""
    return f"{SHARED_STAMP}{identity}"


class FigureCache:
    """Figures built once per process and shared by every session: the precomputed presets', the
    precomputed sweep's, and those of a shared computation's whole results (a greedy run, which a class
    that pressed Run on one question shares: ``shared_stamp``; the last ``MAX_SHARED_FIGURES`` are
    kept). A live run's own results (``live_stamp``: a sampling run, a run stopped, failed or out of
    time) are drawn for its session only."""

    MAX_SHARED_FIGURES = 256  # about 40 runs' figures

    def __init__(self, sweep: dict | None = None):
        self._figures: dict[tuple, go.Figure] = {}
        self._shared: collections.OrderedDict[tuple, go.Figure] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.sweep = sweep

    def sweep_figure(self, compact: bool) -> go.Figure:
        key = ("sweep", compact)
        with self._lock:
            if key not in self._figures:
                self._figures[key] = sweep_figure(self.sweep, compact)
            return self._figures[key]

    def figure(self, name: str, reading: Reading, names: list[str], compact: bool) -> go.Figure:
        key = (reading.stamp, name, tuple(names) if name in (*FIXED_PLOTS, LENS_PLOT) else (), compact)
        return self.drawn_once(key, lambda: build_figure(name, reading, names, compact))

    def drawn_once(self, key: tuple, draw) -> go.Figure:
        """The figure ``key`` names (its first item a stamp), drawn by ``draw`` the first time a
        preset's or a shared computation's figure is asked for, and every time for a run's own."""
        stamp = str(key[0])
        kept = self._figures if stamp.startswith("preset:") else self._shared if stamp.startswith(SHARED_STAMP) else None
        if kept is None:
            return draw()
        with self._lock:
            if key in kept:
                if kept is self._shared:
                    self._shared.move_to_end(key)
                return kept[key]
        figure = draw()  # outside the lock: the others draw on meanwhile (two may draw one figure once)
        with self._lock:
            kept[key] = figure
            while len(self._shared) > self.MAX_SHARED_FIGURES:
                self._shared.popitem(last=False)
        return figure


def build_figure(name: str, reading: Reading, names: list[str], compact: bool) -> go.Figure:
    """One figure of a run: a handoff's own figure, or latency / bytes over the ticked columns."""
    results = reading.results(names)
    if name == "latency":
        timings = [column.timing for column in reading.finished() if column.name in names and column.timing]
        figure = plots.latency_figure(results, alone=bool(timings) and all(t.timed == "alone" for t in timings))
    elif name == "bytes":
        figure = plots.bytes_figure(results)
    elif name == LENS_PLOT:
        figure = tokenview.lens_figure(results)
    else:
        figure = plots.own_figure(name, reading.result(name))
    return compact_figure(figure) if compact else figure


def sweep_figure(data: dict | None, compact: bool) -> go.Figure:
    figure = plots.sweep_figure(data)
    return compact_figure(figure) if compact else figure


def figure_key(name: str, reading: Reading, names: list[str], compact: bool) -> str:
    """What a drawn figure shows: when it is unchanged, the figure is not sent again."""
    ticked = ",".join(names) if name in (*FIXED_PLOTS, LENS_PLOT) else ""
    return f"{reading.stamp}|{ticked}|{int(compact)}"


def token_view_updates(reading: Reading, names: list[str], view: dict, chosen: str | None = None) -> tuple[dict, dict]:
    """The What crossed tab: its column picker (``tokens_column``: the ticked columns that hold a
    token view, and the one shown) and the view of that column (``tokens``), when either changed."""
    with_view = [name for name in names if tokenview.has_view(reading.result(name))]
    column = token_view_column(names, with_view, chosen or view.get("tokens_column"))
    drawn = dict(view.get("drawn") or {})
    key = f"{reading.stamp}|{column}|{','.join(with_view)}"
    updates = {}
    if drawn.get("tokens") != key:
        labels = [(catalog.label_of(name), name) for name in with_view]
        updates["tokens_column"] = {"choices": labels, "value": column}
        if column is not None:
            updates["tokens"] = tokenview.token_view_html(reading.result(column))
        elif reading.finished():
            updates["tokens"] = ('<div class="kv-tv-empty">None of the ticked columns holds what crossed: these results '
                                 "were computed without recording it. Press <b>Run live</b> to record it.</div>")
        else:
            updates["tokens"] = '<div class="kv-tv-empty">No results yet: press <b>Run live</b>.</div>'
        drawn["tokens"] = key
    return updates, {**view, "tokens_column": column, "drawn": drawn}


def tab_updates(tab: str, reading: Reading, names: list[str], view: dict, cache: FigureCache) -> tuple[dict, dict]:
    """The figure updates a tab needs now (only those whose content changed since it drew them)
    and the view state after them. ``view``: ``{"tab": ..., "compact": bool, "drawn": {role: key}}``."""
    drawn = dict(view.get("drawn") or {})
    compact = bool(view.get("compact"))
    updates = {}
    for name in tab_figures(tab, names):
        key = figure_key(name, reading, names, compact)
        if drawn.get(f"figure:{name}") != key:
            updates[f"figure:{name}"] = cache.figure(name, reading, names, compact)
            drawn[f"figure:{name}"] = key
    if tab == "sweep" and not str(drawn.get("sweep_plot", "")).startswith("live") \
            and drawn.get("sweep_plot") != f"precomputed|{int(compact)}":
        updates["sweep_plot"] = cache.sweep_figure(compact)  # a live sweep's figure stays until the next one
        drawn["sweep_plot"] = f"precomputed|{int(compact)}"
    if tab == "tokens":
        column_updates, view = token_view_updates(reading, names, {**view, "drawn": drawn})
        updates.update(column_updates)
        drawn = view["drawn"]
    if tab in TAB_PARTS and drawn.get(f"recorded_{tab}") != reading.stamp:
        updates[f"recorded_{tab}"] = recorded_note(reading, tab)
        drawn[f"recorded_{tab}"] = reading.stamp
    if tab == "how" and not drawn.get("how"):
        updates["how"] = present.how_it_works_page(column_names())
        drawn["how"] = True
    if drawn.get("data") != reading.stamp:  # ~9 KB: sent with any tab, so the Data tab paints as it opens
        updates["table"] = present.reading_frame(reading)
        drawn["data"] = reading.stamp
    if tab == "data":
        json_updates, view = json_updates_for(reading, {**view, "drawn": drawn})
        updates.update(json_updates)
        drawn = view["drawn"]
    return updates, {**view, "tab": tab, "drawn": drawn}


def recorded_note(reading: Reading, tab: str) -> str:
    """The tab's line about what of it was recorded when a tab opened (``kvviz.app.page.recording``:
    ``payload["recorded_on_open"]``, one line per part), empty for a run that recorded it itself."""
    lines = reading.payload.get("recorded_on_open") or {}
    return " ".join(dict.fromkeys(lines[part] for part in tab_parts(tab) if lines.get(part)))


def json_updates_for(reading: Reading, view: dict) -> tuple[dict, dict]:
    """The Data tab's structured results (what the run endpoint returns: the payload the run was
    read from), only while their box is open (``view["json_open"]``) and only when they changed
    since it drew them."""
    drawn = dict(view.get("drawn") or {})
    if not view.get("json_open") or drawn.get("json") == reading.stamp:
        return {}, view
    drawn["json"] = reading.stamp
    return {"json": tokenview.payload_without_arrays(reading.payload)}, {**view, "drawn": drawn}
