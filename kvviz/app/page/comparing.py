"""Compare two, wired: every new run the page shows (a preset, a finished live run, a link) joins
the session's history (``kvviz.app.compare``, readings of its last runs), and the tab shows its
first column beside that column's control (or the run before); the pickers and the shortcuts
redraw the diff.
"""

from __future__ import annotations

import gradio as gr

from kvviz.app import compare
from kvviz.app.page.lab import PRIVATE, Lab, resolved

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

    def on_results(reading, history, side_a, side_b):
        before = list(history or [])
        history = compare.remember(history, reading)
        if len(history) == len(before) and all(a is b for a, b in zip(history, before)):  # nothing new
            return {}
        if before and history[-1]["number"] == before[-1]["number"]:  # a run's entry with what a tab recorded
            return {"history": history, **compare_updates(history, side_a, side_b)}
        return {"history": history, **compare_updates(history, *compare.default_sides(history))}

    for number, event in enumerate(lab.result_events):
        event.then(quiet(on_results), inputs=[page["reading"], *sides], outputs=outputs,
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
