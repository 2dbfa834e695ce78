"""What the page shows of each handoff, keyed by its registry name: the method's figure and the
facts under its answer, its "How it works" text and diagram, its column, its walk-through step and
its sweep. The method file (``kvviz.handoffs``) holds the method only; this is its page.

A page entry in short::

    PAGES = (MethodPage(name="echo", column=60, explanation="how it works, in words",
                        figure=echo_figure, notes=echo_notes, walkthrough="what to look at"),)

A registered handoff without a page entry runs everywhere (CLI, bench, API) but is not a column.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import plotly.graph_objects as go

from kvviz.app.methods.diagram import Flow, svg
from kvviz.app.reading.questions import CHOICES, Question
from kvviz.app.reading.reading import typed
from kvviz.core.plotkit import empty_figure
from kvviz.core.results import HandoffResult
from kvviz.handoffs import registry

OPENING_PRESET = "opening"  # a walk-through step that reloads the page's opening preset
WALKTHROUGH_TARGETS = ("", "cost")


@dataclass(frozen=True)
class Prediction:
    """A walk-through step's question, asked before its answer shows: the learner picks yes or no,
    then the stored run of the step's preset answers ``ask`` (a question of the one vocabulary,
    ``kvviz.app.reading.questions``: "verdict", "beats", "follow" ...) and Yes was right when its
    answer is ``yes`` (never a hand-written answer). ``question`` may name the preset's swap as
    {old}, {new}, {swapped}."""

    question: str
    ask: Question
    yes: str

    def __post_init__(self):
        choices = CHOICES.get(self.ask.kind, ())
        if self.ask.column is None or self.yes not in choices:
            raise ValueError(f"prediction {self.question!r}: ask a column's {', '.join(CHOICES)}, and yes must be one "
                             f"of its answers {choices}")


@dataclass(frozen=True)
class Sweep:
    """A page experiment: accuracy on the built-in sweep set against one option (``x``), one line
    per value of another (``series``). Points are stored under the options' own names."""

    title: str
    explanation: str
    x_option: str
    x_values: tuple[float, ...]
    x_label: str
    series_option: str
    series_values: tuple[str, ...]
    series_default: tuple[str, ...]
    # x values at which every series runs the same thing: run once and shared
    shared_x: tuple[float, ...] = ()
    # a details key of the result reported per point (e.g. how many layers were sent), and its name
    count_detail: str = ""
    count_name: str = ""


@dataclass(frozen=True)
class MethodPage:
    """How the page shows one handoff (``name``: its registry name)."""

    name: str
    column: int  # position among the page's columns (the order of the cards and the chips)
    explanation: str  # "How it works": a short paragraph of markdown
    figure: Callable[[dict | None], Any] | None = None  # its per-layer (or per-step) figure; None draws one
    notes: Callable[[dict], list[str]] | None = None  # extra facts under the answer (plain text)
    walkthrough: str = ""  # its step of the page's guided walk-through (default columns only)
    # the preset its step loads: a preset key, OPENING_PRESET (the page's opening one, again) or None
    # (keep what is on the page); the step's text may name the loaded preset's title as {preset} and
    # quote its lesson as {lesson}
    walkthrough_preset: str | None = None
    # what its step points at: "" its own figure (its column when it has none); "cost": time and bytes
    walkthrough_shows: str = ""
    # a question its step asks before the answer shows (the answers, marks, strip and lesson are
    # veiled until the learner picks); its text then keeps {lesson} for the reveal
    walkthrough_predicts: Prediction | None = None
    sweep: Sweep | None = None
    # "How it works" draws it (kvviz.app.methods.diagram): who reads what, what crosses; None: the
    # handoff's one-line summary is what crosses
    flow: Flow | None = None
    # what a latency stage is for this handoff, where the shared stage name would say more (or less)
    # than was measured, e.g. {"transfer": "splice in memory (no network)"}
    stage_labels: dict = field(default_factory=dict)
    # the token view (What crossed) opens on this column when it is ticked (its layer choice is
    # what the view explains best); otherwise on the first ticked column with a view
    opens_token_view: bool = False

    def __post_init__(self):
        if self.walkthrough_shows not in WALKTHROUGH_TARGETS:
            raise ValueError(f"page of {self.name}: walkthrough_shows must be one of {WALKTHROUGH_TARGETS}")

    @property
    def handoff(self) -> registry.Handoff:
        return registry.get(self.name)

    def diagram(self) -> str:
        """Its "How it works" diagram (SVG), from its flow."""
        handoff = self.handoff
        flow = self.flow or Flow(sender="what its sharer holds", crosses=handoff.summary, receiver="the question")
        return svg(self.name, handoff.title, handoff.color, flow)


PAGES: dict[str, MethodPage] = {}


def register_module(module) -> None:
    """Register the page entries a method's page module ends with (its ``PAGES`` tuple)."""
    entries = getattr(module, "PAGES", None)
    if not entries:
        raise ValueError(f"{module.__name__} ends with no PAGES tuple of page entries")
    for entry in entries:
        if not isinstance(entry, MethodPage):
            raise TypeError(f"{module.__name__}: PAGES holds MethodPage entries, got {type(entry).__name__}")
        if entry.name not in registry.HANDOFFS:
            raise ValueError(f"{module.__name__}: {entry.name!r} is not a registered handoff")
        PAGES[entry.name] = entry


def page_of(name: str) -> MethodPage | None:
    """The handoff's page entry, or None when it is not a page column."""
    return PAGES.get(name)


def columns() -> list[MethodPage]:
    """The page's columns, in their order."""
    return sorted(PAGES.values(), key=lambda page: (page.column, page.name))


def column_names() -> list[str]:
    return [page.name for page in columns()]


def default_columns() -> list[str]:
    """The columns shown when the page opens: the handoffs that run when nobody names one, in
    column order."""
    return [page.name for page in columns() if page.handoff.default]


def with_figure() -> list[MethodPage]:
    return [page for page in columns() if page.figure is not None]


def with_sweep() -> list[MethodPage]:
    return [page for page in columns() if page.sweep is not None]


def as_result(result) -> HandoffResult | None:
    """What a page entry's figure and notes read: the one result type (a result dict, as scripts and
    tests may give, becomes one; None stays None)."""
    return None if result is None else typed(result)


def not_run(title: str, result: HandoffResult | None, height: int, hint: str, label: str) -> go.Figure | None:
    """The empty figure for a result that is missing (``hint`` says how to get one), not applicable,
    or without per-layer records (it says why, naming the handoff by ``label``); None when there is
    something to plot."""
    if result is None:
        return empty_figure(title, hint, height)
    if not result.applicable or not result.layers:
        return empty_figure(title, f"{label} did not run: " + (result.reason or "no per-layer data."), height)
    return None


def stage_labels(name: str) -> dict:
    page = PAGES.get(name)
    return dict(page.stage_labels) if page is not None else {}


def column_group(name: str) -> str:
    """A column's chip group: "control" for another's control (not the receiver alone), "baseline"
    for the receiver alone, Skyline and the sharer alone, else "method"."""
    handoff = registry.get(name)
    if name in {h.control for h in registry.all_handoffs()} - {"receiver", ""}:
        return "control"
    return "baseline" if handoff.role in ("floor", "ceiling") or name == "sharer" else "method"


def catalog() -> list[dict]:
    """The page's columns without their code, in page order (``kvviz.app.reading.catalog``'s file,
    assets/methods.json: ``scripts/methods_catalog.py`` writes it from here)."""
    return [{"name": page.name, "label": page.handoff.label, "title": page.handoff.title, "summary": page.handoff.summary,
             "color": page.handoff.color, "control": page.handoff.control, "default": page.handoff.default,
             "group": column_group(page.name)} for page in columns()]
