"""The page's own events, one ``wire_*`` function per concern: loading (and a link's state), the
presets, the ticks, the question asked, the tabs, What crossed, the link and the saved run, the
export and the pair's facts; ``wire_all`` wires them and the other rooms' (the run and ``/run``:
``running``; the lesson's "Show me" and the walk-through: ``walk``; Compare two: ``comparing``).

Handlers compute ``{role: value}`` updates from the run's reading (``views``, ``tabs``) and
``Page.resolve`` turns them into component updates, so no handler depends on the order of a list
of outputs. The reading is kept beside the results (the ``reading`` State) and read again only when
another run arrives or the learner types another expected answer.
"""

from __future__ import annotations

import json
import tempfile

import gradio as gr

from kvviz.app import present, tokenview
from kvviz.app.page import links, saved, spec, views
from kvviz.app.page.comparing import wire_compare
from kvviz.app.page.lab import PRIVATE, Lab, drawn_outputs, resolved
from kvviz.app.page.recording import wire_recording
from kvviz.app.page.running import wire_run
from kvviz.app.page.tabs import json_updates_for, token_view_updates
from kvviz.app.page.walk import wire_lesson, wire_walkthrough
from kvviz.app.presets import preset
from kvviz.app.reading.reading import Reading


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
    wire_recording(lab)  # after every event that may bring a tab into view (``Lab.tab_events``)
    wire_compare(lab)  # last: it follows the events above that show other results


# --- load and a link's state --------------------------------------------------------------------


def wire_load(lab: Lab) -> None:
    """On load: the viewport's width (a phone gets compact figures), a link's state or a saved run,
    then the tab in view's figures. Until then tab selections draw nothing (the view is not ready)."""
    page = lab.page

    def on_load(width, reading, names, view, params):
        view = {**view, "compact": bool(width) and float(width) <= 640, "drawn": {}, "ready": True, "asked": None}
        link = links.permalink_state(page.specs, params or {})
        updates: dict = {}
        if link:
            updates, reading, names, view = restored(lab, link, reading, names, view)
        kept = saved.saved_results(params or {})
        if kept:  # a saved run (/r/<id>): its own results, not the preset's
            answers = spec.expected_answers(updates.get("expected", page.value("expected")))
            updates.update(saved.restored_run(kept[0], kept[1], names, answers, lab.presets))
            reading = updates["reading"]
        tab = link.get("tab") if link.get("tab") in dict(spec.TABS) else view.get("tab", spec.DEFAULT_TAB)
        return {**updates, **lab.tab_view(tab, reading, names, view)}

    def load_with_link(width, reading, names, view, request: gr.Request):
        params = dict(request.query_params) if request is not None else {}
        return resolved(page, on_load)(width, reading, names, view, params)

    # a permalink may set the handoffs' options too: only this event writes their widgets
    loaded = page.demo.load(load_with_link, inputs=[page["viewport"], page["reading"], page["chosen"], page["view"]],
                            outputs=page.outputs() + list(page.option_inputs),
                            js="(width, ...rest) => [window.innerWidth, ...rest]", api_name="on_load", **PRIVATE)
    lab.result_events.append(loaded)
    lab.tab_events.append(loaded)  # a saved live run opened on a tab that shows what crossed


def restored(lab: Lab, link: dict, reading: Reading, names: list[str], view: dict) -> tuple[dict, Reading, list[str], dict]:
    """What a permalink's state (``links.permalink_state``) changes on the page just loaded: a
    preset's question and precomputed results (painted without a model), else its question and
    context for a live run; then the columns, expected answer, pair, settings, options, tab and token
    column. Returns (updates, reading, names, view)."""
    page = lab.page
    updates: dict = {}
    key = link.get("preset")
    query, context = link.get("q"), link.get("c")
    if key and query is None and context is None:
        query, context = preset(key).query, preset(key).context or ""
    match = views.preset_matching(query, context) if query is not None else None
    if match:
        updates = lab.preset_view(match, view)
        reading, names, view = updates["reading"], updates["chosen"], updates.pop("view")
    elif query is not None:
        updates = {"query": query, "context": context or "", "presets": None, **views.cleared_question(),
                   "status": "Opened from a link: press **Run live** to run this question (the greyed answers below "
                             "are the opening preset's)."}
    if "expected" in link:
        updates["expected"] = link["expected"]
    if "expected" in link and spec.expected_answers(link["expected"]) != list(reading.answers):
        reading = views.reading_of(reading.payload, spec.expected_answers(link["expected"]))
        updates["reading"] = reading
    if "h" in link:
        names = link["h"]
        updates.update({"chosen": names, "shown": names, **views.cards(reading, names)})
    if "pair" in link:
        updates.update({"pair": link["pair"], "facts": present.pair_facts_markdown(link["pair"])})
    for name in ("max_new_tokens", "sample", "temperature", "seed"):
        if name in link:
            updates[name] = link[name]
    for index, value in (link.get("options") or {}).items():
        updates[f"option:{index}"] = value
    if link.get("column"):
        view = {**view, "tokens_column": link["column"]}
    asked = (updates.get("query", reading.query), updates.get("context", reading.context),
             updates.get("pair", lab.default_pair))
    if not reading.asks(*asked):  # the opening preset's cards do not answer it
        updates.update(views.stale_view(reading, asked[2]))
    updates["setup"] = spec.setup_html(*asked[1:])
    return updates, reading, names, {**view, "setup": None}


def wire_permalink(lab: Lab) -> None:
    """"Copy link": the page's state as a URL (pair, preset or question and context, columns,
    expected answer, settings, options, tab, token column), put in the address bar and copied;
    "Save run": the same state kept with the results under a short id."""
    page = lab.page
    inputs = [page["pair"], page["presets"], page["query"], page["context"], page["chosen"], page["expected"],
              page["view"], *page.settings_inputs]

    def make_link(pair, key, query, context, chosen, expected, view, *settings):
        max_new_tokens, sample, temperature, seed = settings[:4]
        state = {"pair": pair, "preset": key, "q": query, "c": context, "h": chosen or [], "expected": expected,
                 "max_new_tokens": max_new_tokens, "sample": sample, "temperature": temperature, "seed": seed,
                 "tab": (view or {}).get("tab"), "column": (view or {}).get("tokens_column"), "options": list(settings[4:])}
        return {"link": links.permalink_query(page.specs, state),
                "status": "Link to this page's state copied (it is in the address bar too)."}

    page["copy_link"].click(resolved(page, make_link), inputs=inputs, outputs=page.outputs(), api_name="copy_link",
                            **PRIVATE).then(None, inputs=[page["link"]], js=COPY_LINK_JS)

    def save_run(address, results, *values):
        return saved.save(results, make_link(*values)["link"], values[2] or "kvviz run", address)

    save_resolved = resolved(page, save_run)

    def save_run_for(request: gr.Request, results, *values):  # Gradio hands the request to a parameter typed so
        return save_resolved(request.client.host if request and request.client else "unknown", results, *values)

    page["save_run"].click(save_run_for, inputs=[page["results"], *inputs], outputs=page.outputs(),
                           api_name="save_run", **PRIVATE).then(None, inputs=[page["saved_link"]], js=saved.COPY_SAVED_JS)


COPY_LINK_JS = """
(link) => {
  const url = location.origin + location.pathname + '?' + link;
  history.replaceState(null, '', url);
  if (navigator.clipboard) navigator.clipboard.writeText(url).catch(() => {});
  return [];
}
"""


# --- presets, ticks, the question and its expected answer -----------------------------------------


def wire_presets(lab: Lab) -> None:
    page = lab.page
    chosen = page["presets"].input(resolved(page, lab.preset_view), inputs=[page["presets"], page["view"]],
                                   outputs=page.outputs(), api_name="choose_preset", **PRIVATE)
    lab.result_events.append(chosen)

    def load_preset(key: str) -> dict:
        """A preset's question and its precomputed results: ``{"query", "context", "expected",
        "results"}`` (the payload the page shows, as the ``/run`` endpoint's JSON)."""
        picked = preset(key)
        payload, _, _ = lab.presets(key)
        return {"query": picked.query, "context": picked.context or "", "expected": list(picked.answers),
                "lesson": picked.lesson, "results": json.loads(json.dumps(payload))}

    gr.api(load_preset, api_name="load_preset")


def wire_ticks_and_expected(lab: Lab) -> None:
    """Ticking a column shows its card, details and figure; typing an expected answer re-marks (the
    run read again by it); any change of the question, the note or the pair (typed, pasted, cut,
    dropped, autofilled: ``widgets.PAGE_JS`` tells Gradio of those) greys the cards that do not
    answer it and clears the preset, its lesson, the expected answer and the swap words
    (``views.asked_view``), and brings them back when the page asks their question again."""
    page = lab.page
    asked = [page["query"], page["context"], page["pair"]]

    def on_ticks(names, reading, view, query, context, pair):
        names = [name for name in spec.column_names() if name in (names or [])]
        updates = {"shown": names, **views.question_view(reading, query, context, pair, names, lab.presets)}
        return {**updates, **lab.tab_view(view.get("tab", spec.DEFAULT_TAB), reading, names, view)}

    page["chosen"].input(resolved(page, on_ticks), inputs=[page["chosen"], page["reading"], page["view"], *asked],
                         outputs=page.outputs(), api_name="show_handoffs", **PRIVATE)

    def on_expected(expected, reading, names, query, context, pair):
        reading = views.reading_of(reading.payload, spec.expected_answers(expected))
        return {"reading": reading, **views.question_view(reading, query, context, pair, names or [], lab.presets)}

    page["expected"].input(resolved(page, on_expected), inputs=[page["expected"], page["reading"], page["chosen"], *asked],
                           outputs=page.outputs(), api_name="mark", trigger_mode="always_last", **PRIVATE)

    def on_question(query, context, pair, reading, names, view):
        # what the page shows changes only when the cards start or stop answering what is asked: the
        # keystrokes between send nothing (``view["asked"]``: the run and whether it answered, when
        # this handler last drew them; a handler that draws another run clears it)
        asked = [reading.stamp, reading.asks(query, context, pair)]
        setup = spec.setup_kind(context, pair)  # the setup sentence: a note, one question, a trained sharer
        updates = {} if view.get("setup") == list(setup) else {"setup": spec.setup_html(context, pair)}
        if view.get("asked") != asked:
            updates.update(views.asked_view(reading, query, context, pair, names or [], lab.presets))
        return {**updates, "view": {**view, "asked": asked, "setup": list(setup)}} if updates else {}

    for role in ("query", "context", "pair"):
        page[role].input(resolved(page, on_question), inputs=[*asked, page["reading"], page["chosen"], page["view"]],
                         outputs=page.outputs(), api_name=f"ask_{role}", trigger_mode="always_last", **PRIVATE)


# --- tabs, What crossed, export, the pair ---------------------------------------------------------


def wire_tabs(lab: Lab) -> None:
    """A tab draws its figures when opened, and only those whose content changed; the Data tab's
    structured results are drawn when their box opens (and while it is open)."""
    page = lab.page
    for tab_id, tab in page.tabs.items():
        def on_select(reading, names, view, tab_id=tab_id):
            if not view.get("ready"):  # Gradio selects the first tab as the page mounts: the load draws it
                return {}
            updates = lab.tab_view(tab_id, reading, names or [], view)
            updates.pop("tab")  # the learner selected it already
            return updates

        # its outputs are what a tab draws, not the whole page (each output an update leaves as it was costs
        # the event loop a fresh component: docs/SPEED.md 13.5)
        opened = tab.select(resolved(page, on_select), inputs=[page["reading"], page["chosen"], page["view"]],
                            outputs=drawn_outputs(page), api_name=f"open_{tab_id}", **PRIVATE)
        if spec.tab_parts(tab_id):  # it shows what crossed: recorded now where the run shown lacks it
            lab.tab_events.append(opened)

    def on_json_open(reading, view):
        updates, view = json_updates_for(reading, {**view, "json_open": True})
        return {**updates, "view": view}

    def on_json_close(view):
        return {"view": {**view, "json_open": False}}

    page["json_box"].expand(resolved(page, on_json_open), inputs=[page["reading"], page["view"]],
                            outputs=[page["json"], page["view"], page["status"]], api_name="open_json", **PRIVATE)
    page["json_box"].collapse(resolved(page, on_json_close), inputs=[page["view"]], outputs=[page["view"], page["status"]],
                              api_name="close_json", **PRIVATE)


def wire_tokens(lab: Lab) -> None:
    """The What crossed tab's column picker shows that column's token view."""
    page = lab.page

    def on_column(column, reading, names, view):
        updates, view = token_view_updates(reading, names or [], view, chosen=column)
        return {**updates, "view": view}

    page["tokens_column"].input(resolved(page, on_column), inputs=[page["tokens_column"], page["reading"], page["chosen"],
                                                                   page["view"]],
                                outputs=page.outputs(), api_name="show_tokens", **PRIVATE)


def wire_export_and_pair(lab: Lab) -> None:
    page = lab.page

    def export(results, reading):
        """Write the current results to download: the answers and per-layer numbers (JSON, small),
        the table (CSV) and, apart, the per-token attention (JSON, the large part)."""
        results = results or {}
        if not isinstance(reading, Reading) or reading.payload is not results:  # no session: read what was given
            reading = views.reading_of(results, ())
        try:
            return present.write_exports(tokenview.payload_without_arrays(results), reading,
                                         tempfile.mkdtemp(prefix="kvviz-export-"), present.attention_of(reading))
        except OSError as error:  # a full or read-only disk: say so; the results stay on the page
            raise gr.Error(
                f"Could not write the export files ({error.strerror or error}). The results are still on the "
                "page: copy them from 'Structured results', or try again when the server has disk space."
            ) from error

    page["export_button"].click(export, inputs=[page["results"], page["reading"]], outputs=[page["export_files"]],
                                api_name="export")
    page["pair"].change(present.pair_facts_markdown, inputs=[page["pair"]], outputs=[page["facts"]], api_name="pair_facts",
                        show_progress="hidden")
