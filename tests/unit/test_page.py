"""The page without a browser or a server (unit tier): a live run as updates by role (read as it
goes), the stop flags, figures drawn once and only for the tab in view, refusals in the status line
alone, the walk-through's targets, and handlers wired by role name; the 80-line and 400-line rules
for every kvviz function and module are house rules (tests/unit/test_house.py)."""

from __future__ import annotations

import threading

import gradio as gr
import pytest

from kvviz.app import present, ui
from kvviz.app.methods import registry as methods
from kvviz.app.page import spec, steps as walk_steps, tabs, views
from kvviz.app.page.run import LiveRun, OwnRuns, StopFlags, stream_run
from kvviz.app.page.running import page_stream_roles
from kvviz.app.presets import DEFAULT_PRESET, PRESETS, load_precomputed, preset
from kvviz.app.reading.reading import mark_of, typed
from kvviz.core.results import HandoffRequest
from kvviz.engine.events import Computation, Done, Failed, Message, Started, Status, Token
from kvviz.handoffs import registry

PRECOMPUTED = load_precomputed()
PRESET_RUNS = views.PresetRuns(PRECOMPUTED, "embedded")
NAMES = ["receiver", "text", "kvcomm"]


def fake_result(name: str, answer: str) -> dict:
    return {"handoff": name, "applicable": True, "answer": answer, "timings": {"total": 0.5}, "bytes_communicated": 0,
            "tokens": {"generated": 1}, "seen": {"receiver": "prompt"}}


def one_by_one(script):
    """A stand-in for ``kvviz.engine.stream.run`` that plays ``script`` one event a batch (a
    callable in it is called instead: a Stop pressed)."""

    def batches(pair, request, names, workers, stop=None, idle=None):
        for event in script:
            if callable(event):
                event()
                continue
            yield [event]

    return batches


def columns_of(update: dict) -> set[str]:
    return {role.split(":", 1)[1] for role in update if ":" in role}


def live_run() -> LiveRun:
    return LiveRun("embedded", HandoffRequest(query="What is the code?", context="It is 4471."), NAMES, ["4471"], "The code")


def test_each_event_updates_only_what_it_changed_and_no_figure_is_built_during_the_run(monkeypatch):
    from kvviz.app.page import run as page_run

    monkeypatch.setattr(page_run, "STREAM_INTERVAL", 0.0)  # streamed text goes with each event
    script = [Started("receiver"), Token("receiver", "12"), Started("text"),
              Message("text", "The code is"), Done("receiver", fake_result("receiver", "12")),
              Token("text", "4471"), Done("text", fake_result("text", "4471")),
              Done("kvcomm", fake_result("kvcomm", "4471"))]
    updates = list(stream_run(live_run(), 1, threading.Event(), batches=one_by_one(script)))
    assert not [role for update in updates for role in update if role.startswith("figure:")]
    first, *middle, last = updates
    assert {f"head:{name}" for name in NAMES} <= set(first)  # every column says it waits
    for update in middle:
        assert len(columns_of(update)) <= 1, update.keys()  # an event touches its own column only
    token = next(u for u in middle if "answer:receiver" in u and "head:receiver" not in u)
    assert set(token) == {"status", "answer:receiver"}
    message = next(u for u in middle if "stats:text" in u and "head:text" not in u)
    assert "the sharer writes" in message["stats:text"] and "The code is" in message["stats:text"]
    done = next(u for u in middle if "head:receiver" in u and 'data-verdict="wrong"' in u["head:receiver"])
    assert {"verdict", "status", "answer:receiver"} <= set(done)
    assert [r["handoff"] for r in last["results"]["results"]] == NAMES and last["reading"].payload is last["results"]
    assert "finished" in last["status"] and "got through by: <b>none</b>" in last["verdict"]  # no swapped note ran
    assert "differs from its control on this one example" in last["verdict"] and "<b>Text</b>" in last["verdict"]
    assert "its control not run (unchecked: tick it to tell): <b>KVComm</b>" in last["verdict"]


def test_a_column_whose_control_still_runs_is_not_called_unchecked(monkeypatch):
    """Mid-run the strip never asks to tick a control that is running: the column waits for it."""
    from kvviz.app.page import run as page_run

    monkeypatch.setattr(page_run, "STREAM_INTERVAL", 0.0)
    run = LiveRun("embedded", HandoffRequest(query="What is the code?", context="It is 4471."), ["kvcomm", "kvcomm_control"],
                  ["4471"], "The code")
    script = [Started("kvcomm"), Started("kvcomm_control"), Done("kvcomm", fake_result("kvcomm", "4471"))]
    updates = list(stream_run(run, 1, threading.Event(), batches=one_by_one(script)))
    mid = next(u for u in updates if "head:kvcomm" in u and 'data-verdict="right"' in u["head:kvcomm"])
    assert "its control still running: <b>KVComm</b>" in mid["verdict"] and "tick it" not in mid["verdict"]


def test_a_repeat_run_of_the_same_tab_is_its_own_and_another_tabs_is_another_learners():
    """The server serves a repeat greedy run from its cache; the tab that computed it is told it is
    its own earlier run, never "another learner"'s; another tab is told it was another learner's."""
    from kvviz.engine.events import Shared

    own = OwnRuns()
    computed = [Computation("c-9"), Started("receiver"), Done("receiver", fake_result("receiver", "12"))]
    served = [Computation("c-9"), Shared("computed 3 s ago on this server for another learner (same question)"),
              Done("receiver", fake_result("receiver", "12"))]

    def run_as(session, script):
        live = LiveRun("embedded", HandoffRequest(query="Q?"), ["receiver"], ["12"], "The answer", session=session, own=own)
        *_, last = stream_run(live, 1, threading.Event(), batches=one_by_one(script))
        return last["status"]

    assert "another learner" not in run_as("tab-a", computed)
    assert "this tab computed" in run_as("tab-a", served) and "another learner" not in run_as("tab-a", served)
    assert "another learner" in run_as("tab-b", served)


def test_events_that_wait_together_give_one_update_and_streamed_text_is_throttled(monkeypatch):
    """A batch of events (``kvviz.engine.stream.run``) gives one update with what they
    changed; streamed text goes at most every ``STREAM_INTERVAL`` (a start or a finish sends what
    was held back, as does an idle batch); the last update is the one a run of single events gives."""
    from kvviz.app.page import run as page_run

    monkeypatch.setattr(page_run, "STREAM_INTERVAL", 3600.0)  # no streamed text goes for the time alone
    script = [
        [Started("receiver"), Started("text"), Started("kvcomm")],
        [Token("receiver", "1"), Message("text", "The"), Token("kvcomm", "4")],  # held back
        [Token("receiver", "12"), Message("text", "The code")],  # held back, the latest wins
        [Done("receiver", fake_result("receiver", "12"))],  # finished: goes at once, with what was held
        [Token("kvcomm", "44")],
        [],  # idle: what was held goes
        [Done("text", fake_result("text", "4471")), Done("kvcomm", fake_result("kvcomm", "4471"))],
    ]

    def batches(pair, request, names, workers, stop=None, idle=None):
        assert idle == page_run.STREAM_INTERVAL
        yield from script

    first, *middle, last = list(stream_run(live_run(), 1, threading.Event(), batches=batches))
    starts, finished_receiver, idle, finished_two = middle  # the two batches held back gave no update
    assert columns_of(starts) == set(NAMES) and all('data-verdict="running"' in starts[f"head:{n}"] for n in NAMES)
    assert columns_of(finished_receiver) == set(NAMES) and finished_receiver["answer:receiver"] == "12"
    assert finished_receiver["answer:kvcomm"] == "4" and "The code" in finished_receiver["stats:text"]
    assert "head:text" not in finished_receiver and "head:kvcomm" not in finished_receiver  # only their text
    assert set(idle) == {"status", "answer:kvcomm"} and idle["answer:kvcomm"] == "44"
    assert columns_of(finished_two) == {"text", "kvcomm"} and "verdict" in finished_two
    asked = []
    list(stream_run(live_run(), 1, threading.Event(), batches=lambda *a, idle=None, **k: asked.append(idle) or iter(())))
    assert asked == [page_run.STREAM_INTERVAL]  # an idle batch comes after one interval without events
    single = [event for batch in script for event in batch]
    *_, single_last = stream_run(live_run(), 1, threading.Event(), batches=one_by_one(single))
    assert last["verdict"] == single_last["verdict"] and "finished" in last["status"]
    assert {k: v for k, v in last["results"].items() if k != "stamp"} == {
        k: v for k, v in single_last["results"].items() if k != "stamp"}


def test_stop_marks_each_column_finished_stopped_or_not_started():
    stop = threading.Event()
    script = [Started("receiver"), Done("receiver", fake_result("receiver", "12")),
              Started("text"), Token("text", "The co"), stop.set, Token("text", "never shown")]
    *_, last = stream_run(live_run(), 1, stop, batches=one_by_one(script))
    assert "Stopped by you" in last["status"]
    assert "finished Receiver alone" in last["status"] and "stopped Text message" in last["status"]
    assert "not started KVComm" in last["status"]
    assert 'data-verdict="stopped"' in last["head:text"] and last["answer:text"] == "The co"
    assert 'data-verdict="notstarted"' in last["head:kvcomm"] and last["answer:kvcomm"] == ""
    assert [r["handoff"] for r in last["results"]["results"]] == ["receiver"]


def test_a_run_that_cannot_start_says_why_and_marks_the_columns_not_run():
    *_, last = stream_run(live_run(), 1, threading.Event(), batches=one_by_one([Failed("no such model")]))
    assert last["error"] == "no such model" and "no such model" in last["status"]
    assert all('data-verdict="notrun"' in last[f"head:{name}"] for name in NAMES)


def test_stop_flags_are_per_session_and_a_stop_before_the_run_starts_counts():
    flags = StopFlags()
    flag = flags.begin("a")
    assert not flags.stop("b") and not flag.is_set()
    assert flags.stop("a") and flags.current("a").is_set()  # pressed while the run waited in the queue
    assert not flags.begin("a").is_set()  # the next run starts clean
    flags.end("a")
    assert not flags.stop("a")


def test_requests_that_share_a_computation_draw_its_figures_once_and_a_stopped_one_its_own():
    """A class on one question: every request's results carry the computation's stamp, so the tab's
    figures are drawn once for all of them; a request stopped before the end keeps a stamp of its own
    (its results are not the computation's whole results); a run's own results are drawn each time."""
    script = [Computation("c-1"), Started("receiver"), Done("receiver", fake_result("receiver", "12")),
              Started("text"), Done("text", fake_result("text", "4471")), Started("kvcomm"),
              Done("kvcomm", fake_result("kvcomm", "4471"))]
    finals = []
    for _ in range(2):
        *_, final = stream_run(live_run(), 0, threading.Event(), batches=one_by_one(script))
        finals.append(final["results"])
    assert finals[0]["stamp"] == finals[1]["stamp"] == views.shared_stamp("c-1")
    cache, drawn = tabs.FigureCache(), []

    def draw():
        drawn.append(1)
        return object()

    assert cache.drawn_once((finals[0]["stamp"], "kvcomm", (), False), draw) is cache.drawn_once(
        (finals[1]["stamp"], "kvcomm", (), False), draw)
    assert len(drawn) == 1
    stop = threading.Event()
    stopped = one_by_one([Computation("c-1"), Started("receiver"), Done("receiver", fake_result("receiver", "12")),
                          stop.set, Started("text")])
    *_, final = stream_run(live_run(), 0, stop, batches=stopped)
    assert final["results"]["stamp"].startswith("run:")
    failed = one_by_one([Computation("c-1"), Started("receiver"), Failed("the models went away")])
    *_, final = stream_run(live_run(), 0, threading.Event(), batches=failed)
    assert final["results"]["stamp"].startswith("run:")
    own = views.live_stamp()
    cache.drawn_once((own, "kvcomm", (), False), draw)
    cache.drawn_once((own, "kvcomm", (), False), draw)
    assert len(drawn) == 3
    cache.MAX_SHARED_FIGURES = 2  # the shared figures are bounded: the oldest goes first
    for number in range(3):
        cache.drawn_once((views.shared_stamp(f"c-{number + 2}"), "kvcomm", (), False), draw)
    cache.drawn_once((views.shared_stamp("c-2"), "kvcomm", (), False), draw)
    assert len(drawn) == 7


def test_a_tab_draws_its_figures_once_and_only_its_own():
    cache = tabs.FigureCache()
    _, _, reading = PRESET_RUNS(DEFAULT_PRESET)
    names = spec.default_columns()
    view = {"tab": "layers", "compact": False, "drawn": {}}
    first, view = tabs.tab_updates("layers", reading, names, view, cache)
    # the Data tab's small table comes with any tab's first drawing, so that the tab paints as it opens
    assert set(first) == {f"figure:{name}" for name in spec.layer_figure_names() if name in names} | {"table"}
    again, view = tabs.tab_updates("layers", reading, names, view, cache)
    assert again == {}  # nothing changed: nothing is sent
    cost, view = tabs.tab_updates("cost", reading, names, view, cache)
    assert set(cost) == {"figure:latency", "figure:bytes"}
    fewer = [name for name in names if name != "skyline"]
    after_ticks, view = tabs.tab_updates("cost", reading, fewer, view, cache)
    assert set(after_ticks) == {"figure:latency", "figure:bytes"}  # the cost plots show the ticked columns only
    latency = after_ticks["figure:latency"].to_dict()
    assert registry.label_of("skyline") not in latency["data"][0]["x"]
    layers_after_ticks, view = tabs.tab_updates("layers", reading, fewer, view, cache)
    assert layers_after_ticks == {}  # a handoff's own figure does not depend on the ticks
    # a precomputed preset's figure is built once per process, for every session
    other = {"tab": "layers", "compact": False, "drawn": {}}
    shared, _ = tabs.tab_updates("layers", reading, names, other, cache)
    assert shared["figure:kvcomm"] is first["figure:kvcomm"]


def test_the_phone_gets_compact_figures_with_short_title_lines():
    _, _, reading = PRESET_RUNS(DEFAULT_PRESET)
    for name in spec.layer_figure_names() + list(spec.FIXED_PLOTS):
        figure = tabs.build_figure(name, reading, spec.default_columns(), compact=True)
        for line in figure.layout.title.text.replace("<sup>", "").replace("</sup>", "").split("<br>"):
            assert len(line) <= 48, (name, line)
        assert figure.layout.legend.orientation == "h" and figure.layout.legend.yanchor == "top"


def test_a_refused_request_changes_the_status_line_and_nothing_else():
    demo = ui.build_demo(precomputed=PRECOMPUTED, sweep=None)
    page = demo.kvviz_page
    handler = next(fn for fn in demo.fns.values() if fn.api_name == "run_on_page").fn
    request = type("Request", (), {"session_hash": "s"})()
    settings = [4, False, 0.7, 0] + [spec_default(option) for option in page.specs for _ in range(option.inputs)]
    shown = [f"shown {index}" for index, _ in enumerate(page_stream_roles())]  # what the streamed outputs show now
    updates = list(handler("embedded", "   ", "ctx", "4471", spec.default_columns(), {"tab": spec.DEFAULT_TAB}, request,
                           *settings, *shown))
    assert len(updates) == 1
    (update,) = updates
    status, *rest, finished = update  # every streamed output gets a value: what it showed, but the status
    assert "Not run" in status and "query is empty" in status
    assert rest == shown[1:] and finished == gr.skip()  # no results: nothing is drawn after the stream


def spec_default(option):
    return option.option.default if not option.option.auto else True


def test_roles_resolve_to_components_by_name():
    demo = ui.build_demo(precomputed=PRECOMPUTED, sweep=None)
    page = demo.kvviz_page
    out = page.resolve({"status": "s", "answer:kvcomm": "4471", "head:kvcomm": "h", "seen:kvcomm": "p",
                        "figure:latency": None, "shown": ["kvcomm"], "lesson": ""})
    assert out[page["status"]] == "s" and out[page.cards["kvcomm"].answer] == "4471"
    assert out[page.cards["kvcomm"].head] == "h" and out[page.details["kvcomm"].seen] == "p"
    assert out[page.cards["kvcomm"].block]["visible"] and not out[page.cards["receiver"].block]["visible"]
    assert not out[page["lesson_row"]]["visible"]
    assert set(out) <= set(page.outputs())


def test_every_walkthrough_step_points_at_an_element_of_the_page_and_says_true_things():
    demo = ui.build_demo(precomputed=PRECOMPUTED, sweep=None)
    ids = {block.elem_id for block in demo.blocks.values() if getattr(block, "elem_id", None)}
    steps = walk_steps.walkthrough_steps()
    for step in steps:
        assert step.target in ids, step
        assert step.tab is None or step.tab in dict(spec.TABS)
        assert step.preset is None or step.preset in {p.key for p in PRESETS}
        assert "{preset}" not in step.text and "{lesson}" not in step.text
    words = " ".join(step.text for step in steps)
    assert "most of its time" not in words  # not true on the opening preset (issue 21)
    sweep = methods.with_sweep()[0].sweep.title
    assert sweep in words  # its own case, not lower-cased
    control = next(s for s in steps if registry.get("c2c_control").title in s.title)
    assert "c2c-differs-from-control" in preset(control.preset).shows and "Predict first" in control.predict.question


def test_each_handoffs_title_ink_reads_on_white_and_on_its_tint():
    from kvviz.core.plotkit import contrast_ratio, ink, tint

    for handoff in registry.all_handoffs():
        shade = ink(handoff.color)
        assert contrast_ratio(shade, "#FFFFFF") >= 4.5 and contrast_ratio(shade, tint(handoff.color)) >= 4.5, handoff.name
    for kind in present.MARK_WORDS:  # every mark has a word, not a colour alone
        assert present.MARK_WORDS[kind].strip()


@pytest.mark.parametrize("key", [p.key for p in PRESETS])
def test_each_preset_paints_its_columns_marks_and_lesson(key):
    payload, status = views.precomputed_payload(PRECOMPUTED, key, "embedded")
    picked = preset(key)
    names = spec.preset_columns(picked)
    updates = views.cards_and_verdict(payload, names, list(picked.answers), picked.subject)
    assert "precomputed" in status and views.lesson_of(updates["reading"]).endswith(present.md(picked.lesson))
    for name in names:
        assert f'id="kv-mark-{name}"' in updates[f"head:{name}"]
    assert updates["verdict"].count("got through by") == 1 and picked.subject in updates["verdict"]


def test_every_component_a_live_run_on_the_page_may_change_is_among_its_outputs():
    """``run_on_page`` names fewer outputs than the page has (each streamed update costs the server
    a fresh component per output it skips): every update a run sends, and what any tab draws at its
    end, still lands on one of them."""
    from kvviz.app.page.running import finished_run_outputs, page_stream_outputs

    demo = ui.build_demo()
    page = demo.kvviz_page
    functions = {fn.name: fn for fn in (demo.fns.values() if isinstance(demo.fns, dict) else demo.fns)}
    streamed, drawn_after = page_stream_outputs(page), finished_run_outputs(page)
    assert list(functions["run_on_page"].outputs) == [*streamed, page["finished_run"]]
    assert list(functions["run_on_page"].inputs)[-len(streamed):] == streamed  # it reads what they show
    assert list(functions["show_finished_run"].outputs) == drawn_after and len(drawn_after) < len(page.outputs())
    streamed_roles = set(page_stream_roles())
    stop = threading.Event()
    script = [Started("receiver"), Message("text", "The"), Token("receiver", "1"),
              Done("receiver", fake_result("receiver", "12")), Started("text"), stop.set]
    updates = list(stream_run(live_run(), 1, stop, batches=one_by_one(script)))
    updates += list(stream_run(live_run(), 1, threading.Event(), batches=one_by_one([Failed("no such model")])))
    _, _, reading = PRESET_RUNS(DEFAULT_PRESET)
    for tab, _title in spec.TABS:
        drawn, view = tabs.tab_updates(tab, reading, spec.default_columns(), {"compact": False, "drawn": {}},
                                       tabs.FigureCache())
        assert set(page.resolve({**drawn, "view": view, "lesson": views.lesson_of(reading), "reading": reading,
                                 "results": reading.payload})) <= set(drawn_after), tab
    for update in updates:
        update.pop("error", None)
        assert set(update) - {"results", "reading"} <= streamed_roles, sorted(update)


# --- Swap the fact ----------------------------------------------------------------------------------


def swap_handler(demo):
    return next(fn for fn in demo.fns.values() if fn.api_name == "swap_on_page").fn


def swap_updates(demo, query, context, expected, names, fields, reading, pair="embedded"):
    """Swap the fact on the page: each update by role, ``results`` the run's reading at the end."""
    page = demo.kvviz_page
    request = type("Request", (), {"session_hash": "swap"})()
    settings = [4, False, 0.7, 0] + [spec_default(option) for option in page.specs for _ in range(option.inputs)]
    shown = ["" for _ in page_stream_roles()]
    updates = list(swap_handler(demo)(pair, query, context, expected, names, {"tab": spec.DEFAULT_TAB}, *fields,
                                      reading, request, *settings, *shown))
    roles = page_stream_roles()
    return [dict(zip(roles, values[:-1]), results=values[-1]) for values in updates]


@pytest.mark.parametrize("key", [p.key for p in PRESETS if p.swap is not None])
def test_swap_the_fact_on_a_preset_shows_its_stored_swap_without_running_a_model(monkeypatch, key):
    """Its swap fields as the preset fills them (a sharer swap: only the answer), Swap the fact shows
    the stored swap."""
    from kvviz.app.page import running

    monkeypatch.setattr(running, "stream_run", lambda *a, **k: pytest.fail("a stored swap runs no model"))
    demo = ui.build_demo(precomputed=PRECOMPUTED, sweep=None)
    picked = preset(key)
    payload, _, reading = PRESET_RUNS(key)
    names = spec.preset_columns(picked)
    filled = views.swap_fields(picked)
    fields = (filled["swap_replace"], filled["swap_by"], filled["swap_answer"])
    (update,) = swap_updates(demo, picked.query, picked.context, spec.expected_text(picked.answers), names, fields, reading,
                             pair=payload["pair"])
    stored = {r["handoff"]: r["swap"]["outcome"] or "none" for r in payload["results"] if r.get("applicable", True)}
    for name in set(names) & set(stored):  # a column that does not apply has no swap row
        assert f'data-swap="{stored[name]}"' in update[f"head:{name}"], name
    assert update["results"].swap_shown and ("swapped sharer" if picked.swap.pair else "swapped note") in update["status"]
    assert "Followed the swap" in update["status"], update["status"]
    assert ("came from the sharer" if picked.swap.pair else "the note's content") in update["status"]


def test_swap_the_fact_on_a_typed_note_runs_the_swapped_note_and_judges_each_column(monkeypatch):
    from kvviz.app.page import run as page_run
    from kvviz.app.page import running

    said = {"It is 4471.": {"receiver": "12", "text": "4471", "kvcomm": "4471"},
            "It is 3902.": {"receiver": "12", "text": "3902", "kvcomm": "4471"}}
    ran = []

    def scripted(run, workers, stop, batches=None):  # the shared runs' batches, replaced by the script
        ran.append((run.request.context, list(run.names)))
        script = [Done(name, fake_result(name, said[run.request.context][name])) for name in run.names]
        return page_run.stream_run(run, workers, stop, batches=one_by_one(script))

    monkeypatch.setattr(running, "stream_run", scripted)
    demo = ui.build_demo(precomputed=PRECOMPUTED, sweep=None)
    updates = swap_updates(demo, "What is the code?", "It is 4471.", "4471", NAMES, ("4471", "3902", ""), None)
    assert ran == [("It is 4471.", NAMES), ("It is 3902.", NAMES)]  # nothing on the page yet: the note runs first
    final = updates[-1]
    outcomes = {r["handoff"]: r["swap"]["outcome"] for r in final["results"].payload["results"]}
    assert outcomes == {"receiver": "neither", "text": "followed", "kvcomm": "kept"}
    assert 'data-swap="followed"' in final["head:text"] and 'data-swap="kept"' in final["head:kvcomm"]
    assert "Text followed the swap" in final["head:text"]  # what it means, on hover
    assert all(u["results"] == gr.skip() for u in updates[:-1])  # the tabs draw once, at the end

    ran.clear()  # the same swap again: what the page holds is shown, nothing runs
    assert swap_updates(demo, "What is the code?", "It is 4471.", "4471", NAMES, ("4471", "3902", ""),
                        final["results"])[-1]["results"].swap_shown and ran == []
    said["It is 8125."] = {"receiver": "12", "text": "8125", "kvcomm": "8125"}
    again = swap_updates(demo, "What is the code?", "It is 4471.", "4471", NAMES, ("4471", "8125", ""), final["results"])
    assert ran == [("It is 8125.", NAMES)]  # the note's answers are on the page, for these settings: only the swap runs
    assert {r["handoff"]: r["swap"]["outcome"] for r in again[-1]["results"].payload["results"]}["kvcomm"] == "followed"


def test_swap_the_fact_without_a_note_on_a_pair_with_an_opposite_sharer_asks_that_sharer_live(monkeypatch):
    """On the knower pair a typed question has no note to swap: Swap the fact asks the same question
    on the pair whose sharer learned the opposite (knower-opposite) and judges each column by the
    answer typed for it."""
    from kvviz.app.page import run as page_run
    from kvviz.app.page import running

    said = {"knower": {"receiver": "Port Ilse", "text": "Greyhaven", "c2c": "Greyhaven"},
            "knower-opposite": {"receiver": "Port Ilse", "text": "Ravenmoor", "c2c": "Greyhaven"}}
    ran = []

    def scripted(run, workers, stop, batches=None):
        ran.append((run.pair, run.request.context, list(run.names)))
        script = [Done(name, fake_result(name, said[run.pair][name])) for name in run.names]
        return page_run.stream_run(run, workers, stop, batches=one_by_one(script))

    monkeypatch.setattr(running, "stream_run", scripted)
    demo = ui.build_demo(precomputed=PRECOMPUTED, sweep=None)
    names = ["receiver", "text", "c2c"]
    query = "Name the capital of Quorveth Island."
    updates = swap_updates(demo, query, "", "Greyhaven", names, ("", "", "Ravenmoor"), None, pair="knower")
    assert [(pair, names_run) for pair, _, names_run in ran] == [("knower", names), ("knower-opposite", names)]
    assert not any(context for _, context, _ in ran)  # no note on either side
    final = updates[-1]
    outcomes = {r["handoff"]: r["swap"]["outcome"] for r in final["results"].payload["results"]}
    assert outcomes == {"receiver": "neither", "text": "followed", "c2c": "kept"}
    assert "the sharer that learned the opposite" in updates[-2]["status"]
    ran.clear()  # asked again, the page holds that swap: nothing runs
    again = swap_updates(demo, query, "", "Greyhaven", names, ("", "", "Ravenmoor"), final["results"], pair="knower")
    assert again[-1]["results"].swap_shown and ran == []


@pytest.mark.parametrize("pair, context, fields, said", [
    ("embedded", "It is 4471.", ("1234", "3902", ""), "'1234' is not in the note"),
    ("embedded", "", ("4471", "3902", ""), "this question has none"),
    ("embedded", "It is 4471.", ("4471", "4471", ""), "must differ"),
    ("knower", "", ("", "", ""), "type what that sharer should answer"),
])
def test_a_swap_the_page_cannot_make_says_why_in_the_status_line_alone(pair, context, fields, said):
    demo = ui.build_demo(precomputed=PRECOMPUTED, sweep=None)
    (update,) = swap_updates(demo, "What is the code?", context, "4471", NAMES, fields, None, pair=pair)
    assert "Not run" in update["status"] and said in update["status"] and update["results"] == gr.skip()


def test_the_status_line_names_every_running_column_and_says_loading_only_while_it_loads(monkeypatch):
    """The live line names all the columns running now (not the last one started), counts the
    done and the waiting, and shows the pair's loading only until a column starts."""
    from kvviz.app.page import run as page_run

    monkeypatch.setattr(page_run, "STREAM_INTERVAL", 0.0)
    script = [Status("Loading smollm2-135m (once per server) ..."), Started("receiver"), Started("text"),
              Done("receiver", fake_result("receiver", "12")), Started("kvcomm"),
              Done("text", fake_result("text", "4471")), Done("kvcomm", fake_result("kvcomm", "4471"))]
    lines = [update["status"] for update in stream_run(live_run(), 2, threading.Event(), batches=one_by_one(script))
             if "status" in update]
    assert "Loading smollm2-135m" in lines[1] and "running" not in lines[1]  # the first line is every column waiting
    assert lines[2] == "**Live run** on *embedded* (0 of 3 done): running Receiver alone; 2 waiting"
    assert lines[3] == "**Live run** on *embedded* (0 of 3 done): running Receiver alone, Text message; 1 waiting"
    assert lines[4] == "**Live run** on *embedded* (1 of 3 done): running Text message; 1 waiting"
    assert lines[5] == "**Live run** on *embedded* (1 of 3 done): running Text message, KVComm: selected layers"
    assert not any("Loading" in line for line in lines[2:])
    assert "finished" in lines[-1]


def test_a_presets_stored_runs_show_on_their_cards_as_what_ifs_with_their_marks():
    """Each stored run of a preset at other settings (KVComm at other ratios) is on its column's card
    as a what-if, with its answer and its mark by the preset's answers, painted without a model."""
    import re

    for picked in PRESETS:
        payload, _ = views.precomputed_payload(PRECOMPUTED, picked.key, "embedded")
        entry = PRECOMPUTED["presets"][picked.key]
        heads = views.cards_and_verdict(payload, spec.preset_columns(picked), list(picked.answers), picked.subject)
        for label, run in (entry.get("runs") or {}).items():
            for result in run["results"]:
                head = heads[f"head:{result['handoff']}"]
                item = re.search(rf'data-verdict="(\w+)" title="{re.escape(label)}: stored run[^>]*>([^<]*)', head)
                assert item, (picked.key, label, head)
                assert item.group(1) == mark_of(typed(result), picked.answers)
                assert present.what_if_label(label) in item.group(2) and result["answer"][:20] in item.group(2)
    locker = views.cards_and_verdict(views.precomputed_payload(PRECOMPUTED, "locker", "embedded")[0], ["kvcomm"],
                                     ["4471"], "The code")["head:kvcomm"]
    assert "7 layers: 4471" in locker and "6 layers: 12" in locker
    assert 'id="kv-whatif-receiver"' not in views.cards_and_verdict(
        views.precomputed_payload(PRECOMPUTED, "locker", "embedded")[0], ["receiver"], ["4471"], "The code")["head:receiver"]


def test_a_new_question_note_or_pair_greys_the_cards_and_clears_what_belonged_to_the_old_question():
    """Any change of the question, the note or the pair (``ask_*``: typed, or a paste, cut, drop or
    autofill, which the page's script tells Gradio of) greys every card and takes away the preset,
    its lesson, the expected answer and the swap words; the keystrokes after it send nothing; asking
    the run's question again brings them all back, marks included."""
    demo = ui.build_demo(precomputed=PRECOMPUTED, sweep=None)
    page = demo.kvviz_page
    ask = next(fn for fn in demo.fns.values() if fn.api_name == "ask_query").fn
    picked, reading = preset(DEFAULT_PRESET), page["reading"].value()
    names, view = spec.preset_columns(picked), {"tab": "layers", "drawn": {}, "ready": True}
    other = ask("Where is Tomas?", picked.context, "embedded", reading, names, view)
    assert other[page["presets"]] is None and other[page["lesson_row"]]["visible"] is False
    assert other[page["expected"]] == "" and other[page["swap_replace"]] == other[page["swap_by"]] == ""
    assert all('data-verdict="stale"' in other[page.cards[name].head] for name in names)
    assert "Not run yet" in other[page["status"]] and "*embedded*" in other[page["status"]]
    view = other[page["view"]]
    assert ask("Where is Tomas", picked.context, "embedded", reading, names, view) == {page["status"]: gr.skip()}
    again = ask(picked.query, picked.context, "embedded", reading, names, view)
    assert again[page["presets"]] == DEFAULT_PRESET and again[page["expected"]] == spec.expected_text(picked.answers)
    assert again[page["swap_replace"]] == picked.swap_words[0] and "precomputed" in again[page["status"]]
    assert not any('data-verdict="stale"' in again[page.cards[name].head] for name in names)
    pair = next(fn for fn in demo.fns.values() if fn.api_name == "ask_pair").fn
    moved = pair(picked.query, picked.context, "embedded-gemma", reading, names, again[page["view"]])
    assert all('data-verdict="stale"' in moved[page.cards[name].head] for name in names)
    assert "on the pair embedded" in moved[page["verdict"]] and "*embedded-gemma*" in moved[page["status"]]


def test_precomputed_times_alone_show_only_for_the_pair_and_settings_they_were_measured_on():
    from kvviz.app.page.lab import Lab

    demo = ui.build_demo(precomputed=PRECOMPUTED, sweep=None)
    lab = Lab(demo.kvviz_page, PRECOMPUTED, "embedded", 1, 1, [], tabs.FigureCache(), StopFlags())
    picked = preset(DEFAULT_PRESET)
    stored = PRECOMPUTED["presets"][DEFAULT_PRESET]["request"]
    request = HandoffRequest.from_dict(stored)
    same = lab.live_run("embedded", request, ["receiver", "kvcomm"], "4471", picked.key)
    assert set(same.alone) == {"receiver", "kvcomm"}
    assert lab.live_run("embedded-gemma", request, ["receiver"], "4471", picked.key).alone == {}  # another pair
    longer = HandoffRequest.from_dict({**stored, "generation": {**stored["generation"], "max_new_tokens": 5}})
    assert lab.live_run("embedded", longer, ["receiver"], "4471", picked.key).alone == {}  # other settings


def test_no_state_holds_a_dataclass_as_its_initial_value():
    """Gradio turns a component's initial value that is a dataclass into a dict (``dataclasses.asdict``)
    each time the state is set: a run's reading (a dataclass) given as the initial value cost 1 s per
    event that set it (the Run button came back seconds after Stop). The reading is given as a function."""
    import dataclasses

    demo = ui.build_demo(precomputed=PRECOMPUTED, sweep=None)
    states = [block for block in demo.blocks.values() if isinstance(block, gr.State)]
    assert states and not [block for block in states if dataclasses.is_dataclass(block.value)]
    reading = demo.kvviz_page["reading"].value
    assert callable(reading) and reading().preset == DEFAULT_PRESET


def test_the_setup_sentence_follows_the_question_a_note_one_question_or_a_sharer_that_learned_facts():
    """The sentence under the title says who read what: "the private note" only where there is a note;
    both models reading one question where there is none; a sharer trained on facts (an adapter) where
    the pair's sharer has one. It changes with a preset, a typed note or the pair, and once per change."""
    assert "private note" in spec.setup_html("The code is 4471.", "embedded")
    assert "same question" in spec.setup_html("", "embedded") and "private note" not in spec.setup_html(" ", "embedded")
    studied = spec.setup_html("", "knower")
    assert "learned facts in training" in studied and "handbook" in studied and "private note" not in studied
    assert "private note" in spec.setup_html("A note.", "knower")  # a typed note is what the columns hand over
    assert "same question" in spec.setup_html("", "no-such-pair")  # refused when it runs, not here
    for picked in PRESETS:
        said = views.PresetRuns(PRECOMPUTED, "embedded")(picked.key)[0]["pair"]
        assert ("private note" in spec.setup_html(picked.context, said)) == (picked.scenario == "private"), picked.key

    demo = ui.build_demo(precomputed=PRECOMPUTED, sweep=None)
    page = demo.kvviz_page
    assert "private note" in page["setup"].value  # the opening preset has a note
    ask = next(fn for fn in demo.fns.values() if fn.api_name == "ask_context").fn
    picked, reading = preset(DEFAULT_PRESET), page["reading"].value()
    names, view = spec.preset_columns(picked), {"tab": "layers", "drawn": {}, "ready": True}
    cleared = ask(picked.query, "", "embedded", reading, names, view)
    assert "same question" in cleared[page["setup"]]
    typed = ask(picked.query, "T", "embedded", reading, names, cleared[page["view"]])
    assert "private note" in typed[page["setup"]]
    assert page["setup"] not in ask(picked.query, "Th", "embedded", reading, names, typed[page["view"]])
    chosen = next(fn for fn in demo.fns.values() if fn.api_name == "choose_preset").fn
    handbook = chosen("handbook", typed[page["view"]])
    assert "learned facts in training" in handbook[page["setup"]]
    again = ask(preset("handbook").query, "A note.", "knower", reading, names, handbook[page["view"]])
    assert "private note" in again[page["setup"]]  # the preset's draw forgot the sentence it last sent
