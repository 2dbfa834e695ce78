"""The run: Run live, Swap the fact and Insert a contradiction (each streams into the cards, the
strip and the status line, then shows its results and their reading in the tabs; each waits in the
models' queue and stops on Stop), ``/run`` for scripts (the same cards, the same stats,
``present.card``), and the sweep.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading

import gradio as gr

from kvviz.app import plots, present, tokenview
from kvviz.app.methods import registry as methods
from kvviz.app.page import spec, views
from kvviz.app.page.lab import LOG, PRIVATE, SENT_AS_IS, Lab, as_sent, drawn_outputs, resolved
from kvviz.app.page.named import Page
from kvviz.app.page.run import LiveRun, stream_run
from kvviz.app.page.tabs import sweep_figure
from kvviz.app.sweep import page_sweep
from kvviz.core import policy
from kvviz.engine import contradiction, stream
from kvviz.runtime.models import resolve_pair

def request_from_form(lab: Lab, pair, query, context, settings: list, ticked, expected: str | None = None, *, parts):
    """(request, names) from the form's values, or a ValueError saying what is wrong. The run
    records the ``parts`` of what crossed asked for (``kvviz.runtime.crossed``; None: every part;
    empty: nothing; the first expected answer is the logit lens's gold), and nothing when
    ``KVVIZ_RECORD_CROSSED=0`` (``spec.inspect_for``)."""
    max_new_tokens, sample, temperature, seed = settings[:4]
    names = [name for name in spec.column_names() if name in (ticked or [])]
    options = spec.option_values(lab.page.specs, list(settings[4:]))
    golds = spec.expected_answers(expected)
    inspect = spec.inspect_for(golds[0] if golds else None, parts)
    request = spec.build_request(query, context, max_new_tokens, sample, temperature, seed, options, inspect)
    resolve_pair(pair)
    if not names:
        raise ValueError("Tick at least one handoff to run.")
    return request, names


def wire_run(lab: Lab) -> None:
    """Run live, Swap the fact and Insert a contradiction: each streams into the cards and the status
    line, then shows its results in the tabs; each waits in the models' queue and stops on Stop. Each
    records the parts of what crossed that the tab in view shows (``spec.tab_parts``; a contradiction
    the lens too, which its cards read); another tab opened later records its own
    (``kvviz.app.page.recording``)."""
    page = lab.page
    form = [page["pair"], page["query"], page["context"], *page.settings_inputs, page["chosen"]]
    asked = [page["pair"], page["query"], page["context"], page["expected"], page["chosen"], page["view"]]
    streamed = page_stream_roles()
    streamed_components = page_stream_outputs(page)
    stream_outputs = live_run_outputs(page)

    def streamed_to_page(updates, rest: tuple):
        """Each ``{role: value}`` update as the stream's outputs: what it sets, else what the output
        shows now (``rest``: the settings, then the streamed outputs' current values)."""
        shown = dict(zip(streamed, rest[len(page.settings_inputs):]))

        def every_output(update: dict) -> list:
            shown.update({role: value for role, value in update.items() if role in shown})
            return as_sent(stream_outputs, [shown[role] for role in streamed] + [update["reading"] if "reading" in update else gr.skip()])

        try:
            for update in updates:
                yield every_output(update)
        except Exception as error:  # noqa: BLE001 (said in the status line; an error raised would mark every output)
            LOG.exception("the page's run failed")
            yield every_output({"status": present.refused_status(f"the run failed ({type(error).__name__}: {error})")})

    def run_on_page(pair, query, context, expected, ticked, view, request: gr.Request, *rest):
        settings = rest[: len(page.settings_inputs)]
        yield from streamed_to_page(run_updates(lab, pair, query, context, expected, ticked, settings,
                                                request.session_hash, (view or {}).get("tab")), rest)

    def swap_on_page(pair, query, context, expected, ticked, view, replace, by, swapped_answer, reading,
                     request: gr.Request, *rest):
        settings = rest[: len(page.settings_inputs)]
        yield from streamed_to_page(swap_updates(lab, pair, query, context, expected, ticked, (replace, by, swapped_answer),
                                                 reading, settings, request.session_hash, (view or {}).get("tab")), rest)

    def contradict_on_page(pair, query, context, expected, ticked, view, sentence, counter, reading, request: gr.Request,
                           *rest):
        updates = contradiction_updates(lab, pair, query, context, expected, ticked, (sentence, counter), reading,
                                        rest[: len(page.settings_inputs)], request.session_hash, (view or {}).get("tab"))
        yield from streamed_to_page(updates, rest)

    def show_finished_run(reading, view, names):
        """After the stream: the run's results and their reading on the page, and the tab in view
        drawn from them."""
        if reading is None:  # refused or failed: the status line said why
            return {}
        update = {**lab.tab_view(view.get("tab", spec.DEFAULT_TAB), reading, names, {**view, "asked": None}),
                  "results": reading.payload, "reading": reading, "finished_run": None, "lesson": views.lesson_of(reading, lab.presets)}
        update.pop("tab")
        return update

    swap_fields = [page["swap_replace"], page["swap_by"], page["swap_answer"], page["reading"]]
    contra_fields = [page["contra_sentence"], page["contra_answer"], page["reading"]]
    for button, handler, inputs, name in ((page["run_button"], run_on_page, asked, "run"),
                                          (page["swap_button"], swap_on_page, asked + swap_fields, "swap"),
                                          (page["contra_button"], contradict_on_page, asked + contra_fields, "contradict")):
        chain_live_run(lab, button, resolved(page, show_finished_run), handler, inputs, name, streamed_components)

    def stop_run(request: gr.Request):
        lab.flags.stop(request.session_hash)

    sweep_event = wire_sweep(lab)
    page["stop_button"].click(stop_run, api_name="stop", queue=False,
                              cancels=[sweep_event] if sweep_event is not None else None)
    wire_run_api(lab, form)


def chain_live_run(lab: Lab, button, show_finished, handler, inputs: list, name: str, streamed_components: list) -> None:
    """One live-run button: it turns into Running (unqueued), the run streams in the models' queue,
    then the finished run goes to the tabs and the button comes back."""
    page = lab.page

    def begin(request: gr.Request):
        lab.flags.begin(request.session_hash)
        return page.resolve({"run_button": True})

    def finish(request: gr.Request):
        lab.flags.end(request.session_hash)
        return page.resolve({"run_button": False})

    live = button.click(begin, outputs=[page["run_button"]], queue=False, api_name=f"begin_{name}", **PRIVATE).then(
        handler, inputs=[*inputs, *page.settings_inputs, *streamed_components],
        outputs=live_run_outputs(page), api_name=f"{name}_on_page",
        concurrency_id=spec.RUN_QUEUE, concurrency_limit=policy.PAGE_RUNS_AT_ONCE, **PRIVATE, **SENT_AS_IS)
    shown = live.then(show_finished, inputs=[page["finished_run"], page["view"], page["chosen"]],
                      outputs=finished_run_outputs(page), api_name=f"show_finished_{name}", **PRIVATE)
    shown.then(finish, outputs=[page["run_button"]], queue=False, api_name=f"end_{name}", **PRIVATE)
    lab.result_events.append(shown)
    lab.tab_events.append(shown)  # the learner may have opened another tab while it ran


def run_updates(lab: Lab, pair, query, context, expected, ticked, settings, session, tab: str | None = None):
    """Run live: the ticked columns on the form's question, as ``{role: value}`` updates; it records
    what the tab in view (``tab``) shows of what crossed."""
    stop = lab.flags.current(session)
    try:
        handoff_request, names = request_from_form(lab, pair, query, context, settings, ticked, expected,
                                                   parts=spec.tab_parts(tab))
    except ValueError as error:  # one message, in the status line; nothing else changes
        yield {"status": present.refused_status(str(error))}
        return
    run = lab.live_run(pair, handoff_request, names, expected, views.preset_matching(query, context), session)
    for update in stream_run(run, lab.workers, stop, batches=lab.runs.batches):
        update.pop("error", None)
        yield update


def swap_updates(lab: Lab, pair, query, context, expected, ticked, fields, reading, settings, session,
                 tab: str | None = None):
    """Swap the fact: the ticked columns on the swapped note, beside their answers on the note.
    A preset's stored swap is shown as it is; else the swapped note runs live (``note_and_other``),
    recording what the tab in view (``tab``) shows of what crossed."""
    try:
        swap = spec.swap_from_form(context, *fields, pair=pair)
        handoff_request, names = request_from_form(lab, pair, query, context, settings, ticked, expected,
                                                   parts=spec.tab_parts(tab))
    except ValueError as error:
        yield {"status": present.refused_status(str(error))}
        return
    answers, key = spec.expected_answers(expected), views.preset_matching(query, context)
    payload = reading.payload if reading is not None else {}
    if reading is not None and views.holds_swap(reading, names, swap):  # a preset's stored swap: shown as read
        yield views.swap_view(dataclasses.replace(reading, swap_shown=True, payload={**payload, "swap_shown": True}), names)
        return
    other_pair = spec.opposite_sharer(pair) if swap.pair else None  # a sharer swap: its question on that pair
    ran = yield from note_and_other(lab, pair, handoff_request, names, expected, reading, key, session,
                                    stream.swapped_request(handoff_request, swap), spec.expected_text(swap.answers),
                                    f"**Swap the fact**, {'with ' + swap.changed if other_pair else 'on the swapped note'}: ",
                                    other_pair=other_pair)
    if ran is not None:
        originals, swapped, from_page = ran
        asked = handoff_request.to_dict()
        recorded = spec.recorded_parts(asked)  # what the runs just made recorded
        if from_page:  # the answers the page held recorded what their own run did
            recorded &= spec.recorded_parts(payload.get("request"))
        base = {**payload, "pair": pair, "request": spec.request_recording(asked, recorded), "preset": key}
        yield views.swap_view(views.reading_of(views.with_swap(base, originals, swapped, names, swap, answers), answers),
                              names)


def contradiction_updates(lab: Lab, pair, query, context, expected, ticked, fields, reading, settings, session,
                          tab: str | None = None):
    """Insert a contradiction: the ticked columns on the note with one contradicting sentence
    inserted after the sentence that states the expected answer, beside their answers on the note;
    the same two requests as ``run --contradict`` (``kvviz.engine.contradiction``: the logit lens
    follows the expected answer, gold, and the sentence's, counter), each column read by
    ``contradiction_record``."""
    try:
        made = spec.contradiction_from_form(context, expected, *fields)
        handoff_request, names = request_from_form(lab, pair, query, context, settings, ticked, expected,
                                                   parts={*spec.tab_parts(tab), "lens"})  # the cards read the lens
    except ValueError as error:
        yield {"status": present.refused_status(str(error))}
        return
    answers, key = spec.expected_answers(expected), views.preset_matching(query, context)
    ran = yield from note_and_other(lab, pair, contradiction.counter_lens_request(handoff_request, made, answers), names,
                                    expected, reading, key, session,
                                    contradiction.contradicted_request(handoff_request, made, answers), expected,
                                    "**Insert a contradiction**, on the contradicted note: ")
    if ran is not None:
        originals, contradicted, _ = ran
        payload = reading.payload if reading is not None else {}
        base = {**payload, "pair": pair, "request": handoff_request.to_dict(), "preset": key}
        yield views.contradiction_view(views.reading_of(views.with_contradiction(base, originals, contradicted, names, made,
                                                                                 answers), answers), names)


def note_and_other(lab: Lab, pair, request, names, expected, reading, key, session, other_request, other_expected,
                   said: str, other_pair: str | None = None):
    """The runs behind Swap the fact and Insert a contradiction, as ``{role: value}`` updates: the
    columns whose answers on the note are not on the page for these settings run on it first (on
    their cards), then every column on the other note (its answers stay off the cards until they are
    all in; the status line begins with ``said``). Returns (each column's result on the note, on the
    other note, whether any answer on the note was the page's), or None when stopped or failed.
    ``other_pair``: the pair the other request runs on (a sharer swap's), else ``pair``."""
    stop = lab.flags.current(session)
    payload = reading.payload if reading is not None else {}
    held = reading is not None and views.same_request(payload, request.to_dict(), pair)
    originals = {name: reading.column(name).raw for name in names if held and reading.column(name).raw is not None}
    from_page = bool(originals)
    others: dict = {}
    for run_request, columns, found in ((request, [n for n in names if n not in originals], originals),
                                        (other_request, names, others)):
        if not columns:
            continue
        on_note = found is originals
        run = lab.live_run(pair if on_note else other_pair or pair, run_request, columns,
                           expected if on_note else other_expected, key, session)
        for update in stream_run(run, lab.workers, stop, batches=lab.runs.batches):
            update.pop("error", None)
            ended = update.pop("results", None)
            update.pop("reading", None)
            if not on_note:  # the other note's answers stay off the cards until they are all in
                update = {"status": said + update.get("status", "")} if "status" in update else {}
            yield update
        if stop.is_set() or ended is None:
            return None
        found.update(run.results)
    return originals, others, from_page


# What a live run streams on the page (``run_on_page``): the status, the strip, and every column's
# card and details. The run reads what each of them shows and gives every one a value in every
# update: an output an update leaves as it was costs Gradio a fresh component (~0.5 ms each, in the
# event loop that shares the interpreter with the models). What the tabs draw from the results
# comes once, after the stream (``show_finished_run``).
CARD_PARTS = ("head", "answer", "stats", "notes", "seen")


def page_stream_roles() -> list[str]:
    return ["status", "verdict"] + [f"{part}:{name}" for name in spec.column_names() for part in CARD_PARTS]


def page_stream_outputs(page: Page) -> list:
    """The components of ``page_stream_roles``, in that order."""
    return list(page.resolve(dict.fromkeys(page_stream_roles(), "")))


def live_run_outputs(page: Page) -> list:
    """A live run's outputs, in order: ``page_stream_outputs``, then the finished run on its way to the tabs."""
    return [*page_stream_outputs(page), page["finished_run"]]


def finished_run_outputs(page: Page) -> list:
    """``show_finished_run``'s outputs: what a tab draws (``lab.drawn_outputs``), the lesson and the
    run's results on their way to the tabs."""
    return drawn_outputs(page, ("finished_run", "lesson"))


def api_outputs(page: Page) -> list:
    """The ``/run`` endpoint's outputs, in order: the status; per page column its answer, its card's
    stats line (the page's, ``present.card``) and what each model saw; every figure
    (``spec.plot_names``); the results table and JSON."""
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
        structured results (the JSON output: pair, request, one result per handoff). The run
        records what crossed only with ``attention`` (``kvviz.runtime.crossed``: every part; each
        result then holds its ``token_attention`` with its per-token arrays, about 2 MB a run, its
        ``logit_lens`` and ``token_change``); without it nothing is recorded (the cards, stats and
        figures read none of it) and the results hold none of those fields. Each update before it
        holds every output: the status and the answers so far, and
        None for an output the run has not set yet (the table: an empty one)
        (``kvviz.app.page.run.stream_run``: at most every ``STREAM_INTERVAL`` seconds, and when a
        handoff starts or finishes)."""
        *settings, ticked, attention = rest
        try:
            request, names = request_from_form(lab, pair, query, context, settings,
                                               ticked if ticked is not None else spec.default_columns(),
                                               parts=None if attention else ())
        except ValueError as error:
            raise gr.Error(str(error)) from error
        live = LiveRun(pair, request, names, [], "The answer")  # an API call has no tab of its own
        streamed = {output: None for output in outputs}  # what each output holds so far (None: nothing yet)
        drawn: dict = {}  # each finished handoff's own figure, drawn while the others still run
        for update in stream_run(live, lab.workers, threading.Event(), batches=lab.runs.batches):  # stops when its client leaves
            if update.get("error"):
                raise gr.Error(f"The run failed: {update['error']}")
            for name in plots.layer_figure_handoffs(set(live.results) - set(drawn)):
                drawn[name] = lab.cache.drawn_once((live.stamp, name, (), False),
                                                   lambda name=name: plots.own_figure(name, live.reading.result(name)))
            if "results" not in update:
                changed = {page.cards[name].answer: update[f"answer:{name}"] for name in names if f"answer:{name}" in update} | (
                    {page["status"]: update["status"]} if "status" in update else {})
                streamed.update(changed)
                yield as_sent(outputs, list(streamed.values()))  # a value for every output: Gradio builds a component per skipped one
                continue
            reading, payload = update["reading"], update["results"]
            drawn.update({name: lab.cache.figure(name, reading, spec.column_names(), False) for name in spec.FIXED_PLOTS})
            figures = plots.all_figures(reading.results(), spec.column_names(), built=drawn)
            values = [update["status"]]
            for name in spec.column_names():
                card = views.card(name, reading, "" if name in names else "notrun")
                values += [card[f"answer:{name}"], card[f"stats:{name}"], card[f"seen:{name}"]]
            values += [figures[name] for name in spec.plot_names()]
            shown = payload if attention else tokenview.payload_without_arrays(payload)
            yield as_sent(outputs, values + [present.reading_frame(reading), shown, payload])

    run.__signature__ = inspect.Signature(  # the API's parameter names
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
         for name in spec.run_parameter_names(page.specs) + ["attention"]])
    page["run_api"].click(run, inputs=[*form, page["api_attention"]], outputs=outputs, api_name="run", concurrency_id=spec.RUN_QUEUE,
                          concurrency_limit=policy.PAGE_RUNS_AT_ONCE, show_progress="hidden", **SENT_AS_IS)

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
        return sweep_figure(data, bool(view.get("compact"))), data, text, view

    return page["sweep_button"].click(sweep_run, inputs=[page["pair"], page["sweep_series"], page["sweep_tokens"], page["view"]],
                                      outputs=[page["sweep_plot"], page["sweep_json"], page["sweep_status"], page["view"]],
                                      api_name="sweep", concurrency_id=spec.MODEL_QUEUE, concurrency_limit=lab.concurrency)
