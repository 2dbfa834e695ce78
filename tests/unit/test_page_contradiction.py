"""Insert a contradiction on the page (issue 43): the second counterfactual under *Swap the fact*.

The reading of a contradiction run (which answer each column gave, which answer's first token it
finds likelier, what giving the inserted value is evidence of by its control), its card row and
status line, the form's refusals, a preset's fluent default, and the page's handler with the engine
scripted: the note, then the contradicted note, with the same requests as ``run --contradict``.
"""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.app import present, ui
from kvviz.app.page import spec, views
from kvviz.app.page.running import page_stream_roles
from kvviz.app.presets import PRESETS, load_precomputed, preset
from kvviz.app.reading import catalog, evidence
from kvviz.app.reading.questions import Question, parse_claims
from kvviz.data.contradictions import typed_contradiction
from kvviz.engine.contradiction import contradiction_record
from kvviz.engine.events import Done

PRECOMPUTED = load_precomputed()
NOTE = "The code for locker 12 is 4471. The gym closes at nine."
SENTENCE = "The code for locker 12 is 3902."
CONTRADICTED = "The code for locker 12 is 4471. The code for locker 12 is 3902. The gym closes at nine."


def lens(p_gold: float, p_counter: float | None = None, gold_token: str = "44", counter_token: str = "39") -> dict:
    """A result's logit lens as ``kvviz.runtime.crossed`` records it (three layers, the last is the receiver's)."""
    out = {"gold": "4471", "gold_token": gold_token, "gold_probability": [0.0, 0.1, p_gold]}
    if p_counter is not None:
        out.update(counter="3902", counter_token=counter_token, counter_probability=[0.0, 0.05, p_counter])
    return out


def result(name: str, answer: str, logit_lens: dict | None = None) -> dict:
    return {"handoff": name, "applicable": True, "answer": answer, "timings": {"total": 0.5}, "bytes_communicated": 0,
            "tokens": {"generated": 1}, "seen": {"receiver": "prompt"}, **({"logit_lens": logit_lens} if logit_lens else {})}


def contradiction_payload(said: dict[str, tuple[str, str, float, float]], answers=("4471",)) -> dict:
    """A payload whose columns ran on the note and on the contradicted note: name -> (answer on the
    note, answer on the contradicted note, P(gold), P(counter) there), judged by ``answers``."""
    made = typed_contradiction(NOTE, SENTENCE, ["4471"], ["3902"])
    originals = {name: result(name, plain, lens(0.9, 0.01)) for name, (plain, _, _, _) in said.items()}
    others = {name: result(name, other, lens(p_gold, p_counter)) for name, (_, other, p_gold, p_counter) in said.items()}
    base = {"pair": "embedded", "request": {"query": "What is the code for locker 12?", "context": NOTE}, "preset": None}
    return views.with_contradiction(base, originals, others, list(said), made, list(answers))


def test_the_reading_says_which_answer_each_column_gave_and_what_its_control_says_of_it():
    payload = contradiction_payload({
        "receiver": ("12", "12", 0.01, 0.01),
        "text": ("4471", "3902", 0.2, 0.7),  # the inserted value, its control (the receiver) not: differs
        "kvcomm": ("4471", "3902", 0.3, 0.6),
        "kvcomm_control": ("3902", "3902", 0.1, 0.8),  # its control gives it anyway: not needed
        "skyline": ("4471", "4471", 0.8, 0.1),  # the original, no control
    })
    reading = views.reading_of(payload, ["4471"])
    assert reading.contradiction_shown and reading.contradiction["sentence"] == SENTENCE
    assert reading.contradiction_outcomes(["skyline", "text", "receiver", "kvcomm"]) == {
        "receiver": "neither", "text": "counter", "kvcomm": "counter", "skyline": "gold"}
    text, kvcomm, skyline = (reading.column(name).contradicted for name in ("text", "kvcomm", "skyline"))
    assert (text.p_gold, text.p_counter, text.p_gold_clean, text.p_counter_clean) == (0.2, 0.7, 0.9, 0.01)
    assert text.leans == "counter" and skyline.leans == "gold"  # from the last layer's probabilities
    assert text.evidence == evidence.DIFFERS and kvcomm.evidence == evidence.NOT_NEEDED
    assert skyline.evidence is None  # it did not give the inserted value
    assert reading.column("receiver").contradicted.evidence is None
    assert reading.answer(Question("contradicted", "text")) == "counter"
    assert reading.answer(Question("contradicted", "c2c")) is None  # no result, nothing to say
    # the plain note's evidence is the swap's rule as before: untouched by the contradiction
    assert reading.column("text").evidence == evidence.DIFFERS


def test_a_column_the_contradicted_note_did_not_judge_is_not_counted_and_one_first_token_tells_nothing():
    made = typed_contradiction("It is 4471.", "It is 4490.", ["4471"], ["4490"])
    same = contradiction_record(result("text", "4471"), result("text", "4490", lens(0.4, 0.4, "44", "44")), made, ["4471"])
    assert same["same_first_token"] and same["outcome"] == "counter"
    failed = contradiction_record(result("kvcomm", "4471"), {"applicable": False, "reason": "no"}, made, ["4471"])
    payload = {"pair": "embedded", "request": {}, "results": [{**result("text", "4471"), "contradiction": same},
                                                              {**result("kvcomm", "4471"), "contradiction": failed}]}
    reading = views.reading_of(payload, ["4471"])
    assert reading.column("text").contradicted.leans is None  # one token for both: the probabilities cannot tell
    assert reading.column("kvcomm").contradicted.mark == "notrun" and reading.contradiction_outcomes(["text", "kvcomm"]) == {
        "text": "counter"}


def test_a_contradicted_cards_row_names_its_answer_and_both_probabilities_and_the_status_sums_up():
    payload = contradiction_payload({"receiver": ("12", "12", 0.004, 0.0004), "text": ("4471", "3902", 0.2, 0.7),
                                     "kvcomm": ("4471", "4471", 0.62, 0.21)})
    reading = views.reading_of(payload, ["4471"])
    update = views.contradiction_view(reading, ["receiver", "text", "kvcomm"])
    assert 'data-contradicted="counter"' in update["head:text"] and 'data-contradicted="gold"' in update["head:kvcomm"]
    assert "first token: 4471 90% → 62% · 3902 1.0% → 21%" in update["head:kvcomm"]
    assert "4471 90% → 0.4% · 3902 1.0% → &lt;0.1%" in update["head:receiver"]
    text, kvcomm, receiver = (catalog.label_of(name) for name in ("text", "kvcomm", "receiver"))
    assert f"{text} gave the inserted value" in update["head:text"]  # its meaning, on hover
    assert "differs from its control" in update["head:text"]
    long = contradiction_payload({"text": ("4471", "The code is " + "very " * 30 + "long.", 0.1, 0.2)})
    head = views.card("text", views.reading_of(long, ["4471"]))["head:text"]
    assert "with the contradiction: “The code is very" in head and "…”" in head and "very long.\"" in head  # all on hover
    status = update["status"]
    assert "contradicted note" in status and SENTENCE in status
    assert f"Gave the inserted value “3902”: **{text}**" in status and f"kept the original “4471”: **{kvcomm}**" in status
    assert f"gave neither: **{receiver}**" in status
    # a swap shown afterwards keeps the contradiction's row (the same note's run), and the other way round
    assert 'data-contradicted=' not in views.card("text", views.reading_of({**payload, "contradiction_shown": False},
                                                                           ["4471"]))["head:text"]


@pytest.mark.parametrize("context, expected, sentence, counter, said", [
    ("", "4471", SENTENCE, "3902", "needs a note"),
    (NOTE, "4471", "   ", "3902", "is empty"),
    (NOTE, "4471", SENTENCE, "", "Say what the contradicting sentence answers"),
    (NOTE, "4471", "The code for locker 12 is 4471.", "4471", "another value than the expected answer"),
    (NOTE, "4471", "The gym closes at nine.", "3902", "already in the note"),
    (NOTE, "4471", "The code is 3902, as is 4471.", "3902", "states the expected answer"),
    (NOTE, "", SENTENCE, "3902", "needs the expected answer"),
])
def test_a_contradiction_the_form_cannot_make_says_why(context, expected, sentence, counter, said):
    with pytest.raises(ValueError, match=said):
        spec.contradiction_from_form(context, expected, sentence, counter)


def test_the_typed_sentence_goes_right_after_the_sentence_that_states_the_answer():
    made = spec.contradiction_from_form(NOTE, "4471; four four seven one", SENTENCE, "3902")
    assert made.context == CONTRADICTED and made.answers == ("3902",) and made.sentence == SENTENCE


def test_a_preset_fills_a_fluent_contradiction_from_its_swap():
    picked = preset("locker")
    fields = views.swap_fields(picked)
    assert fields["contra_sentence"] == SENTENCE and fields["contra_answer"] == "3902"
    assert all(p.contradiction is not None for p in PRESETS if p.swap is not None and p.swap.pair is None)
    assert all(p.contradiction is None for p in PRESETS if p.swap is not None and p.swap.pair is not None)  # the sharer's
    for picked in PRESETS:  # each default is one the form takes as it is
        if picked.contradiction is not None:
            fields = views.swap_fields(picked)
            made = spec.contradiction_from_form(picked.context, spec.expected_text(picked.answers),
                                                fields["contra_sentence"], fields["contra_answer"])
            assert made.context == picked.contradiction.context, picked.key
    assert views.cleared_question()["contra_sentence"] == ""


def test_the_vocabulary_asks_which_answer_a_column_gave():
    claims, problems = parse_claims({"contradicted": {"text": "counter"}}, "here")
    assert not problems and claims[0].question == Question("contradicted", "text")
    assert parse_claims({"contradicted": {"text": "followed"}}, "here")[1]  # a swap's word is not an answer here


# --- the page's handler, the engine scripted ---------------------------------------------------------


def contradict_handler(demo):
    return next(fn for fn in demo.fns.values() if fn.api_name == "contradict_on_page").fn


def contradict_updates(demo, context, expected, names, fields, reading=None, tab=None):
    page = demo.kvviz_page
    request = type("Request", (), {"session_hash": "contradict"})()
    settings = [4, False, 0.7, 0] + [o.option.default if not o.option.auto else True for o in page.specs
                                     for _ in range(o.inputs)]
    shown = ["" for _ in page_stream_roles()]
    view = {"tab": tab or spec.DEFAULT_TAB}
    updates = list(contradict_handler(demo)("embedded", "What is the code for locker 12?", context, expected, names,
                                            view, *fields, reading, request, *settings, *shown))
    return [dict(zip(page_stream_roles(), values[:-1]), results=values[-1]) for values in updates]


def test_insert_a_contradiction_runs_the_note_then_the_contradicted_note_and_reads_each_column(monkeypatch):
    from kvviz.app.page import run as page_run
    from kvviz.app.page import running

    said = {NOTE: {"receiver": "12", "text": "4471", "kvcomm": "4471"},
            CONTRADICTED: {"receiver": "12", "text": "3902", "kvcomm": "4471"}}
    ran = []

    def scripted(run, workers, stop, batches=None):
        ran.append((run.request.context, list(run.names), dict(run.request.inspect or {})))
        p_counter = 0.6 if run.request.context == CONTRADICTED else 0.02
        script = [Done(name, result(name, said[run.request.context][name], lens(0.3, p_counter))) for name in run.names]
        return page_run.stream_run(run, workers, stop, batches=_one_by_one(script))

    monkeypatch.setattr(running, "stream_run", scripted)
    demo = ui.build_demo(precomputed=PRECOMPUTED, sweep=None)
    names = ["receiver", "text", "kvcomm"]
    updates = contradict_updates(demo, NOTE, "4471", names, (SENTENCE, "3902"))
    assert [(context, columns) for context, columns, _ in ran] == [(NOTE, names), (CONTRADICTED, names)]
    assert all(inspect.get("gold") == "4471" and inspect.get("counter") == "3902" for _, _, inspect in ran)  # both lenses
    # the cards read the lens: both runs record it, whatever the tab in view shows of what crossed
    assert all("lens" in (inspect.get("parts") or spec.PARTS) for _, _, inspect in ran)
    final = updates[-1]
    records = {r["handoff"]: r["contradiction"] for r in final["results"].payload["results"]}
    assert {name: record["outcome"] for name, record in records.items()} == {
        "receiver": "neither", "text": "counter", "kvcomm": "gold"}
    assert records["text"]["p_counter"] == 0.6 and records["text"]["p_counter_clean"] == 0.02
    assert 'data-contradicted="counter"' in final["head:text"] and "Insert a contradiction" not in final["status"]
    assert "contradicted note" in final["status"]
    assert all(u["results"] == gr.skip() for u in updates[:-1])  # the tabs draw once, at the end
    assert any("**Insert a contradiction**, on the contradicted note" in u["status"] for u in updates[:-1])

    ran.clear()  # the note's answers are on the page for these settings: only the contradicted note runs
    again = contradict_updates(demo, NOTE, "4471", names, (SENTENCE, "3902"), final["results"])
    assert [context for context, _, _ in ran] == [CONTRADICTED]
    assert again[-1]["results"].column("text").contradicted.outcome == "counter"


@pytest.mark.parametrize("context, fields, said", [
    ("", (SENTENCE, "3902"), "needs a note"),
    (NOTE, ("", "3902"), "is empty"),
    (NOTE, ("The code for locker 12 is 4471.", "4471"), "another value than the expected answer"),
])
def test_a_contradiction_the_page_cannot_make_says_why_in_the_status_line_alone(monkeypatch, context, fields, said):
    from kvviz.app.page import running

    monkeypatch.setattr(running, "stream_run", lambda *a, **k: pytest.fail("a refused contradiction runs nothing"))
    demo = ui.build_demo(precomputed=PRECOMPUTED, sweep=None)
    (update,) = contradict_updates(demo, context, "4471", ["text"], fields)
    assert "Not run" in update["status"] and said in update["status"] and update["results"] == gr.skip()


def _one_by_one(script):
    def batches(pair, request, names, workers, stop=None, idle=None):
        for event in script:
            yield [event]

    return batches


def test_the_status_line_of_a_run_nobody_could_judge_says_so():
    reading = views.reading_of(contradiction_payload({"text": ("4471", "3902", 0.1, 0.2)}, answers=()), [])
    assert "No column could be judged" in present.contradiction_status(reading, ["text"])


def test_the_plain_notes_probabilities_come_only_from_a_lens_that_followed_the_same_answers():
    """A preset's stored run followed the gold alone: its P(gold) shows, no P(counter); a run made for
    another contradicting value does not lend this one its counter's probability."""
    made = typed_contradiction(NOTE, SENTENCE, ["4471"], ["3902"])
    contradicted = result("text", "4471", lens(0.5, 0.3))
    gold_only = lens(0.9)
    other_counter = {**lens(0.9, 0.2), "counter": "8125"}
    record = contradiction_record(result("text", "4471", gold_only), contradicted, made, ["4471"])
    assert (record["p_gold_clean"], record["p_counter_clean"]) == (0.9, None)
    record = contradiction_record(result("text", "4471", other_counter), contradicted, made, ["4471"])
    assert (record["p_gold_clean"], record["p_counter_clean"]) == (0.9, None)
    assert contradiction_record(result("text", "4471", lens(0.9, 0.2)), contradicted, made, ["4471"])["p_counter_clean"] == 0.2
    # a stored run whose lens followed another first token of the same answer (" " before "4471") is no baseline
    other_token = contradiction_record(result("text", "4471", lens(0.17, gold_token=" ")), contradicted, made, ["4471"])
    assert other_token["p_gold_clean"] is None
    payload = {"pair": "embedded", "request": {}, "contradiction": made.to_dict(), "contradiction_shown": True,
               "results": [{**result("text", "4471"), "contradiction": contradiction_record(
                   result("text", "4471", gold_only), contradicted, made, ["4471"])}]}
    head = views.card("text", views.reading_of(payload, ["4471"]))["head:text"]
    assert "first token: 4471 90% → 50% · 3902 30%" in head
