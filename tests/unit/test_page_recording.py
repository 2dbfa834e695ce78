"""What a run records of what crossed, and what a tab records when it opens (issue 42: the page
records only what it shows), without a browser or a model: ``/run`` records nothing unless asked for
``attention`` (then every part); the page's run records the parts of the tab in view; What crossed,
Depth and Compare two opened on a live run without their parts run the same request again for them
(through the shared runs), keep them only for the columns whose answers came out the same, say so in
the tab, and draw it. The engine is scripted (``kvviz.app.page.run.stream_run`` with a script of
events); tests/integration/test_browser*.py drive the real path in Chromium."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.app import compare, present, ui
from kvviz.app.page import recording, spec, views
from kvviz.app.page import run as page_run
from kvviz.app.presets import load_precomputed
from kvviz.app.reading import catalog
from kvviz.engine.events import Computation, Done, Lens, Scored
from kvviz.engine.shared_runs import SharedRuns
from kvviz.runtime.crossed import PARTS, inspection_for
from tests.unit.test_page import fake_result, one_by_one, spec_default

PRECOMPUTED = load_precomputed()
PRESET_RUNS = views.PresetRuns(PRECOMPUTED, "embedded")
FIELDS = ("token_attention", "logit_lens", "token_change")
REQUEST = type("Request", (), {"session_hash": "recording-test"})()


@pytest.fixture(scope="module")
def demo():
    return ui.build_demo(precomputed=PRECOMPUTED, sweep=None)


def handler(demo, api_name: str):
    return next(fn for fn in demo.fns.values() if fn.api_name == api_name).fn


def settings_of(page) -> list:
    return [4, False, 0.7, 0] + [spec_default(option) for option in page.specs for _ in range(option.inputs)]


def asked_requests(monkeypatch, module) -> list:
    """Every request ``module``'s runs hand to the engine; each run answers "4471" on every column."""
    asked = []

    def scripted(run, workers, stop, batches=None):
        asked.append(run.request)
        script = [Done(name, fake_result(name, "4471")) for name in run.names]
        return page_run.stream_run(run, workers, stop, batches=one_by_one(script))

    monkeypatch.setattr(module, "stream_run", scripted)
    return asked


# --- what a run asks for ---------------------------------------------------------------------------


def test_run_endpoint_records_nothing_without_attention_and_every_part_with_it(demo, monkeypatch):
    from kvviz.app.page import running

    asked = asked_requests(monkeypatch, running)
    run = handler(demo, "run")
    form = ("embedded", "What is the code?", "It is 4471.", *settings_of(demo.kvviz_page), ["receiver"])
    plain = list(run(*form, False))[-1]
    recorded = list(run(*form, True))[-1]
    assert asked[0].inspect is None and inspection_for(asked[0]) is None
    assert inspection_for(asked[1]).parts == frozenset(PARTS)  # every part, as before
    # /run's last update, as sent: one value per output (running.api_outputs), the results last
    assert plain[-1]["request"]["inspect"] is None and recorded[-1]["request"]["inspect"] is not None
    monkeypatch.setenv("KVVIZ_RECORD_CROSSED", "0")  # still means: record nothing
    list(run(*form, True))
    assert asked[2].inspect is None


@pytest.mark.parametrize("tab", [tab for tab, _ in spec.TABS])
def test_a_page_run_asks_only_for_the_parts_of_the_tab_in_view(demo, monkeypatch, tab):
    from kvviz.app.page import running

    asked = asked_requests(monkeypatch, running)
    page = demo.kvviz_page
    shown = ["" for _ in running.page_stream_roles()]
    list(handler(demo, "run_on_page")("embedded", "What is the code?", "It is 4471.", "4471", ["receiver"],
                                      {"tab": tab}, REQUEST, *settings_of(page), *shown))
    (request,) = asked
    expected = {"tokens": {"attention", "scores"}, "lens": {"lens"}, "compare": set(PARTS)}.get(tab, set())
    assert (inspection_for(request).parts if expected else inspection_for(request)) == (expected or None), tab
    if expected:
        assert request.inspect["gold"] == "4471"  # the lens follows the expected answer


# --- what a tab records when it opens ----------------------------------------------------------------


def live_run_of(key: str = "locker", stamp: str = "shared:test-1"):
    """A preset's stored run as a live run that recorded nothing (its results without what crossed),
    and the stored results (which hold every part) by column."""
    payload, _, stored = PRESET_RUNS(key)
    results = [{k: v for k, v in raw.items() if k not in FIELDS + ("precomputed",)} for raw in payload["results"]]
    live = dict(present.payload(payload["pair"], {**payload["request"], "inspect": None}, results, False, key), stamp=stamp)
    return views.reading_of(live, stored.answers), {raw["handoff"]: raw for raw in payload["results"]}


def recorded_by(monkeypatch, stored: dict, differs: str | None = None) -> list:
    """The recording runs: each request and its columns; each run answers as ``stored`` does (but
    ``differs``), its result's attention with it, then its scores and lens as the engine sends them."""
    ran = []

    def scripted(run, workers, stop, batches=None):
        assert isinstance(getattr(batches, "__self__", None), SharedRuns)  # through the server's shared runs
        ran.append((run.request, list(run.names)))
        script = [Computation("test-2")]
        for name in run.names:
            raw = {k: v for k, v in stored[name].items() if k not in ("logit_lens", "token_change", "precomputed")}
            if name == differs:
                raw["answer"] = raw["answer"] + " (otherwise)"
            script += [Done(name, raw), Scored(name, stored[name]["token_change"]), Lens(name, stored[name]["logit_lens"])]
        return page_run.stream_run(run, workers, stop, batches=one_by_one(script))

    monkeypatch.setattr(recording, "stream_run", scripted)
    return ran


def open_tab(demo, tab: str, reading, names):
    """The tab opened on ``reading``: what ``record_for_tab`` yields, then what ``show_recorded`` shows."""
    page = demo.kvviz_page
    view = {"tab": tab, "compact": False, "drawn": {}, "ready": True}
    yields = list(handler(demo, "record_for_tab")(reading, view, REQUEST))
    shown = handler(demo, "show_recorded")(yields[-1].get(page["recorded"]), reading, names, view)
    return yields, shown


def test_opening_what_crossed_on_a_live_run_records_its_parts_with_the_same_answers_and_draws_it(demo, monkeypatch):
    page = demo.kvviz_page
    reading, stored = live_run_of()
    names = [column.name for column in reading.finished()]
    ran = recorded_by(monkeypatch, stored, differs="text")
    yields, shown = open_tab(demo, "tokens", reading, names)
    assert "Recording the attention rows and the scores against the controls" in yields[0][page["recorded_tokens"]]
    assert "Recording" in yields[0][page["tokens"]]  # the tab says so while it records
    ((request, columns),) = ran
    assert columns == names and request.inspect == {"gold": "4471", "parts": ["attention", "scores"]}
    assert {k: v for k, v in request.to_dict().items() if k != "inspect"} == \
        {k: v for k, v in reading.request.items() if k != "inspect"}  # the run's own request
    merged = shown[page["reading"]]
    assert merged.stamp == "shared:test-1+test-2" and shown[page["results"]] is merged.payload
    assert spec.recorded_parts(merged.request) == {"attention", "scores"}
    for name in names:
        result, was = merged.result(name), stored[name]
        assert result.answer == reading.result(name).answer and not result.logit_lens  # the lens was not asked for
        if name == "text":  # answered otherwise when recorded again: nothing of that run is shown
            assert not result.token_attention and not result.token_change
        else:
            assert result.token_attention == was["token_attention"] and result.token_change == was["token_change"]
    line = shown[page["recorded_tokens"]]
    assert "Recorded when this tab opened" in line and f"**{catalog.label_of('text')}** answered differently" in line
    assert 'class="kv-tv"' in shown[page["tokens"]] and "vs KVComm control" in shown[page["tokens"]]
    # opened again: it holds them, nothing runs; on Depth only the lens is recorded, the rest kept
    again, _ = open_tab(demo, "tokens", merged, names)
    assert list(again[-1]) == [page["status"]] and len(ran) == 1
    yields, shown = open_tab(demo, "lens", merged, names)
    assert ran[-1][0].inspect["parts"] == ["lens"]
    deeper = shown[page["reading"]]
    assert deeper.result("kvcomm").logit_lens == stored["kvcomm"]["logit_lens"]
    assert deeper.result("kvcomm").token_attention == stored["kvcomm"]["token_attention"]
    assert spec.recorded_parts(deeper.request) == set(PARTS)
    assert "the logit lens" in shown[page["recorded_lens"]] and shown[page.figures[spec.LENS_PLOT]].data


def test_a_recording_for_a_run_the_page_no_longer_shows_changes_nothing(demo, monkeypatch):
    page = demo.kvviz_page
    reading, stored = live_run_of()
    recorded_by(monkeypatch, stored)
    view = {"tab": "tokens", "compact": False, "drawn": {}, "ready": True}
    recorded = list(handler(demo, "record_for_tab")(reading, view, REQUEST))[-1][page["recorded"]]
    other, _ = live_run_of(stamp="shared:another-run")  # the learner ran again meanwhile
    shown = handler(demo, "show_recorded")(recorded, other, ["kvcomm"], view)
    assert page["reading"] not in shown and shown[page["recorded"]] is None


def test_presets_and_pages_that_record_nothing_never_run_a_model_when_a_tab_opens(demo, monkeypatch):
    page = demo.kvviz_page
    monkeypatch.setattr(recording, "stream_run", lambda *a, **k: pytest.fail("nothing to record: no run"))
    _, _, stored = PRESET_RUNS("locker")
    for tab in spec.TAB_PARTS:
        yields, shown = open_tab(demo, tab, stored, ["kvcomm"])  # a preset's stored run holds every part
        assert list(yields[-1]) == [page["status"]] and page["reading"] not in shown
    reading, _ = live_run_of()
    yields, _ = open_tab(demo, "layers", reading, ["kvcomm"])  # a tab that shows none of it
    assert list(yields[-1]) == [page["status"]]
    monkeypatch.setenv("KVVIZ_RECORD_CROSSED", "0")
    yields, _ = open_tab(demo, "tokens", reading, ["kvcomm"])
    assert list(yields[-1]) == [page["status"]] and yields[-1][page["status"]] == gr.skip()


def test_a_recording_that_cannot_finish_says_why_in_the_tab(demo, monkeypatch):
    from kvviz.engine.events import Failed

    page = demo.kvviz_page
    reading, _ = live_run_of()

    def failing(run, workers, stop, batches=None):
        return page_run.stream_run(run, workers, stop, batches=one_by_one([Failed("the queue is full")]))

    monkeypatch.setattr(recording, "stream_run", failing)
    yields, shown = open_tab(demo, "lens", reading, ["kvcomm"])
    assert "Could not record the logit lens" in yields[-1][page["recorded_lens"]]
    assert "the queue is full" in yields[-1][page["recorded_lens"]] and page["reading"] not in shown


def test_compare_two_keeps_a_run_recorded_when_a_tab_opened_in_the_runs_place():
    reading, stored = live_run_of()
    history = compare.remember(compare.remember([], PRESET_RUNS("fuji")[2]), reading)
    payload, _ = recording.merged_payload(reading, stored, PARTS, "shared:test-1+test-2")
    merged = views.reading_of(payload, reading.answers)
    after = compare.remember(history, merged)
    assert [entry["number"] for entry in after] == [1, 2] and after[1]["reading"].stamp == merged.stamp
    assert compare.sent_mass(after[1]["reading"].result("kvcomm"))[1]  # what the diff reads is there now


def test_a_tab_opening_names_only_what_a_tab_draws_as_its_outputs(demo):
    """Each output an update leaves as it was costs the server's event loop a fresh component: a tab's
    opening names what any tab draws (``lab.drawn_outputs``), and every update a tab draws lands there."""
    from kvviz.app.page import tabs
    from kvviz.app.page.lab import drawn_outputs

    page = demo.kvviz_page
    drawn = drawn_outputs(page)
    assert len(drawn) < len(page.outputs()) / 2
    reading, _ = live_run_of()
    for tab, _title in spec.TABS:
        event = next(fn for fn in demo.fns.values() if fn.api_name == f"open_{tab}")
        assert list(event.outputs) == drawn, tab
        updates, view = tabs.tab_updates(tab, reading, ["kvcomm", "kvcomm_control"], {"drawn": {}}, tabs.FigureCache())
        assert set(page.resolve({**updates, "view": view})) <= set(drawn), tab


# --- what a streamed update sends ------------------------------------------------------------------


@pytest.mark.parametrize("api_name", ["run", "run_on_page", "swap_on_page", "contradict_on_page"])
def test_a_run_sent_as_is_sends_what_gradios_own_postprocess_would(demo, api_name):
    """The live runs serialize their values in their worker (``as_sent``) and are wired not to be
    postprocessed again: what the event loop then sends must be what Gradio's postprocess makes of
    the same values (a figure, a table, text with its indentation, a JSON payload, None)."""
    import asyncio

    import plotly.graph_objects as go
    from gradio.state_holder import SessionState

    from kvviz.app.page.lab import as_sent

    fn = next(fn for fn in demo.fns.values() if fn.api_name == api_name)
    assert fn.postprocess is False  # wired SENT_AS_IS
    samples = {"Markdown": "  **status**\n    indented", "Textbox": " 4471 ", "HTML": "<b>seen</b>",
               "Plot": go.Figure(go.Bar(x=["a", "b"], y=[1, 2])), "Dataframe": [["receiver", "4471"]],
               "JSON": {"pair": "embedded", "results": [1, 2]}, "State": {"kept": True}}
    for empty in (False, True):
        raw = [None if empty else samples[type(output).__name__] for output in fn.outputs]

        def sent(values, postprocess):
            fn.postprocess = postprocess
            try:
                return asyncio.run(demo.postprocess_data(fn, values, SessionState(demo)))
            finally:
                fn.postprocess = False

        assert sent(as_sent(fn.outputs, raw), False) == sent(raw, True)
