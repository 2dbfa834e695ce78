"""The workshop's exercises hold in the stored runs, and a bad exercises file is refused field by field.

Each shipped exercise (assets/exercises.toml) is checked against the presets' stored runs of every
numeric mode (assets/precomputed/presets.json in bf16, presets-fp32.json in fp32; a page shows its own mode's):
the answer its explanation is written for (``expected``) is what the stored run gives, and what
else the explanation claims (``claims``) is there too. A regenerated presets file in which the
models answer otherwise fails here: then rewrite the exercise, never these definitions.
"""

from __future__ import annotations

import pytest

from kvviz.app.exercises import (
    EXERCISES,
    ExerciseError,
    agrees,
    answer_of,
    check_prediction,
    grade,
    reading_of,
    load_exercises,
    parse_exercises,
    stored_results,
    untrue_claims,
)
from kvviz.runtime.numerics import MODES
from tests.lesson_words import contradictions
from tests.stored_runs import STORED_BY_MODE

PRECOMPUTED: dict = {}  # the stored runs the running test reads: ``stored_runs`` sets it, once per mode
SHIPPED = EXERCISES.exercises
TOPICS = ("text vs cache", "KVComm's layers", "C2C and its control", "the translator and its swap", "cost")


@pytest.fixture(autouse=True, params=MODES)
def stored_runs(request):
    """Every test of this module, once on each numeric mode's stored runs."""
    global PRECOMPUTED
    PRECOMPUTED = STORED_BY_MODE[request.param]
    assert PRECOMPUTED.get("numerics") == request.param, f"no stored runs in {request.param}"


@pytest.mark.parametrize("exercise", SHIPPED, ids=[e.key for e in SHIPPED])
def test_each_exercise_expects_what_the_stored_run_gives(exercise):
    results = stored_results(exercise, PRECOMPUTED)
    assert results, f"{exercise.key}: no stored run for preset {exercise.preset} {exercise.run or ''}"
    answer = answer_of(exercise, results)
    assert answer is not None, f"{exercise.key}: the stored run does not answer it"
    # the explanation's answer, given as a prediction, is graded right; and the run's own answer agrees
    assert agrees(exercise, exercise.expected, answer), f"{exercise.key}: expects {exercise.expected!r}, the run gives {answer!r}"
    assert untrue_claims(exercise, results) == []


@pytest.mark.parametrize("exercise", [e for e in SHIPPED if e.run is None], ids=lambda e: e.key)
def test_every_column_ticked_each_explanation_says_what_the_evidence_says(exercise):
    """An explanation is read against its preset's stored run with every column in it (all 14): no
    sentence says the note got across by a column the evidence rule does not show it for."""
    crossed = set(reading_of(exercise, stored_results(exercise, PRECOMPUTED)).crossed())
    assert contradictions(exercise.explain, crossed) == [], exercise.key


@pytest.mark.parametrize("exercise", [e for e in SHIPPED if e.predict == "choice"], ids=lambda e: e.key)
def test_every_other_choice_is_graded_wrong(exercise):
    for choice in exercise.choices:
        assert grade(exercise, choice) == (choice == exercise.expected), (exercise.key, choice)


@pytest.mark.parametrize("exercise", [e for e in SHIPPED if e.predict == "number"], ids=lambda e: e.key)
def test_a_number_is_right_only_within_its_tolerance(exercise):
    answer = answer_of(exercise, stored_results(exercise, PRECOMPUTED))
    assert grade(exercise, str(answer))
    assert not grade(exercise, str(answer + exercise.tolerance + 1))
    assert not grade(exercise, "not a number")


def test_a_short_answer_is_right_when_it_names_the_words():
    exercise = next(e for e in SHIPPED if e.predict == "words")
    assert grade(exercise, f"I think {exercise.expected}")
    assert not grade(exercise, "nitrogen")


def test_the_sequence_fills_a_45_minute_workshop_over_every_topic():
    assert len(SHIPPED) >= 8
    assert 40 <= EXERCISES.minutes <= 50
    assert set(TOPICS) <= {e.topic for e in SHIPPED}
    kinds = {e.kind for e in SHIPPED}
    assert {"verdict", "follow", "layers"} <= kinds and kinds & {"seconds", "bytes"}
    assert len({e.key for e in SHIPPED}) == len(SHIPPED)


def test_an_exercise_on_a_live_question_is_checked_against_the_results_it_is_given():
    (own,) = parse_exercises([{
        "key": "own", "title": "Own", "ask": "Right?", "explain": "Because.", "query": "Which country is Ada in?",
        "context": "Ada is at the Eiffel Tower.", "answers": ["France"], "columns": ["text", "receiver"],
        "predict": "choice", "choices": ["right", "wrong"], "check": {"verdict": "text"}, "expected": "right"}])
    assert stored_results(own, PRECOMPUTED) is None
    results = [{"handoff": "text", "answer": "France.", "applicable": True},
               {"handoff": "receiver", "answer": "Spain", "applicable": True}]
    assert answer_of(own, results) == "right" and grade(own, "right", results)
    assert not grade(own, "right", [{**results[0], "answer": "Spain"}])
    assert not grade(own, "right")  # no stored run: nothing to be right about


VALID = {"key": "k", "title": "T", "ask": "A?", "explain": "E.", "preset": "locker", "predict": "choice",
         "choices": ["right", "wrong"], "check": {"verdict": "text"}, "expected": "right"}


@pytest.mark.parametrize("change, line", [
    ({"chek": {}}, "unknown field 'chek'"),
    ({"preset": "nowhere"}, "preset 'nowhere' is not in assets/presets.toml"),
    ({"run": "ratio 9"}, "run 'ratio 9' is not one of preset locker's runs"),
    ({"predict": "guess"}, "predict must be one of"),
    ({"check": {"verdict": "txt"}}, "check names 'txt', not a column of the page"),
    ({"check": {"verdict": "text", "layers": "kvcomm"}}, "exactly one of"),
    ({"choices": ["right", "maybe"]}, "choices must be two or more of"),
    ({"expected": "none"}, "expected must be one of the choices"),
    ({"predict": "number", "choices": []}, "needs a layers, seconds, bytes check"),
    ({"claims": {"rigth": ["text"]}}, "unknown claim(s) rigth"),
    ({"claims": {"follow": {"text": "maybe"}}}, "follow of text must be one of followed, kept, neither"),
    ({"title": ""}, "title must be a non-empty string"),
    ({"minutes": -1}, "minutes must be a positive number"),
])
def test_a_bad_field_gets_one_line_that_names_the_exercise_and_the_field(change, line):
    with pytest.raises(ExerciseError) as raised:
        parse_exercises([{**VALID, **change}])
    assert any(problem.startswith("exercise k: ") and line in problem for problem in raised.value.problems), raised.value.problems


def test_every_bad_field_of_every_exercise_is_listed_at_once(tmp_path):
    path = tmp_path / "exercises.toml"
    path.write_text('[[exercise]]\nkey = "a"\npredict = "guess"\n\n[[exercise]]\nkey = "a"\ntitle = "B"\n', encoding="utf-8")
    with pytest.raises(ExerciseError) as raised:
        load_exercises(path)
    problems = raised.value.problems
    assert any("exercise a: predict must be one of" in p for p in problems)
    assert any("exercise a: the key is used twice" in p for p in problems)
    assert sum("ask must be a non-empty string" in p for p in problems) == 2


def test_a_prediction_the_exercise_cannot_take_gets_one_line():
    choice = next(e for e in SHIPPED if e.predict == "choice")
    number = next(e for e in SHIPPED if e.predict == "number")
    assert check_prediction(choice, choice.choices[0]) is None
    assert check_prediction(choice, "") == "Give a prediction first."
    assert check_prediction(choice, "perhaps").startswith("Choose one of:")
    assert check_prediction(number, "nine") == "Give a number (digits, a dot for decimals)."
