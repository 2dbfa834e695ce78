"""What the page shows for a run's results, as ``{role: value}`` updates (no Gradio).

A *payload* is ``present.payload(...)`` plus a ``stamp`` naming the results it holds ("preset:KEY"
for a precomputed preset, "shared:ID" for the whole results of a computation the server's shared
runs name, "run:N" for a live run's own): figures are built only for the tab in view and only when
the stamp (and, for time and bytes, the ticked columns) changed since that tab last drew them
(``tab_updates``); a preset's and a shared computation's figures are built once per process
(``FigureCache``).

Roles: ``status``, ``verdict``, ``lesson``, and per column ``head:NAME`` (title and mark),
``answer:NAME``, ``stats:NAME`` (the card's line), ``notes:NAME`` (the long stats, in "What each
model saw") and ``seen:NAME``; ``figure:NAME`` per figure; ``table`` and ``json`` (the Data tab).
"""

from __future__ import annotations

import collections
import itertools
import threading

import plotly.graph_objects as go

from kvviz.app import lessons, plots, present, tokenview
from kvviz.app.page.spec import FIXED_PLOTS, LENS_PLOT, column_names, expected_text, tab_figures, token_view_column
from kvviz.app.presets import PRESETS, preset
from kvviz.core.plotkit import compact as compact_figure
from kvviz.data.swaps import Swap, swap_record
from kvviz.handoffs import registry

_run_numbers = itertools.count(1)


def live_stamp() -> str:
    return f"run:{next(_run_numbers)}"


def shared_stamp(identity: str) -> str:
    """The stamp of a computation's whole results, the same for every request that shares it
    (``kvviz.engine.events.Computation``)."""
    return f"{SHARED_STAMP}{identity}"


SHARED_STAMP = "shared:"


def results_by_name(payload: dict | None) -> dict[str, dict]:
    return {result["handoff"]: result for result in (payload or {}).get("results", [])}


# --- cards, strip, lesson -----------------------------------------------------------------------


def card(name: str, result: dict | None, answers, state: str = "", partial: str | None = None,
         swapped: bool = False, what_ifs: list | None = None) -> dict:
    """Every role of one column's card (and its "What each model saw" section). ``swapped``: the
    swapped note's outcome and answer show under the title (what the outcome means on hover);
    ``what_ifs``: the column's answers in a preset's stored runs at other settings."""
    kind = state if state and result is None else present.mark_of(result, answers)
    swap_row = present.swap_row_html(name, result) if swapped and result is not None else ""
    what_if = present.what_if_html(name, what_ifs or [], answers) if result is not None else ""
    return {
        f"head:{name}": present.card_head_html(name, kind, swap_row + what_if),
        f"answer:{name}": present.answer_text(result, partial),
        f"stats:{name}": present.card_stats(result, state),
        f"notes:{name}": present.stats_markdown(result, state) if result is not None or state else "",
        f"seen:{name}": present.seen_text(result),
    }


def marks(payload: dict | None, names: list[str], answers, states: dict[str, str] | None = None) -> dict[str, str]:
    """Each ticked column's mark, in page order (a state such as "running" for one not finished)."""
    found, states = results_by_name(payload), states or {}
    return {name: (present.mark_of(found[name], answers) if name in found else states.get(name, "notrun"))
            for name in column_names() if name in names}


def evidence(payload: dict | None, names: list[str], answers) -> dict[str, str]:
    """What each ticked right column's answer is evidence of (``present.evidence_of``), its control's
    result read from the payload whether or not its column is ticked (a preset's holds every column)."""
    found = results_by_name(payload)
    return {name: kind for name in names if (kind := lessons.evidence_of(name, found, answers)) is not None}


def verdict(payload: dict | None, names: list[str], answers, subject: str, states: dict | None = None) -> dict:
    return {"verdict": present.verdict_strip_html(subject, marks(payload, names, answers, states), answers,
                                                  evidence(payload, names, answers))}


def cards_and_verdict(payload: dict | None, names: list[str], answers, subject: str) -> dict:
    """Every column's card (ticked or not, so that ticking one shows it at once) and the strip; with
    the swapped note shown (``swap_shown``, after *Swap the fact*) each card says what it did with it."""
    found, swapped = results_by_name(payload), bool((payload or {}).get("swap_shown"))
    what_ifs = (payload or {}).get("what_ifs") or {}
    updates = {}
    for name in column_names():
        updates.update(card(name, found.get(name), answers, swapped=swapped, what_ifs=what_ifs.get(name)))
    updates.update(verdict(payload, names, answers, subject))
    return updates


def answers_this(payload: dict | None, query: str, context: str, pair: str) -> bool:
    """Whether the results on the page answer this question and note on this pair (no results: yes,
    there is nothing to contradict it)."""
    if not payload or not payload.get("results"):
        return True
    held = payload.get("request") or {}
    return ((held.get("query") or "").strip() == (query or "").strip()
            and (held.get("context") or "").strip() == (context or "").strip() and payload.get("pair", pair) == pair)


def stale_view(payload: dict, pair: str) -> dict:
    """The page while its results answer another question or pair than the one it now asks: every
    card keeps its answer, greyed and marked "other question" (no ✓ or ✗ for a question it was not
    asked), the strip says which question they answer, and no preset or lesson is claimed."""
    found = results_by_name(payload)
    held = payload.get("request") or {}
    updates = {f"head:{name}": present.card_head_html(name, "stale") for name in column_names() if name in found}
    return {**updates, "presets": None, "lesson": "",
            "verdict": present.stale_strip_html(held.get("query") or "", payload.get("pair", pair), pair)}


def question_view(payload: dict | None, query: str, context: str, pair: str, names: list[str], answers) -> dict:
    """What the page shows for the question, note and pair it now asks: the results as they are when
    they answer it (marks, strip, the preset's lesson), else ``stale_view``."""
    if answers_this(payload, query, context, pair):
        return {**cards_and_verdict(payload, names, answers, subject_of(payload)), "lesson": lesson_of(payload),
                "presets": (payload or {}).get("preset") if (payload or {}).get("precomputed") else None}
    return stale_view(payload, pair)


# --- the swapped note (Swap the fact) --------------------------------------------------------------


def swap_fields(picked) -> dict:
    """The swap fields for a preset: its stored swap's words and answer (empty without one)."""
    old, new = picked.swap_words or ("", "")
    return {"swap_replace": old, "swap_by": new,
            "swap_answer": expected_text(picked.swap.answers) if picked.swap else ""}


def same_request(payload: dict | None, request: dict) -> bool:
    """Whether the payload's results answer this request (question, note, settings, options)."""
    held = (payload or {}).get("request") or {}
    return all(held.get(part) == request.get(part) for part in ("query", "context", "generation", "options"))


def holds_swap(payload: dict | None, names: list[str], swap: Swap) -> bool:
    """Whether every column in ``names`` already ran on this swapped note (a preset's stored swap)."""
    found = results_by_name(payload)
    return bool(names) and all(((found.get(name) or {}).get("swap") or {}).get("context") == swap.context for name in names)


def with_swap(payload: dict, originals: dict[str, dict], swapped: dict[str, dict], names: list[str], swap: Swap,
              answers: list[str]) -> dict:
    """A new payload: each column's result on the note (``originals``) with what it did on the
    swapped note (``swapped``; ``kvviz.data.swaps.swap_record``, judged by ``answers`` where given)."""
    results = []
    for name in names:
        other = swapped.get(name) or {"applicable": False, "reason": "it did not run on the swapped note"}
        results.append({**originals[name], "swap": swap_record(originals[name], other, swap, answers or None)})
    data = present.payload(payload["pair"], payload["request"], results, False, payload.get("preset"))
    return dict(data, stamp=live_stamp(), swap=swap.to_dict(), swap_shown=True)


def swap_view(payload: dict, names: list[str], answers, subject: str) -> dict:
    """The page once the swapped note ran: every card with its swapped answer and outcome, the
    strip, the status line that sums them up, and the results."""
    found = results_by_name(payload)
    ticked = [found[name] for name in names if name in found]
    return {**cards_and_verdict(payload, names, answers, subject), "results": payload,
            "status": present.swap_status(payload.get("swap") or {}, ticked)}


def lesson_of(payload: dict | None) -> str:
    """The lesson line for results that answer a preset's question (empty otherwise). A live run
    may use other settings than the precomputed one that shows the lesson: then the line says so."""
    key = (payload or {}).get("preset")
    if not key:
        return ""
    if payload.get("precomputed", True):
        return f"**Lesson:** {present.md(preset(key).lesson)}"
    return f"**The preset's lesson** (its precomputed run, at the page's defaults): {present.md(preset(key).lesson)}"


def subject_of(payload: dict | None) -> str:
    key = (payload or {}).get("preset")
    return preset(key).subject if key else "The expected answer"


def preset_matching(query: str, context: str | None) -> str | None:
    """The preset whose question this is (same query and context), if any."""
    for candidate in PRESETS:
        if candidate.query.strip() == (query or "").strip() and (candidate.context or "") == (context or "").strip():
            return candidate.key
    return None


# --- precomputed payloads -----------------------------------------------------------------------


def precomputed_payload(precomputed: dict, key: str, default_pair: str) -> tuple[dict, str]:
    """A preset's precomputed results as a payload, and its status line (or an empty payload that
    says how to get results)."""
    entry = (precomputed.get("presets") or {}).get(key)
    title = preset(key).title
    if not entry:
        payload = dict(present.payload(default_pair, None, [], True, key), stamp=f"preset:{key}")
        return payload, (f"No precomputed results for **{present.md(title)}**: press **Run live** to compute them "
                         "on this machine.")
    timed = precomputed.get("timed", "alone")  # how its times were taken (scripts/precompute_presets.py)
    results = [dict(r, precomputed=True, timed=timed) for r in entry["results"] if r.get("handoff") in registry.HANDOFFS]
    pair = precomputed.get("pair", default_pair)
    what_ifs: dict[str, list] = {}  # column -> [(label, result)]: the preset's stored runs at other settings
    for label, run in (entry.get("runs") or {}).items():
        for result in run.get("results", []):
            what_ifs.setdefault(result.get("handoff"), []).append((label, result))
    payload = dict(present.payload(pair, entry.get("request"), results, True, key), stamp=f"preset:{key}",
                   swap=entry.get("swap"), what_ifs=what_ifs)
    return payload, present.precomputed_status(title, pair, precomputed.get("generated", ""))


# --- figures, per tab ---------------------------------------------------------------------------


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

    def figure(self, name: str, payload: dict, names: list[str], compact: bool) -> go.Figure:
        key = (payload.get("stamp"), name, tuple(names) if name in (*FIXED_PLOTS, LENS_PLOT) else (), compact)
        return self.drawn_once(key, lambda: build_figure(name, payload, names, compact))

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


def build_figure(name: str, payload: dict, names: list[str], compact: bool) -> go.Figure:
    """One figure of a payload: a handoff's own figure, or latency / bytes over the ticked columns."""
    results = [r for r in payload.get("results", []) if r.get("handoff") in names]
    if name == "latency":
        figure = plots.latency_figure(results)
    elif name == "bytes":
        figure = plots.bytes_figure(results)
    elif name == LENS_PLOT:
        figure = tokenview.lens_figure(results)
    else:
        figure = plots.own_figure(name, results_by_name(payload).get(name))
    return compact_figure(figure) if compact else figure


def sweep_figure(data: dict | None, compact: bool) -> go.Figure:
    figure = plots.sweep_figure(data)
    return compact_figure(figure) if compact else figure


def figure_key(name: str, payload: dict, names: list[str], compact: bool) -> str:
    """What a drawn figure shows: when it is unchanged, the figure is not sent again."""
    ticked = ",".join(names) if name in (*FIXED_PLOTS, LENS_PLOT) else ""
    return f"{payload.get('stamp')}|{ticked}|{int(compact)}"


def token_view_updates(payload: dict, names: list[str], view: dict, chosen: str | None = None) -> tuple[dict, dict]:
    """The What crossed tab: its column picker (``tokens_column``: the ticked columns that hold a
    token view, and the one shown) and the view of that column (``tokens``), when either changed."""
    found = results_by_name(payload)
    with_view = [name for name in names if tokenview.has_view(found.get(name))]
    column = token_view_column(names, with_view, chosen or view.get("tokens_column"))
    drawn = dict(view.get("drawn") or {})
    key = f"{payload.get('stamp')}|{column}|{','.join(with_view)}"
    updates = {}
    if drawn.get("tokens") != key:
        labels = [(registry.get(name).label, name) for name in with_view]
        updates["tokens_column"] = {"choices": labels, "value": column}
        if column is not None:
            updates["tokens"] = tokenview.token_view_html(found[column])
        elif found:
            updates["tokens"] = ('<div class="kv-tv-empty">None of the ticked columns holds what crossed: these results '
                                 "were computed without recording it. Press <b>Run live</b> to record it.</div>")
        else:
            updates["tokens"] = '<div class="kv-tv-empty">No results yet: press <b>Run live</b>.</div>'
        drawn["tokens"] = key
    return updates, {**view, "tokens_column": column, "drawn": drawn}


def tab_updates(tab: str, payload: dict, names: list[str], view: dict, cache: FigureCache) -> tuple[dict, dict]:
    """The figure updates a tab needs now (only those whose content changed since it drew them)
    and the view state after them. ``view``: ``{"tab": ..., "compact": bool, "drawn": {role: key}}``."""
    drawn = dict(view.get("drawn") or {})
    compact = bool(view.get("compact"))
    updates = {}
    for name in tab_figures(tab, names):
        key = figure_key(name, payload, names, compact)
        if drawn.get(f"figure:{name}") != key:
            updates[f"figure:{name}"] = cache.figure(name, payload, names, compact)
            drawn[f"figure:{name}"] = key
    if tab == "sweep" and not str(drawn.get("sweep_plot", "")).startswith("live") \
            and drawn.get("sweep_plot") != f"precomputed|{int(compact)}":
        updates["sweep_plot"] = cache.sweep_figure(compact)  # a live sweep's figure stays until the next one
        drawn["sweep_plot"] = f"precomputed|{int(compact)}"
    if tab == "tokens":
        column_updates, view = token_view_updates(payload, names, {**view, "drawn": drawn})
        updates.update(column_updates)
        drawn = view["drawn"]
    if tab == "how" and not drawn.get("how"):
        updates["how"] = present.how_it_works_page(column_names())
        drawn["how"] = True
    if drawn.get("data") != payload.get("stamp"):  # ~9 KB: sent with any tab, so the Data tab paints as it opens
        updates["table"] = present.reading_frame(payload)
        drawn["data"] = payload.get("stamp")
    if tab == "data":
        json_updates, view = json_updates_for(payload, {**view, "drawn": drawn})
        updates.update(json_updates)
        drawn = view["drawn"]
    return updates, {**view, "tab": tab, "drawn": drawn}


def json_updates_for(payload: dict, view: dict) -> tuple[dict, dict]:
    """The Data tab's structured results, only while their box is open (``view["json_open"]``) and
    only when they changed since it drew them."""
    drawn = dict(view.get("drawn") or {})
    if not view.get("json_open") or drawn.get("json") == payload.get("stamp"):
        return {}, view
    drawn["json"] = payload.get("stamp")
    return {"json": tokenview.payload_without_arrays(payload)}, {**view, "drawn": drawn}
