"""The page's events, one ``wire_*`` function per concern. Handlers compute ``{role: value}``
updates (``kvviz.app.page.views``, ``kvviz.app.page.run``) and ``Page.resolve`` turns them into component
updates, so no handler depends on the order of a list of outputs.

Rules kept here (see ``kvviz.app.ui``): every model-running event shares one queue; user selections
use ``.input`` (a value the page sets itself never re-triggers a handler); the page's own events
are private to the API, which keeps ``/run``, ``/sweep``, ``/stop``, ``/export``, ``/pair_facts``
and ``/load_preset``.
"""

from __future__ import annotations

import inspect
import json
import logging
import tempfile
import threading
from dataclasses import dataclass, field

import gradio as gr

from kvviz.app import compare, plots, present, tokenview
from kvviz.app.methods import registry as methods
from kvviz.app.page import saved, spec, views
from kvviz.app.page.layout import Page, walk_markdown
from kvviz.app.page.run import LiveRun, StopFlags, stream_run
from kvviz.app.presets import preset
from kvviz.app.sweep import page_sweep
from kvviz.core import policy
from kvviz.engine import stream
from kvviz.engine.shared_runs import SharedRuns
from kvviz.runtime.models import resolve_pair

PRIVATE = dict(api_visibility="private", show_progress="hidden")
LOG = logging.getLogger("kvviz.app.page")


@dataclass
class Lab:
    """What the handlers share: the page, the precomputed results and their figures, the stop flags."""

    page: Page
    precomputed: dict
    default_pair: str
    workers: int
    concurrency: int
    steps: list[spec.WalkStep]
    cache: views.FigureCache
    flags: StopFlags
    # the events after which the page may show other results (a preset, a live run, a link): Compare
    # two remembers the results after each (``wire_compare``; a change listener on the results would
    # make Gradio hash them before and after every streamed update)
    result_events: list = field(default_factory=list)
    # the server's live runs: identical greedy runs computed once, the models' queue (kvviz.engine.shared_runs)
    runs: SharedRuns = field(default_factory=SharedRuns)

    def preset_view(self, key: str, view: dict) -> dict:
        """Everything a preset changes: the form, the ticks, the cards, the strip, the lesson, the
        status, the results, and the figures of the tab in view."""
        picked = preset(key)
        payload, status = views.precomputed_payload(self.precomputed, key, self.default_pair)
        names = spec.preset_columns(picked)
        updates = {"presets": key, "query": picked.query, "context": picked.context or "",
                   "expected": spec.expected_text(picked.answers), "chosen": names, "shown": names, "status": status,
                   "lesson": views.lesson_of(payload), "results": payload, **views.swap_fields(picked)}
        updates.update(views.cards_and_verdict(payload, names, list(picked.answers), picked.subject))
        figures, view = views.tab_updates(view.get("tab", spec.DEFAULT_TAB), payload, names, view, self.cache)
        return {**updates, **figures, "view": view}

    def live_run(self, pair: str, request, names: list[str], expected: str | None, key: str | None) -> LiveRun:
        """A live run of ``names``; on a preset's question, at its precomputed settings, each column's
        time alone (its precomputed run's) goes beside its time in the shared run."""
        entry = (self.precomputed.get("presets") or {}).get(key) if key else None
        if entry is not None and not views.same_request(entry, request.to_dict()):
            entry = None
        alone = {r["handoff"]: float(r["timings"]["total"]) for r in (entry or {}).get("results", [])
                 if r.get("applicable", True) and (r.get("timings") or {}).get("total") is not None}
        subject = preset(key).subject if key else "The expected answer"
        return LiveRun(pair, request, names, spec.expected_answers(expected), subject, key,
                       alone={name: alone[name] for name in names if name in alone})

    def tab_view(self, tab: str, payload: dict, names: list[str], view: dict) -> dict:
        figures, view = views.tab_updates(tab, payload, names, view, self.cache)
        return {**figures, "view": view, "tab": tab}


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


# --- load, presets, ticks, expected answer, tabs --------------------------------------------------


def wire_load(lab: Lab) -> None:
    """On load: the viewport's width (a phone gets compact figures), then the tab in view's figures.
    Until then tab selections draw nothing (the view is not ready)."""
    page = lab.page

    def on_load(width, payload, names, view, params):
        view = {**view, "compact": bool(width) and float(width) <= 640, "drawn": {}, "ready": True}
        link = spec.permalink_state(page.specs, params or {})
        updates: dict = {}
        if link:
            updates, payload, names, view = restored(lab, link, payload, names, view)
        kept = saved.saved_results(params or {})
        if kept:  # a saved run (/r/<id>): its own results, not the preset's
            payload = kept[1]
            answers = spec.expected_answers(updates.get("expected", page.value("expected")))
            updates.update(saved.restored_run(kept[0], payload, names, answers))
        tab = link.get("tab") if link.get("tab") in dict(spec.TABS) else view.get("tab", spec.DEFAULT_TAB)
        return {**updates, **lab.tab_view(tab, payload, names, view)}

    def load_with_link(width, payload, names, view, request: gr.Request):
        params = dict(request.query_params) if request is not None else {}
        return resolved(page, on_load)(width, payload, names, view, params)

    # a permalink may set the handoffs' options too: only this event writes their widgets
    loaded = page.demo.load(load_with_link, inputs=[page["viewport"], page["results"], page["chosen"], page["view"]],
                            outputs=page.outputs() + list(page.option_inputs),
                            js="(width, ...rest) => [window.innerWidth, ...rest]", api_name="on_load", **PRIVATE)
    lab.result_events.append(loaded)


def restored(lab: Lab, link: dict, payload: dict, names: list[str], view: dict) -> tuple[dict, dict, list[str], dict]:
    """What a permalink's state (``spec.permalink_state``) changes on the page just loaded: a preset's
    question and precomputed results (painted without a model), else its question and context for
    a live run; then the columns, expected answer, pair, settings, options, tab and token column.
    Returns (updates, payload, names, view)."""
    page = lab.page
    updates: dict = {}
    key = link.get("preset")
    query, context = link.get("q"), link.get("c")
    if key and query is None and context is None:
        query, context = preset(key).query, preset(key).context or ""
    match = views.preset_matching(query, context) if query is not None else None
    if match:
        updates = lab.preset_view(match, view)
        payload, names, view = updates["results"], updates["chosen"], updates.pop("view")
    elif query is not None:
        updates = {"query": query, "context": context or "", "presets": None,
                   "status": "Opened from a link: press **Run live** to run this question (the greyed answers below "
                             "are the opening preset's)."}
    if "h" in link:
        names = link["h"]
        answers = spec.expected_answers(link.get("expected", updates.get("expected", page.value("expected"))))
        updates.update({"chosen": names, "shown": names, **views.verdict(payload, names, answers, views.subject_of(payload))})
    if "expected" in link:
        updates["expected"] = link["expected"]
    if "pair" in link:
        updates.update({"pair": link["pair"], "facts": present.pair_facts_markdown(link["pair"])})
    for name in ("max_new_tokens", "sample", "temperature", "seed"):
        if name in link:
            updates[name] = link[name]
    for index, value in (link.get("options") or {}).items():
        updates[f"option:{index}"] = value
    if link.get("column"):
        view = {**view, "tokens_column": link["column"]}
    if query is not None and not match:  # a typed question: the opening preset's cards do not answer it
        updates.update(views.stale_view(payload, updates.get("pair", lab.default_pair)))
    return updates, payload, names, view


def wire_permalink(lab: Lab) -> None:
    """"Copy link": the page's state as a URL (pair, preset or question and context, columns,
    expected answer, settings, options, tab, token column), put in the address bar and copied."""
    page = lab.page
    inputs = [page["pair"], page["presets"], page["query"], page["context"], page["chosen"], page["expected"],
              page["view"], *page.settings_inputs]

    def make_link(pair, key, query, context, chosen, expected, view, *settings):
        max_new_tokens, sample, temperature, seed = settings[:4]
        state = {"pair": pair, "preset": key, "q": query, "c": context, "h": chosen or [], "expected": expected,
                 "max_new_tokens": max_new_tokens, "sample": sample, "temperature": temperature, "seed": seed,
                 "tab": (view or {}).get("tab"), "column": (view or {}).get("tokens_column"), "options": list(settings[4:])}
        return {"link": spec.permalink_query(page.specs, state),
                "status": "Link to this page's state copied (it is in the address bar too)."}

    page["copy_link"].click(resolved(page, make_link), inputs=inputs, outputs=page.outputs(), api_name="copy_link",
                            **PRIVATE).then(None, inputs=[page["link"]], js=COPY_LINK_JS)

    def save_run(results, *values):  # Save run: the same state, kept with the results under a short id
        return saved.save(results, make_link(*values)["link"], values[2] or "kvviz run")

    page["save_run"].click(resolved(page, save_run), inputs=[page["results"], *inputs], outputs=page.outputs(),
                           api_name="save_run", **PRIVATE).then(None, inputs=[page["saved_link"]], js=saved.COPY_SAVED_JS)


COPY_LINK_JS = """
(link) => {
  const url = location.origin + location.pathname + '?' + link;
  history.replaceState(null, '', url);
  if (navigator.clipboard) navigator.clipboard.writeText(url).catch(() => {});
  return [];
}
"""


def wire_presets(lab: Lab) -> None:
    page = lab.page
    chosen = page["presets"].input(resolved(page, lab.preset_view), inputs=[page["presets"], page["view"]],
                                   outputs=page.outputs(), api_name="choose_preset", **PRIVATE)
    lab.result_events.append(chosen)

    def load_preset(key: str) -> dict:
        """A preset's question and its precomputed results: ``{"query", "context", "expected",
        "results"}`` (the payload the page shows, as the ``/run`` endpoint's JSON)."""
        picked = preset(key)
        payload, _ = views.precomputed_payload(lab.precomputed, key, lab.default_pair)
        return {"query": picked.query, "context": picked.context or "", "expected": list(picked.answers),
                "lesson": picked.lesson, "results": json.loads(json.dumps(payload))}

    gr.api(load_preset, api_name="load_preset")


def wire_ticks_and_expected(lab: Lab) -> None:
    """Ticking a column shows its card, details and figure; typing an expected answer re-marks;
    typing a question or note, or choosing another pair, greys the cards that do not answer it
    (``views.question_view``) and ungreys them when the page asks their question again."""
    page = lab.page
    asked = [page["query"], page["context"], page["pair"]]

    def on_ticks(names, payload, expected, view, query, context, pair):
        names = [name for name in spec.column_names() if name in (names or [])]
        updates = {"shown": names, **views.question_view(payload, query, context, pair, names, spec.expected_answers(expected))}
        return {**updates, **lab.tab_view(view.get("tab", spec.DEFAULT_TAB), payload, names, view)}

    page["chosen"].input(resolved(page, on_ticks), inputs=[page["chosen"], page["results"], page["expected"], page["view"],
                                                            *asked],
                         outputs=page.outputs(), api_name="show_handoffs", **PRIVATE)

    def on_expected(expected, payload, names, query, context, pair):
        return views.question_view(payload, query, context, pair, names or [], spec.expected_answers(expected))

    page["expected"].input(resolved(page, on_expected), inputs=[page["expected"], page["results"], page["chosen"], *asked],
                           outputs=page.outputs(), api_name="mark", trigger_mode="always_last", **PRIVATE)

    def on_question(query, context, pair, payload, names, expected):
        return views.question_view(payload, query, context, pair, names or [], spec.expected_answers(expected))

    for role in ("query", "context", "pair"):
        page[role].input(resolved(page, on_question), inputs=[*asked, page["results"], page["chosen"], page["expected"]],
                         outputs=page.outputs(), api_name=f"ask_{role}", trigger_mode="always_last", **PRIVATE)


def wire_tabs(lab: Lab) -> None:
    """A tab draws its figures when opened, and only those whose content changed; the Data tab's
    structured results are drawn when their box opens (and while it is open)."""
    page = lab.page
    for tab_id, tab in page.tabs.items():
        def on_select(payload, names, view, tab_id=tab_id):
            if not view.get("ready"):  # Gradio selects the first tab as the page mounts: the load draws it
                return {}
            updates = lab.tab_view(tab_id, payload, names or [], view)
            updates.pop("tab")  # the learner selected it already
            return updates

        tab.select(resolved(page, on_select), inputs=[page["results"], page["chosen"], page["view"]],
                   outputs=page.outputs(), api_name=f"open_{tab_id}", **PRIVATE)

    def on_json_open(payload, view):
        updates, view = views.json_updates_for(payload, {**view, "json_open": True})
        return {**updates, "view": view}

    def on_json_close(view):
        return {"view": {**view, "json_open": False}}

    page["json_box"].expand(resolved(page, on_json_open), inputs=[page["results"], page["view"]],
                            outputs=[page["json"], page["view"], page["status"]], api_name="open_json", **PRIVATE)
    page["json_box"].collapse(resolved(page, on_json_close), inputs=[page["view"]], outputs=[page["view"], page["status"]],
                              api_name="close_json", **PRIVATE)


# --- going to something: the lesson's "Show me" and the walk-through ------------------------------

# Scroll an element into view and outline it for two seconds, waiting for a tab to render it.
HIGHLIGHT_JS = """
(target) => {
  let tries = 0;
  const go = () => {
    const el = document.getElementById(target);
    if (!el || !el.offsetParent) { if (tries++ < 30) setTimeout(go, 100); return; }
    el.scrollIntoView({behavior: 'smooth', block: 'center'});
    el.classList.add('kv-highlight');
    setTimeout(() => el.classList.remove('kv-highlight'), 2000);
  };
  setTimeout(go, 50);
}
"""


# The first plot drawn in the open tab, once the tab has rendered it.
FIRST_PLOT_JS = f"""() => {{
  let tries = 0;
  const find = () => {{
    const plot = [...document.querySelectorAll('#kv-inside [id^=kv-plot-]')].find(e => e.offsetParent);
    if (!plot) {{ if (tries++ < 30) setTimeout(find, 100); return; }}
    ({HIGHLIGHT_JS})(plot.id);
  }};
  find();
}}"""


# The walk-through's scroll: the target's top just under the sticky verdict strip, so that it sits in
# the room above the docked walk-through panel (theme: #kv-walk) and text, Next and target share a screen.
WALK_TARGET_JS = """
(target) => {
  let tries = 0;
  const go = () => {
    const el = document.getElementById(target);
    if (!el || !el.offsetParent) { if (tries++ < 30) setTimeout(go, 100); return; }
    document.body.style.paddingBottom = '70vh';  // room to scroll a target near the page's end above the panel
    const strip = document.getElementById('kv-verdict');
    const stuck = strip && getComputedStyle(strip).position === 'sticky' ? strip.getBoundingClientRect().height : 0;
    const panel = document.getElementById('kv-walk');
    const room = window.innerHeight - stuck - (panel ? panel.getBoundingClientRect().height + 24 : 0);
    const r = el.getBoundingClientRect();
    // a target taller than the room starts at its top; a shorter one is centred in the room
    const offset = stuck + 8 + Math.max(0, (room - r.height) / 2);
    window.scrollTo({top: window.scrollY + r.top - offset, behavior: 'instant'});
    el.classList.add('kv-highlight');
    setTimeout(() => el.classList.remove('kv-highlight'), 2000);
  };
  setTimeout(go, 50);
}
"""


def highlight_js(targets: list[str]) -> str:
    """JS that outlines the target of the step shown in the walk-through panel ("Step i of n")."""
    return f"""() => {{
  const text = (document.getElementById('kv-walk-text') || {{}}).innerText || '';
  const step = parseInt((text.match(/Step (\\d+) of/) || [0, 1])[1]) - 1;
  const panel = document.getElementById('kv-walk');
  if (panel) panel.scrollTop = 0;  // a new step is read from its first line
  ({WALK_TARGET_JS})({json.dumps(targets)}[step]);
}}"""


def wire_lesson(lab: Lab) -> None:
    page = lab.page

    def show_lesson(payload, names, view):
        key = (payload or {}).get("preset")
        tab = (preset(key).tab if key else None) or spec.DEFAULT_TAB
        return lab.tab_view(tab, payload, names or [], view)

    page["lesson_show"].click(resolved(page, show_lesson), inputs=[page["results"], page["chosen"], page["view"]],
                              outputs=page.outputs(), api_name="show_lesson", **PRIVATE).then(None, js=FIRST_PLOT_JS)


def wire_walkthrough(lab: Lab) -> None:
    page, steps = lab.page, lab.steps

    def walk(index, view, payload, names):
        index = max(0, min(len(steps) - 1, int(index or 0)))
        step = steps[index]
        updates = {"walk_step": index, "walk_text": walk_markdown(steps, index), "walk": gr.update(visible=True),
                   **prediction_updates(step)}
        if step.preset:
            updates.update(lab.preset_view(step.preset, view))
            payload, names, view = updates["results"], updates["chosen"], updates["view"]
        if step.tab:
            updates.update(lab.tab_view(step.tab, payload, names, view))
        return updates

    inputs = [page["walk_step"], page["view"], page["results"], page["chosen"]]
    moves = (("walk_open", lambda i: 0, "walkthrough_open"), ("walk_next", lambda i: i + 1, "walkthrough_next"),
             ("walk_back", lambda i: i - 1, "walkthrough_back"))
    for role, move, name in moves:
        def handler(index, view, payload, names, move=move):
            return walk(move(int(index or 0)), view, payload, names)

        handler.__name__ = name
        step = page[role].click(resolved(page, handler), inputs=inputs, outputs=page.outputs(), api_name=name, **PRIVATE)
        lab.result_events.append(step)
        step.then(
            None, js=highlight_js([step.target for step in steps]))
    def guess(choice, index):
        """The learner's pick on a predict step: the veil goes, the step's preset's stored run says
        which was right (whatever the page shows meanwhile)."""
        step = steps[max(0, min(len(steps) - 1, int(index or 0)))]
        if step.predict is None or choice is None or not step.preset:
            return {}
        stored, _ = views.precomputed_payload(lab.precomputed, step.preset, lab.default_pair)
        right, said = spec.prediction_outcome(step.predict, stored, preset(step.preset).answers)
        choices = spec.prediction_choices(step.predict)
        if right is None:
            verdict = "These results cannot say."
        else:
            verdict = "**Right.**" if choices.index(choice) == right else f"**Not this time:** the answer is {choices[right]}."
        reveal = f"{verdict} In this preset's stored run, {said}" + (f" {step.reveal}" if step.reveal else "")
        return {"walk_reveal": reveal, "walk_veil": ""}

    page["walk_guess"].input(resolved(page, guess), inputs=[page["walk_guess"], page["walk_step"]],
                             outputs=[page["walk_reveal"], page["walk_veil"], page["status"]], api_name="walkthrough_guess",
                             **PRIVATE)
    page["walk_close"].click(lambda: (gr.update(visible=False), ""), outputs=[page["walk"], page["walk_veil"]],
                             api_name="walkthrough_close", **PRIVATE).then(
        None, js="() => { document.body.style.paddingBottom = ''; }")


def prediction_updates(step: spec.WalkStep) -> dict:
    """A step's prediction widgets: its choices (none picked) and the veil, or both gone."""
    if step.predict is None:
        return {"walk_guess": gr.update(visible=False, value=None), "walk_reveal": "", "walk_veil": ""}
    return {"walk_guess": gr.update(choices=list(spec.prediction_choices(step.predict)), value=None, visible=True,
                                    label=step.predict.question),
            "walk_reveal": "", "walk_veil": spec.prediction_veil_css(step.predict)}


# --- the run: busy, stop, stream; and the /run API ------------------------------------------------


def request_from_form(lab: Lab, pair, query, context, settings: list, ticked, expected: str | None = None):
    """(request, names) from the form's values, or a ValueError saying what is wrong. The run
    records what crossed (``kvviz.runtime.crossed``; the first expected answer is the logit lens's gold)
    unless ``KVVIZ_RECORD_CROSSED=0``."""
    max_new_tokens, sample, temperature, seed = settings[:4]
    names = [name for name in spec.column_names() if name in (ticked or [])]
    options = spec.option_values(lab.page.specs, list(settings[4:]))
    golds = spec.expected_answers(expected)
    inspect = {"gold": golds[0] if golds else None} if spec.record_crossed() else None
    request = spec.build_request(query, context, max_new_tokens, sample, temperature, seed, options, inspect)
    resolve_pair(pair)
    if not names:
        raise ValueError("Tick at least one handoff to run.")
    return request, names


def wire_run(lab: Lab) -> None:
    """Run live and Swap the fact: each streams into the cards and the status line, then shows its
    results in the tabs; both wait in the models' queue and stop on Stop."""
    page = lab.page
    form = [page["pair"], page["query"], page["context"], *page.settings_inputs, page["chosen"]]
    asked = [page["pair"], page["query"], page["context"], page["expected"], page["chosen"]]
    streamed = page_stream_roles()
    streamed_components = page_stream_outputs(page)

    def streamed_to_page(updates, rest: tuple):
        """Each ``{role: value}`` update as the stream's outputs: what it sets, else what the output
        shows now (``rest``: the settings, then the streamed outputs' current values)."""
        shown = dict(zip(streamed, rest[len(page.settings_inputs):]))

        def every_output(update: dict) -> list:
            shown.update({role: value for role, value in update.items() if role in shown})
            return [shown[role] for role in streamed] + [update.get("results", gr.skip())]

        try:
            for update in updates:
                yield every_output(update)
        except Exception as error:  # noqa: BLE001 (said in the status line; an error raised would mark every output)
            LOG.exception("the page's run failed")
            yield every_output({"status": present.refused_status(f"the run failed ({type(error).__name__}: {error})")})

    def run_on_page(pair, query, context, expected, ticked, request: gr.Request, *rest):
        settings = rest[: len(page.settings_inputs)]
        yield from streamed_to_page(run_updates(lab, pair, query, context, expected, ticked, settings,
                                                request.session_hash), rest)

    def swap_on_page(pair, query, context, expected, ticked, replace, by, swapped_answer, payload, request: gr.Request,
                     *rest):
        settings = rest[: len(page.settings_inputs)]
        yield from streamed_to_page(swap_updates(lab, pair, query, context, expected, ticked, (replace, by, swapped_answer),
                                                 payload, settings, request.session_hash), rest)

    def show_finished_run(payload, view, names):
        """After the stream: the run's results on the page, and the tab in view drawn from them."""
        if payload is None:  # refused or failed: the status line said why
            return {}
        update = {**lab.tab_view(view.get("tab", spec.DEFAULT_TAB), payload, names, view), "results": payload,
                  "finished_run": None, "lesson": views.lesson_of(payload)}
        update.pop("tab")
        return update

    def begin(request: gr.Request):
        lab.flags.begin(request.session_hash)
        return page.resolve({"run_button": True})

    def finish(request: gr.Request):
        lab.flags.end(request.session_hash)
        return page.resolve({"run_button": False})

    swap_fields = [page["swap_replace"], page["swap_by"], page["swap_answer"], page["results"]]
    for button, handler, inputs, name in ((page["run_button"], run_on_page, asked, "run"),
                                          (page["swap_button"], swap_on_page, asked + swap_fields, "swap")):
        live = button.click(begin, outputs=[page["run_button"]], queue=False, api_name=f"begin_{name}", **PRIVATE).then(
            handler, inputs=[*inputs, *page.settings_inputs, *streamed_components],
            outputs=[*streamed_components, page["finished_run"]], api_name=f"{name}_on_page",
            concurrency_id=spec.RUN_QUEUE, concurrency_limit=policy.PAGE_RUNS_AT_ONCE, **PRIVATE)
        shown = live.then(resolved(page, show_finished_run), inputs=[page["finished_run"], page["view"], page["chosen"]],
                          outputs=finished_run_outputs(page), api_name=f"show_finished_{name}", **PRIVATE)
        shown.then(finish, outputs=[page["run_button"]], queue=False, api_name=f"end_{name}", **PRIVATE)
        lab.result_events.append(shown)

    def stop_run(request: gr.Request):
        lab.flags.stop(request.session_hash)

    sweep_event = wire_sweep(lab)
    page["stop_button"].click(stop_run, api_name="stop", queue=False,
                              cancels=[sweep_event] if sweep_event is not None else None)
    wire_run_api(lab, form)


def run_updates(lab: Lab, pair, query, context, expected, ticked, settings, session):
    """Run live: the ticked columns on the form's question, as ``{role: value}`` updates."""
    stop = lab.flags.current(session)
    try:
        handoff_request, names = request_from_form(lab, pair, query, context, settings, ticked, expected)
    except ValueError as error:  # one message, in the status line; nothing else changes
        yield {"status": present.refused_status(str(error))}
        return
    run = lab.live_run(pair, handoff_request, names, expected, views.preset_matching(query, context))
    for update in stream_run(run, lab.workers, stop, batches=lab.runs.batches):
        update.pop("error", None)
        yield update


def swap_updates(lab: Lab, pair, query, context, expected, ticked, fields, payload, settings, session):
    """Swap the fact: the ticked columns on the swapped note, beside their answers on the note.
    A preset's stored swap is shown as it is; else the swapped note runs live (and the note too,
    for the columns whose answers on it are not on the page for these settings)."""
    stop = lab.flags.current(session)
    try:
        swap = spec.swap_from_form(context, *fields)
        handoff_request, names = request_from_form(lab, pair, query, context, settings, ticked, expected)
    except ValueError as error:
        yield {"status": present.refused_status(str(error))}
        return
    answers, key = spec.expected_answers(expected), views.preset_matching(query, context)
    subject = preset(key).subject if key else "The expected answer"
    if views.holds_swap(payload, names, swap):
        yield views.swap_view({**payload, "swap_shown": True}, names, answers, subject)
        return
    held = views.results_by_name(payload) if views.same_request(payload, handoff_request.to_dict()) else {}
    originals = {name: held[name] for name in names if name in held}
    missing = [name for name in names if name not in originals]
    for request, columns, found, label in ((handoff_request, missing, originals, "the note"),
                                           (stream.swapped_request(handoff_request, swap), names, None, "the swapped note")):
        if not columns:
            continue
        run = lab.live_run(pair, request, columns, expected if found is not None else spec.expected_text(swap.answers), key)
        for update in stream_run(run, lab.workers, stop, batches=lab.runs.batches):
            update.pop("error", None)
            ended = update.pop("results", None)
            if found is None:  # the swapped note's answers stay off the cards until they are all in
                update = {"status": f"**Swap the fact**, on {label}: " + update.get("status", "")} if "status" in update else {}
            yield update
        if stop.is_set() or ended is None:
            return
        if found is not None:
            found.update(run.results)
        else:
            swapped = run.results
    base = {**(payload or {}), "pair": pair, "request": handoff_request.to_dict(), "preset": key}
    yield views.swap_view(views.with_swap(base, originals, swapped, names, swap, answers), names, answers, subject)


# What a live run streams on the page (``run_on_page``): the status, the strip, and every column's
# card and details. The run reads what each of them shows and gives every one a value in every
# update: an output an update leaves as it was costs Gradio a fresh component (~0.5 ms each, in the
# event loop that shares the interpreter with the models). What the tabs draw from the results
# comes once, after the stream (``show_finished_run``).
CARD_PARTS = ("head", "answer", "stats", "notes", "seen")
# what ``show_finished_run`` may change: the results, what any tab draws (``views.tab_updates``), and
# the status line (where it says what failed, if drawing does)
FINISHED_RUN_ROLES = ("status", "results", "view", "finished_run", "lesson", "sweep_plot", "tokens_column", "tokens",
                      "how", "table", "json")


def page_stream_roles() -> list[str]:
    return ["status", "verdict"] + [f"{part}:{name}" for name in spec.column_names() for part in CARD_PARTS]


def page_stream_outputs(page: Page) -> list:
    """The components of ``page_stream_roles``, in that order."""
    return list(page.resolve(dict.fromkeys(page_stream_roles(), "")))


def finished_run_outputs(page: Page) -> list:
    """``show_finished_run``'s outputs, in page order: the results, the lesson, every figure and what
    a tab draws; not the whole page (each output it leaves as it was costs a fresh component)."""
    roles: dict = {role: None for role in FINISHED_RUN_ROLES}
    roles.update({"lesson": "", "tokens_column": {"choices": [], "value": None}})
    roles.update({f"figure:{name}": None for name in page.figures})
    wanted = set(page.resolve(roles))
    return [component for component in page.outputs() if component in wanted]


def api_outputs(page: Page) -> list:
    """The ``/run`` endpoint's outputs, in order: the status; per page column its answer, its stats
    and what each model saw; every figure (``spec.plot_names``); the results table and JSON."""
    columns = [c for name in spec.column_names()
               for c in (page.cards[name].answer, page.cards[name].stats, page.details[name].seen)]
    figures = [page.figures[name] for name in spec.plot_names()]
    return [page["status"], *columns, *figures, page["table"], page["json"], page["results"]]


def wire_run_api(lab: Lab, form: list) -> None:
    """``/run`` for scripts: the form's values in, every output out; a refused request raises
    (``gradio_client`` hears the message as an ``AppError``)."""
    page, outputs = lab.page, api_outputs(lab.page)

    def run(pair, query, context, *rest):
        """Run the ticked handoffs live and stream the answers; the last update holds the
        structured results (the JSON output: pair, request, one result per handoff; with
        ``attention``, each result's per-token attention arrays too, about 2 MB a run, else their
        shapes). Each update before it holds every output: the status and the answers so far, and
        None for an output the run has not set yet (the table: an empty one)
        (``kvviz.app.page.run.stream_run``: at most every ``STREAM_INTERVAL`` seconds, and when a
        handoff starts or finishes)."""
        *settings, ticked, attention = rest
        try:
            request, names = request_from_form(lab, pair, query, context, settings, ticked if ticked is not None else spec.default_columns())
        except ValueError as error:
            raise gr.Error(str(error)) from error
        live = LiveRun(pair, request, names, [], "The answer")
        streamed = {output: None for output in outputs}  # what each output holds so far (None: nothing yet)
        drawn: dict = {}  # each finished handoff's own figure, drawn while the others still run
        for update in stream_run(live, lab.workers, threading.Event(), batches=lab.runs.batches):  # stops when its client leaves
            if update.get("error"):
                raise gr.Error(f"The run failed: {update['error']}")
            for name in plots.layer_figure_handoffs(set(live.results) - set(drawn)):
                drawn[name] = lab.cache.drawn_once((live.stamp, name, (), False),
                                                   lambda name=name: plots.own_figure(name, live.results[name]))
            if "results" not in update:
                changed = {page.cards[name].answer: update[f"answer:{name}"] for name in names if f"answer:{name}" in update} | (
                    {page["status"]: update["status"]} if "status" in update else {})
                streamed.update(changed)
                yield list(streamed.values())  # a value for every output: Gradio builds a component per skipped one
                continue
            payload = update["results"]
            found = views.results_by_name(payload)
            drawn.update({name: lab.cache.figure(name, payload, spec.column_names(), False) for name in spec.FIXED_PLOTS})
            figures = plots.all_figures(payload["results"], spec.column_names(), built=drawn)
            values = [update["status"]]
            for name in spec.column_names():
                values += [present.answer_text(found.get(name)), present.stats_markdown(found.get(name)),
                           present.seen_text(found.get(name))]
            values += [figures[name] for name in spec.plot_names()]
            shown = payload if attention else tokenview.payload_without_arrays(payload)
            yield dict(zip(outputs, values + [present.reading_frame(payload), shown, payload]))

    run.__signature__ = inspect.Signature(  # the API's parameter names
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
         for name in spec.run_parameter_names(page.specs) + ["attention"]])
    page["run_api"].click(run, inputs=[*form, page["api_attention"]], outputs=outputs, api_name="run", concurrency_id=spec.RUN_QUEUE,
                          concurrency_limit=policy.PAGE_RUNS_AT_ONCE, show_progress="hidden")

    def run_counts() -> dict:
        """How this server answered its live runs: computed, joined (a run in flight), cached, refused
        (queue full); the cache, the queue and the last runs' times (``kvviz.engine.shared_runs``)."""
        return lab.runs.summary()

    gr.api(run_counts, api_name="run_counts")


# --- sweep, export, pair ----------------------------------------------------------------------------


def wire_sweep(lab: Lab):
    page = lab.page
    swept = methods.with_sweep()[0] if methods.with_sweep() else None
    if swept is None:
        return None

    def sweep_run(pair, series, max_new_tokens, view, progress=gr.Progress()):
        """Run the sweep on the built-in set; returns the figure and the data."""
        progress(0.0, desc="Loading models ...")
        try:
            with lab.runs.gate.hold():  # the sweep takes the models' slot the live runs queue for
                data = page_sweep(pair, series, int(max_new_tokens), swept.name, progress)  # on a Space: no progress bar
        except ValueError as error:
            raise gr.Error(str(error)) from error
        text = f"**Live sweep finished** in {data['seconds']:.0f} s ({data['n']} questions, {len(data['answers'])} runs)."
        view = {**view, "drawn": {**view.get("drawn", {}), "sweep_plot": "live"}}
        return views.sweep_figure(data, bool(view.get("compact"))), data, text, view

    return page["sweep_button"].click(sweep_run, inputs=[page["pair"], page["sweep_series"], page["sweep_tokens"], page["view"]],
                                      outputs=[page["sweep_plot"], page["sweep_json"], page["sweep_status"], page["view"]],
                                      api_name="sweep", concurrency_id=spec.MODEL_QUEUE, concurrency_limit=lab.concurrency)


def wire_export_and_pair(lab: Lab) -> None:
    page = lab.page

    def export(results):
        """Write the current results to download: the answers and per-layer numbers (JSON, small),
        the table (CSV) and, apart, the per-token attention (JSON, the large part)."""
        results = results or {}
        ran = results.get("results", [])
        attention = {r["handoff"]: r["token_attention"] for r in ran if (r.get("token_attention") or {}).get("attention")}
        try:
            return present.write_exports(tokenview.payload_without_arrays(results), tempfile.mkdtemp(prefix="kvviz-export-"),
                                         attention)
        except OSError as error:  # a full or read-only disk: say so; the results stay on the page
            raise gr.Error(
                f"Could not write the export files ({error.strerror or error}). The results are still on the "
                "page: copy them from 'Structured results', or try again when the server has disk space."
            ) from error

    page["export_button"].click(export, inputs=[page["results"]], outputs=[page["export_files"]], api_name="export")
    page["pair"].change(present.pair_facts_markdown, inputs=[page["pair"]], outputs=[page["facts"]], api_name="pair_facts",
                        show_progress="hidden")


def wire_tokens(lab: Lab) -> None:
    """The What crossed tab's column picker shows that column's token view."""
    page = lab.page

    def on_column(column, payload, names, view):
        updates, view = views.token_view_updates(payload, names or [], view, chosen=column)
        return {**updates, "view": view}

    page["tokens_column"].input(resolved(page, on_column), inputs=[page["tokens_column"], page["results"], page["chosen"],
                                                                   page["view"]],
                                outputs=page.outputs(), api_name="show_tokens", **PRIVATE)


def compare_updates(history: list[dict], side_a: str | None, side_b: str | None) -> dict:
    """The Compare two tab for these sides: both pickers (this session's columns), the diff, its figure."""
    options = compare.choices(history)
    keys = {key for _, key in options}
    side_a, side_b = (side_a if side_a in keys else None), (side_b if side_b in keys else None)
    return {"compare_a": gr.update(choices=options, value=side_a), "compare_b": gr.update(choices=options, value=side_b),
            "compare_html": compare.compare_html(history, side_a, side_b),
            "compare_plot": compare.compare_figure(history, side_a, side_b)}


def wire_compare(lab: Lab) -> None:
    """Every new result set (a preset, a finished live run) joins the session's history, and the
    Compare two tab shows its first column beside that column's control (or the run before); the
    pickers and the two shortcuts redraw the diff."""
    page = lab.page
    sides = [page["history"], page["compare_a"], page["compare_b"]]
    # these events write the tab's own components only (a page-wide output list would put a progress
    # tracker on every component while one waits in the queue)
    outputs = [*sides, page["compare_html"], page["compare_plot"]]

    def quiet(handler):
        return resolved(page, handler, said_in="compare_html")

    def on_results(payload, history, side_a, side_b):
        newest = history[-1]["number"] if history else 0
        history = compare.remember(history, payload)
        if not history or history[-1]["number"] == newest:  # not a new run: nothing changes
            return {}
        return {"history": history, **compare_updates(history, *compare.default_sides(history))}

    for number, event in enumerate(lab.result_events):
        event.then(quiet(on_results), inputs=[page["results"], *sides], outputs=outputs,
                   api_name="remember_run" if number == 0 else f"remember_run_{number}", **PRIVATE)

    def on_open(history, side_a, side_b):  # the opening preset has no change event: draw when the tab opens
        if side_a is None and side_b is None:
            side_a, side_b = compare.default_sides(history)
        return compare_updates(history, side_a, side_b)

    page.tabs["compare"].select(quiet(on_open), inputs=sides, outputs=outputs, api_name="open_compare_sides", **PRIVATE)

    def link_sides(history, side_a, side_b, params):
        return on_open(history, side_a, side_b) if params.get("tab") == "compare" else {}

    def on_link(history, side_a, side_b, request: gr.Request):  # a permalink that opens this tab
        params = dict(request.query_params) if request is not None else {}
        return quiet(link_sides)(history, side_a, side_b, params)

    page.demo.load(on_link, inputs=sides, outputs=outputs, api_name="compare_on_load", **PRIVATE)

    def on_pick(history, side_a, side_b):
        return compare_updates(history, side_a, side_b)

    for role in ("compare_a", "compare_b"):
        page[role].input(quiet(on_pick), inputs=sides, outputs=outputs, api_name=f"pick_{role}", **PRIVATE)

    def shortcut(find, missing: str):
        def handler(history, side_a, side_b):
            other = find(history, side_a)
            if other is None:
                return {"compare_html": f'<div class="kv-tv-empty">{missing}</div>' + compare.compare_html(history, side_a, side_b)}
            return compare_updates(history, side_a, other)
        return handler

    with_control = shortcut(compare.control_side, "A's control did not run in A's run: tick it beside A and press "
                                                  "<b>Run live</b> (or pick B yourself).")
    with_control.__name__ = "compare_with_control"
    with_previous = shortcut(compare.previous_side, "A's column did not run in an earlier run of this session.")
    with_previous.__name__ = "compare_with_previous"
    page["compare_control"].click(quiet(with_control), inputs=sides, outputs=outputs, api_name="compare_with_control",
                                  **PRIVATE)
    page["compare_previous"].click(quiet(with_previous), inputs=sides, outputs=outputs, api_name="compare_with_previous",
                                   **PRIVATE)
    with_swapped = shortcut(compare.swapped_side, "A's column has no answer on a swapped note: press <b>Swap the fact</b> "
                                                  "first (and pick A on the note).")
    with_swapped.__name__ = "compare_with_swapped"
    page["compare_swapped"].click(quiet(with_swapped), inputs=sides, outputs=outputs, api_name="compare_with_swapped",
                                  **PRIVATE)


def wire_all(lab: Lab) -> None:
    wire_load(lab)
    wire_presets(lab)
    wire_ticks_and_expected(lab)
    wire_tabs(lab)
    wire_tokens(lab)
    wire_permalink(lab)
    wire_lesson(lab)
    wire_walkthrough(lab)
    wire_run(lab)
    wire_export_and_pair(lab)
    wire_compare(lab)  # last: it follows the events above that show other results
