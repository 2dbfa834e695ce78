"""The kvviz lab in the browser: ``build_demo`` puts the page together (``kvviz.app.page``).

The page runs one query through several handoffs side by side, streams each answer, marks each
answer against the expected one, and plots what happened inside. Everything about a handoff (its
column, colour, explanation, options, plot, walk-through step, sweep) comes from its descriptor in
``kvviz.handoffs.registry`` and its page entry (``kvviz.app.methods``): the page names no handoff.
What a run showed is read once into a reading (``kvviz.app.reading``) that every card, the strip,
the status line, the lessons and the walk-through render. Its pieces (``kvviz.app.page``): ``spec``
(what it shows), ``steps`` and ``links`` (the walk-through, the page's state in a link), ``named``,
``widgets`` and ``layout`` (the components, by name), ``views`` and ``tabs`` (values and figures for a
run's reading), ``run`` (a live run as updates by role), ``lab`` (what the handlers share), and the
wiring: ``events``, ``running`` (the run and ``/run``), ``recording`` (what a tab records when it opens),
``walk``, ``comparing``; ``theme``.

Serving rules kept here:
* models load once per process (``kvviz.runtime.models.load_model`` caches them); per-user data lives only
  in ``gr.State`` and event arguments, never in module globals (the stop flags are keyed by the
  browser session);
* the live runs (Run live, Swap the fact, ``/run``) go to the engine's shared runs
  (``kvviz.engine.shared_runs``, ``concurrency_id="runs"``): identical greedy runs are computed once,
  and ``kvviz.core.policy.model_concurrency()`` runs at a time (``KVVIZ_CONCURRENCY``; the defaults
  were measured) use the models while the others wait in order, each told its place and an
  estimate; at most ``policy.caps().queue_size`` wait, and one more is refused in one line. The
  sweep keeps its own queue (``concurrency_id="models"``) and takes the same models' slot;
* in public mode (``kvviz.core.policy``) the pair box offers registered pairs only and the sliders stop
  at the public caps; every limit is checked again on the server (``kvviz.core.limits``), so the API
  gets the same refusals as the page;
* the API keeps ``/run`` (inputs: ``kvviz.app.page.spec.run_parameter_names``; outputs:
  ``kvviz.app.page.running.api_outputs``, the last one the structured results), ``/sweep``, ``/stop``,
  ``/export``, ``/pair_facts`` and ``/load_preset``; the page's own events are private;
* user text (query, context, expected answer, answers, prompts) only ever goes into text boxes or
  escaped markdown and HTML: it is shown as text, never run as HTML;
* the queue looks for new events every ``QUEUE_POLL_SECONDS`` (Gradio's own 1 ms on Linux wakes the
  event loop a thousand times a second, busy or idle).
"""

from __future__ import annotations

from typing import Callable, Iterator

import gradio as gr

from kvviz.app import compare
from kvviz.app.page import views
from kvviz.app.page.events import wire_all
from kvviz.app.page.lab import Lab
from kvviz.app.page.layout import (
    build_ask,
    build_cards,
    build_columns,
    build_sidebar,
    build_tabs,
    build_top,
    build_walk,
)
from kvviz.app.page.named import Page
from kvviz.app.page.run import StopFlags
from kvviz.app.page.spec import (  # noqa: F401 (the page's facts, for tests and scripts)
    DEFAULT_TAB,
    FIXED_PLOTS,
    MAX_UI_NEW_TOKENS,
    MODEL_QUEUE,
    PageOption,
    build_request,
    column_names,
    default_columns,
    expected_text,
    option_values,
    page_options,
    plot_names,
    preset_columns,
    run_parameter_names,
    setup_html,
)
from kvviz.app.page.steps import walkthrough_steps  # noqa: F401 (the walk-through, for tests and scripts)
from kvviz.app.page.tabs import FigureCache
from kvviz.app.page.theme import launch_kwargs  # noqa: F401
from kvviz.app.presets import DEFAULT_PRESET, load_precomputed, load_precomputed_sweep, preset
from kvviz.core import policy
from kvviz.engine.shared_runs import SharedRuns
from kvviz.engine.stream import default_workers

# How often Gradio's queue looks for a new event, and for progress to send, while it has none (its
# defaults on Linux: 1 ms and 10 ms). At 1 ms a server with no request takes 4% of a core (0.44 CPU-s in
# 10 s; 0.14 at these), which a 2-core machine shares with everything else; a /run's own time and CPU
# did not change measurably (docs/SPEED.md 13.7). A new event now waits at most 10 ms.
QUEUE_POLL_SECONDS = 0.01
PROGRESS_POLL_SECONDS = 0.05


def initial_values(presets: views.PresetRuns) -> tuple[dict, dict, list[str]]:
    """The opening preset as the page first shows it: values by role (its reading among them), its
    payload, its columns. No figure: the tab in view draws its figures once the page has loaded
    (``events.wire_load``)."""
    first = preset(DEFAULT_PRESET)
    payload, status, reading = presets(DEFAULT_PRESET)
    shown = preset_columns(first)
    values = {"presets": DEFAULT_PRESET, "query": first.query, "context": first.context or "",
              "expected": expected_text(first.answers), "status": status, "lesson": views.lesson_of(reading, presets),
              "reading": reading, "setup": setup_html(first.context, payload["pair"]), **views.swap_fields(first)}
    values.update(views.cards(reading, shown))
    return values, payload, shown


def build_demo(
    precomputed: dict | None = None,
    sweep: dict | None = None,
    default_pair: str = "embedded",
    default_max_new_tokens: int = 32,
    compute: Callable[..., Iterator[list]] | None = None,
) -> gr.Blocks:
    """Build the Blocks app. ``precomputed``/``sweep`` default to the files in assets/;
    ``default_max_new_tokens`` sets the slider's start value (tests use a small one); ``compute``
    computes a live run, called as ``kvviz.engine.stream.run`` is (default: that, in this process;
    ``app.py`` gives ``kvviz.engine.run_processes.RunProcesses.run``)."""
    precomputed = load_precomputed() if precomputed is None else precomputed
    sweep = load_precomputed_sweep() if sweep is None else sweep
    lab = Lab(Page(initial={}, specs=page_options()), precomputed, default_pair, default_workers(),
              policy.model_concurrency(), walkthrough_steps(), FigureCache(sweep), StopFlags(),
              runs=SharedRuns() if compute is None else SharedRuns(compute=compute))
    values, payload, shown = initial_values(lab.presets)
    page = lab.page
    page.initial.update(values)
    with gr.Blocks(title="kvviz: watch two language models talk") as demo:
        page.demo = demo
        demo.kvviz_page = page  # the components by name, for tests and scripts
        page.add("results", gr.State(payload))
        # the results, read once (kvviz.app.reading); given as a function: Gradio turns an initial value that
        # is a dataclass into a dict (dataclasses.asdict, 1 s for a preset's run) whenever the state is set
        opening = values["reading"]
        page.add("reading", gr.State(lambda: opening))
        page.add("view", gr.State({"tab": DEFAULT_TAB, "compact": False, "drawn": {}, "ready": False}))
        page.add("walk_step", gr.State(0))
        page.add("finished_run", gr.State(None))  # a live run's results, from its stream to the tabs that draw them
        page.add("recorded", gr.State(None))  # the results with what a tab recorded when it opened (kvviz.app.page.recording)
        # this session's last runs (Compare two), up to a few MB: dropped an hour after its last change
        page.add("history", gr.State(compare.remember([], values["reading"]), time_to_live=compare.HISTORY_SECONDS))
        page.add("viewport", gr.Number(0, visible=False))
        build_sidebar(page, default_pair, default_max_new_tokens)
        build_top(page)
        build_walk(page, lab.steps)
        build_ask(page)
        build_columns(page, shown)
        build_cards(page, shown)
        build_tabs(page, shown, sweep)
        wire_all(lab)
    # light events (presets, tabs, facts, export, walk-through) run side by side; model runs share one queue
    demo.queue(max_size=policy.caps().queue_size, default_concurrency_limit=4)
    demo._queue.sleep_when_free = QUEUE_POLL_SECONDS
    demo._queue.progress_update_sleep_when_free = PROGRESS_POLL_SECONDS
    return demo
