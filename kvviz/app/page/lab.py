"""What the page's handlers share (``Lab``): the page, the presets' stored runs read once, the
figures, the stop flags, the server's shared runs and each session's own; and ``resolved``, which
turns a handler that returns ``{role: value}`` into one Gradio can call.

Rules kept by every handler (see ``kvviz.app.ui``): every model-running event shares one queue;
user selections use ``.input`` (a value the page sets itself never re-triggers a handler); the
page's own events are private to the API (``PRIVATE``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import gradio as gr
from gradio.data_classes import GradioModel, GradioRootModel

from kvviz.app import present
from kvviz.app.page import spec, views
from kvviz.app.page.named import Page
from kvviz.app.page.run import LiveRun, OwnRuns, StopFlags
from kvviz.app.page.steps import WalkStep
from kvviz.app.page.tabs import FigureCache, tab_updates
from kvviz.app.presets import preset
from kvviz.app.reading.reading import Reading
from kvviz.engine.shared_runs import SharedRuns

PRIVATE = dict(api_visibility="private", show_progress="hidden")
LOG = logging.getLogger("kvviz.app.page")
# A streaming event wired with these hands Gradio values already as they are sent (``as_sent``): Gradio
# otherwise postprocesses each output of each update in a thread of its own, from the server's event loop
# (a thread hop per output: 7-10 ms of the loop for /run's 57 outputs, with the models waiting on it;
# scripts/bench_app.py --update-costs).
SENT_AS_IS = dict(postprocess=False)


@dataclass
class Lab:
    """What the handlers share: the page, the presets' stored runs (read once), the figures, the stop flags."""

    page: Page
    precomputed: dict
    default_pair: str
    workers: int
    concurrency: int
    steps: list[WalkStep]
    cache: FigureCache
    flags: StopFlags
    # the events after which the page may show other results (a preset, a live run, a link): Compare
    # two remembers the results after each (``kvviz.app.page.comparing``; a change listener on the
    # results would make Gradio hash them before and after every streamed update)
    result_events: list = field(default_factory=list)
    # the events after which another tab may be in view, or the tab in view show other results: each is
    # followed by recording what that tab shows of what crossed where the run shown lacks it
    # (``kvviz.app.page.recording``)
    tab_events: list = field(default_factory=list)
    # the server's live runs: identical greedy runs computed once, the models' queue (kvviz.engine.shared_runs)
    runs: SharedRuns = field(default_factory=SharedRuns)
    own: OwnRuns = field(default_factory=OwnRuns)  # the computations each session ran itself
    presets: views.PresetRuns | None = None

    def __post_init__(self):
        self.presets = views.PresetRuns(self.precomputed, self.default_pair)

    def preset_view(self, key: str, view: dict) -> dict:
        """Everything a preset changes: the form (the pair its stored run is on too), the ticks, the
        cards, the strip, the lesson, the status, the results and their reading, and the figures of
        the tab in view."""
        picked = preset(key)
        payload, status, reading = self.presets(key)
        names = picked.columns
        updates = {"presets": key, "pair": payload["pair"], "facts": present.pair_facts_markdown(payload["pair"]),
                   "setup": spec.setup_html(picked.context, payload["pair"]), "query": picked.query, "context": picked.context or "",
                   "expected": spec.expected_text(picked.answers), "chosen": names, "shown": names, "status": status,
                   "lesson": views.lesson_of(reading, self.presets), "results": payload, "reading": reading, **views.swap_fields(picked)}
        updates.update(views.cards(reading, names))
        figures, view = tab_updates(view.get("tab", spec.DEFAULT_TAB), reading, names, {**view, "asked": None, "setup": None}, self.cache)
        return {**updates, **figures, "view": view}

    def live_run(self, pair: str, request, names: list[str], expected: str | None, key: str | None,
                 session: str = "") -> LiveRun:
        """A live run of ``names``; on a preset's question, on the pair and at the settings its
        stored run was measured on, each column's time alone (the stored run's) goes beside its
        time in the shared run."""
        alone = {}
        if key:
            payload, _, reading = self.presets(key)
            if views.same_request(payload, request.to_dict(), pair):
                alone = {column.name: column.timing.total for column in reading.finished()
                         if column.timing is not None and column.name in names}
        subject = preset(key).subject if key else views.OTHER_SUBJECT
        return LiveRun(pair, request, names, spec.expected_answers(expected), subject, key, alone=alone,
                       session=session, own=self.own)

    def tab_view(self, tab: str, reading: Reading, names: list[str], view: dict) -> dict:
        figures, view = tab_updates(tab, reading, names, view, self.cache)
        return {**figures, "view": view, "tab": tab}


# what an event that shows other results in the tabs may change: the results and their reading, what
# any tab draws (``tabs.tab_updates``), and the status line (where it says what failed, if drawing does)
DRAWN_ROLES = ("status", "results", "reading", "view", "sweep_plot", "tokens_column", "tokens", "how", "table", "json",
               *(f"recorded_{tab}" for tab in spec.TAB_PARTS))


def drawn_outputs(page: Page, roles=()) -> list:
    """The outputs of ``DRAWN_ROLES``, every figure and ``roles``, in page order; not the whole page
    (each output an event leaves as it was costs a fresh component)."""
    wanted: dict = {role: None for role in (*DRAWN_ROLES, *roles)}
    wanted.update({"lesson": ""} if "lesson" in wanted else {})
    wanted.update({"tokens_column": {"choices": [], "value": None}})
    wanted.update({f"figure:{name}": None for name in page.figures})
    components = set(page.resolve(wanted))
    return [component for component in page.outputs() if component in components]


def as_sent(components: list, values: list) -> list:
    """``values`` (one per component, in order) as Gradio sends them: each component's own postprocess,
    called here, in the handler's worker thread, for an event wired with ``SENT_AS_IS``. A stateful
    component (``gr.State``) keeps its value: Gradio stores it in the session, not in the update."""
    sent = []
    for component, value in zip(components, values, strict=True):
        if not component.stateful:
            value = component.postprocess(value)
            value = value.model_dump() if isinstance(value, (GradioModel, GradioRootModel)) else value
        sent.append(value)
    return sent


def resolved(page: Page, handler, said_in: str = "status"):
    """A handler that returns roles, as one that returns components. An unexpected error is said in
    the status line (or the role ``said_in``, one of the event's outputs) and nowhere else (an error
    raised to Gradio would mark every output)."""

    def run(*args):
        try:
            return page.resolve(handler(*args)) or {page[said_in]: gr.skip()}  # an empty dict would be read as a value
        except Exception as error:  # noqa: BLE001 (shown to the learner; the page keeps what it showed)
            LOG.exception("page event %s failed", handler.__name__)
            return page.resolve({said_in: present.refused_status(f"the page could not do that ({type(error).__name__}: "
                                                                 f"{error})")})

    run.__name__ = handler.__name__
    return run
