"""The page built in this process (no server): its events, queues and API names, the walk-through,
presets painting their cards, the ``/run`` parameters and the columns from the registry.

tests/integration/test_app.py serves the same page and drives it with gradio_client.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from kvviz.app import present, ui  # noqa: E402
from kvviz.app.methods import kvcomm as kvcomm_page  # noqa: E402
from kvviz.app.methods import registry as methods
from kvviz.app.presets import PRESETS, PRESETS_BY_KEY, load_precomputed  # noqa: E402
from kvviz.core.plotkit import bar_counts  # noqa: E402
from kvviz.handoffs.kvcomm.options import options_of  # noqa: E402


def test_model_runs_share_one_queue_and_every_public_event_is_named():
    demo = ui.build_demo(precomputed={}, sweep=None)
    functions = {fn.api_name: fn for fn in demo.fns.values() if fn.api_visibility != "private"}
    assert all(name and name != "unnamed" for name in functions)
    from kvviz.app.page.spec import RUN_QUEUE
    from kvviz.core.policy import PAGE_RUNS_AT_ONCE, model_concurrency

    # the sweep takes one of the models' slots, as many at once as live runs may be (kvviz.core.policy)
    assert functions["sweep"].concurrency_id == ui.MODEL_QUEUE and functions["sweep"].concurrency_limit == model_concurrency()
    # the live runs go to the engine's shared runs, which queue them for the models (kvviz.engine.shared_runs)
    assert functions["run"].concurrency_id == RUN_QUEUE and functions["run"].concurrency_limit == PAGE_RUNS_AT_ONCE
    assert functions["load_preset"].concurrency_id not in (ui.MODEL_QUEUE, RUN_QUEUE)
    assert "run_counts" in functions
    for name in ("run_on_page", "swap_on_page"):
        page_run = next(fn for fn in demo.fns.values() if fn.api_name == name)
        assert page_run.concurrency_id == RUN_QUEUE and page_run.api_visibility == "private"


def test_the_queue_looks_for_events_every_10_ms_not_every_1_ms():
    """Gradio's queue polls for new events while it has none; its Linux default (1 ms) keeps an idle
    server at 4% of a core. The page sets its own interval on the attributes Gradio reads: were they
    renamed by an upgrade, the page would silently poll at 1 ms again, so this fails instead."""
    from gradio.queueing import Queue

    demo = ui.build_demo(precomputed={}, sweep=None)
    fresh = Queue(live_updates=False, concurrency_count=1, update_intervals=1, max_size=None, blocks=demo,
                  default_concurrency_limit=1)
    assert hasattr(fresh, "sleep_when_free") and hasattr(fresh, "progress_update_sleep_when_free")  # what Gradio reads
    assert demo._queue.sleep_when_free == ui.QUEUE_POLL_SECONDS == 0.01
    assert demo._queue.progress_update_sleep_when_free == ui.PROGRESS_POLL_SECONDS


def test_walkthrough_steps_forward_and_back_load_their_presets_and_tabs():
    demo = ui.build_demo()
    page = demo.kvviz_page
    walk = {fn.api_name: fn.fn for fn in demo.fns.values() if fn.api_name and fn.api_name.startswith("walkthrough_")}
    view = {"tab": "layers", "compact": False, "drawn": {}, "ready": True}
    reading, names = page["reading"].value(), ui.default_columns()
    steps = ui.walkthrough_steps()
    out = walk["walkthrough_next"](0, view, reading, names)
    assert out[page["walk_step"]] == 1 and "Step 2 of" in out[page["walk_text"]]
    kvcomm = next(i for i, step in enumerate(steps) if step.target == "kv-plot-kvcomm")
    out = walk["walkthrough_next"](kvcomm - 1, view, reading, names)
    assert out[page["presets"]] == steps[kvcomm].preset  # the step loads the preset that proves its point
    assert out[page["query"]] == PRESETS_BY_KEY[steps[kvcomm].preset].query
    assert out[page.figures["kvcomm"]] is not None  # and draws the figure it talks about
    out = walk["walkthrough_back"](1, view, reading, names)
    assert out[page["walk_step"]] == 0 and "Step 1 of" in out[page["walk_text"]]
    assert out[page["presets"]] == steps[0].preset


def test_each_predict_step_is_graded_by_its_presets_stored_run_as_the_presets_own_check_says():
    """A predict-then-reveal step's right choice comes from the stored run, read once, and agrees
    with what the preset's own claims (tests/unit/test_presets.py) hold about that run."""
    from kvviz.app.page import steps as walk_steps
    from kvviz.app.page.views import PresetRuns

    presets = PresetRuns(load_precomputed(), "embedded")
    predicts = [step for step in ui.walkthrough_steps() if step.predict is not None]
    assert {step.predict.ask.kind for step in predicts} >= {"beats", "follow"}
    for step in predicts:
        loaded = PRESETS_BY_KEY[step.preset]
        right, said = walk_steps.prediction_outcome(step.predict, presets(step.preset)[2])
        ask = step.predict.ask
        verdicts = {c.question.column: c.expected for c in loaded.claims if c.question.kind == "verdict"}
        follows = {c.question.column: c.expected for c in loaded.claims if c.question.kind == "follow"}
        if ask.kind == "beats":
            expected = verdicts[ask.column] == "right" and verdicts[loaded_control(ask.column)] == "wrong"
        else:
            expected = follows.get(ask.column) == "followed"
        assert right == (0 if expected else 1), (step.title, said)
        assert step.reveal == loaded.lesson and loaded.lesson not in step.text  # the lesson tells: it waits
        assert "{" not in step.predict.question  # the preset's swap is named


def loaded_control(name: str) -> str:
    from kvviz.app.reading import catalog

    return catalog.control_of(name)


def test_a_prediction_asks_a_question_of_the_one_vocabulary_and_says_when_results_cannot_tell():
    from kvviz.app.methods.registry import Prediction
    from kvviz.app.page import steps as walk_steps
    from kvviz.app.reading.questions import Question
    from kvviz.app.reading.reading import read

    def result(name, answer, swap=None):
        return {"handoff": name, "applicable": True, "answer": answer, "swap": swap}

    payload = {"results": [result("kvcomm", "4471", {"applicable": True, "outcome": "kept", "answer": "4471",
                                                      "changed": "4471 -> 3902"}),
                           result("kvcomm_control", "12")]}
    right = Prediction("q", Question("verdict", "kvcomm"), "right")
    beats = Prediction("q", Question("beats", "kvcomm"), "yes")
    assert walk_steps.prediction_outcome(right, read(payload, ["4471"]))[0] == 0
    assert walk_steps.prediction_outcome(right, read(payload, ["3902"]))[0] == 1
    assert walk_steps.prediction_outcome(beats, read(payload, ["4471"]))[0] == 0
    assert walk_steps.prediction_outcome(beats, read(payload, ["12"]))[0] == 1
    outcome, said = walk_steps.prediction_outcome(Prediction("q", Question("follow", "kvcomm"), "followed"),
                                                  read(payload, ["4471"]))
    assert outcome == 1 and "did not follow" in said and "KVComm: right, but it did not follow the swapped fact" in said
    outcome, said = walk_steps.prediction_outcome(Prediction("q", Question("verdict", "text"), "right"),
                                                  read(payload, ["4471"]))
    assert outcome is None and "cannot say" in said
    with pytest.raises(ValueError):
        Prediction("q", Question("beats", "kvcomm"), "right")  # "right" is not an answer of "beats"
    veil = walk_steps.prediction_veil_css(beats)
    assert "#kv-answer-kvcomm" in veil and "#kv-answer-kvcomm_control" in veil and "#kv-verdict" in veil


def test_a_guess_on_a_predict_step_lifts_the_veil_and_says_which_choice_the_stored_run_makes_right():
    demo = ui.build_demo()
    page = demo.kvviz_page
    fns = {fn.api_name: fn.fn for fn in demo.fns.values() if fn.api_name}
    view = {"tab": "layers", "compact": False, "drawn": {}, "ready": True}
    steps = ui.walkthrough_steps()
    index = next(i for i, step in enumerate(steps) if step.predict is not None and step.predict.ask.kind == "follow")
    out = fns["walkthrough_next"](index - 1, view, page["reading"].value(), ui.default_columns())
    assert "blur" in out[page["walk_veil"]] and out[page["walk_guess"]]["visible"] is True
    assert out[page["walk_guess"]]["value"] is None and out[page["walk_reveal"]] == ""
    wrong = fns["walkthrough_guess"]("Yes", index)  # the stored run: KVComm does not follow the swap
    assert out is not wrong and "blur" not in wrong[page["walk_veil"]]  # the veil goes (a phone folds the text)
    assert wrong[page["walk_reveal"]].startswith("**Not this time:** the answer is No.")
    assert steps[index].reveal in wrong[page["walk_reveal"]]
    assert fns["walkthrough_guess"]("No", index)[page["walk_reveal"]].startswith("**Right.**")
    out = fns["walkthrough_next"](index, view, page["reading"].value(), ui.default_columns())
    assert out[page["walk_veil"]] == "" and out[page["walk_guess"]]["visible"] is False


def test_a_preset_paints_its_cards_and_its_tab_draws_its_figures():
    from kvviz.app.page import tabs, views

    payload, status, reading = views.PresetRuns(load_precomputed(), "embedded")(PRESETS[0].key)
    assert "precomputed" in status and payload["precomputed"] is True and reading.payload is payload
    table = present.results_frame(reading)
    assert list(table.columns) == present.RESULT_COLUMNS and set(table["handoff"]) == {r["handoff"] for r in payload["results"]}
    cards = views.cards(reading, ui.default_columns())
    for name in ("receiver", "text", "kvcomm", "skyline"):
        assert cards[f"answer:{name}"], name
        assert "precomputed" in cards[f"notes:{name}"]
    figures, _ = tabs.tab_updates("layers", reading, ui.default_columns(), {"drawn": {}}, tabs.FigureCache())
    kvcomm = next(r for r in payload["results"] if r["handoff"] == "kvcomm")
    counts = bar_counts(figures["figure:kvcomm"])
    assert set(counts) == {s[0] for s in kvcomm_page.figure_series(kvcomm)} and "query" in counts
    assert set(counts.values()) == {len(kvcomm["layers"])}
    cost, _ = tabs.tab_updates("cost", reading, ui.default_columns(), {"drawn": {}}, tabs.FigureCache())
    assert len(bar_counts(cost["figure:latency"])) == 5  # one trace per stage


def test_the_run_endpoint_names_every_setting_and_option_in_order():
    names = ui.run_parameter_names(ui.page_options())
    assert names[:8] == ["pair", "query", "context", "max_new_tokens", "sample", "temperature", "seed", "message_tokens"]
    assert names[-1] == "handoffs"
    # the KVComm options keep the positions scripts used before the registry (alpha: auto, then value)
    assert names[8:15] == ["kvcomm_ratio", "kvcomm_strategy", "kvcomm_alpha_auto", "kvcomm_alpha", "kvcomm_sigma", "kvcomm_layers",
                           "kvcomm_calibration"]
    widgets = sum(spec.inputs for spec in ui.page_options())  # the message bound is the text handoff's option
    assert len(names) == 7 + widgets + 1


def test_form_values_become_each_handoffs_options():
    specs = [spec for spec in ui.page_options() if spec.handoff.name == "kvcomm"]
    values = ui.option_values(specs, [0.25, "prior", True, 0.3, 5.0, "", "query"])
    assert values == {"kvcomm": {"ratio": 0.25, "strategy": "prior", "alpha": None, "sigma": 5.0, "layers": "",
                                 "calibration": "query"}}
    request = ui.build_request("Q?", "  ", 8, False, 0.7, 3, values)
    assert request.context is None and options_of(request).strategy == "prior" and request.generation.max_new_tokens == 8
    assert options_of(request).calibration == "query" and options_of(request).calibration_sample is None
    assert options_of(request).alpha is None and options_of(request).seed == 3
    explicit = ui.build_request("Q?", "ctx", options={"kvcomm": {"layers": "7, 0,3"}})
    assert options_of(explicit).strategy == "explicit" and options_of(explicit).layers == (0, 3, 7)


def test_the_page_columns_and_plots_come_from_the_registry():
    columns = ui.column_names()
    assert columns == methods.column_names()
    assert set(ui.default_columns()) == {"receiver", "text", "c2c", "c2c_control", "kvcomm", "skyline"}
    assert columns.index("c2c_control") == columns.index("c2c") + 1  # the control sits next to C2C
    figures = ui.plot_names()
    assert figures[-2:] == ["latency", "bytes"]
    assert all(methods.page_of(name).figure is not None for name in figures[:-2])


def test_ticking_a_handoff_shows_its_column_and_figure():
    demo = ui.build_demo(precomputed={}, sweep=None)
    page = demo.kvviz_page
    show = next(fn for fn in demo.fns.values() if fn.api_name == "show_handoffs")
    shown = ["receiver", "kvcomm"]
    view = {"tab": "layers", "compact": False, "drawn": {}, "ready": True}
    updates = show.fn(shown, page["reading"].value(), view, page["query"].value, page["context"].value,
                      page["pair"].value)  # columns are layout blocks: called directly
    for name in ui.column_names():
        assert updates[page.cards[name].block]["visible"] == (name in shown)
        assert updates[page.details[name].block]["visible"] == (name in shown)
    for name in ui.plot_names():
        if name not in ui.FIXED_PLOTS:
            assert updates[page.figures[name]]["visible"] == (name in shown)


def test_walkthrough_has_a_step_per_handoff_shown_at_first():
    titles = [step.title for step in ui.walkthrough_steps()]
    described = [page.handoff.title for page in methods.columns() if page.handoff.default and page.walkthrough]
    # the puzzle, the predict-then-reveal step on the token view, what it costs, your turn
    assert len(titles) == len(described) + 4 and all(any(t in title for title in titles) for t in described)
    assert titles[0].startswith(f"Step 1 of {len(titles)}")
