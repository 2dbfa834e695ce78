"""Tests for kvviz.data: dataset loaders, generic files, metrics.

Tests that read the real datasets use the ``shared_data_dir`` fixture: when
../shared/data (or $KVVIZ_DATA_DIR) is missing they are skipped, except on CI
(CI=true) where a missing data folder is a failure, not a silent skip.
"""

from __future__ import annotations

import json
import os
import warnings
from collections import Counter
from pathlib import Path

import pytest

from kvviz.data import (
    DATASETS,
    LoadReport,
    Record,
    contains_answer,
    extract_choice_letter,
    f1_match,
    format_choices,
    format_p,
    get_data_dir,
    load_dataset,
    load_dataset_with_report,
    mcnemar_exact,
    normalize_answer,
    paired_mcnemar,
    token_f1,
    verdict,
    wilson_interval,
)

# ---------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The shared data folder; skip (or fail on CI) when it is not there."""
    try:
        return get_data_dir()
    except FileNotFoundError as exc:
        reason = f"shared datasets not available: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: the data must be present on CI)")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def mmlu_all(shared_data_dir):
    """All 5,700 MMLU-Redux rows (error rows kept), loaded once."""
    return load_dataset_with_report("mmlu_redux", keep_errors=True)


def write_jsonl(path: Path, lines: list) -> Path:
    """Write objects as JSON lines; str items are written verbatim (for bad lines)."""
    path.write_text(
        "".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in lines),
        encoding="utf-8",
    )
    return path


# ---------------------------------------------------------------------------
# Named datasets: counts from each SOURCE.txt
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, options, expected",
    [
        ("countries", {}, 200),
        ("tipsheets", {}, 500),
        ("hotpotqa", {}, 103),
        ("hotpotqa", {"all_paragraphs": True}, 103),
        ("arc_challenge", {}, 1172),
        ("openbookqa", {}, 500),
        ("openbookqa", {"split": "dev"}, 500),
        ("openbookqa", {"with_fact": True}, 500),
        ("mmlu_redux", {}, 5330),
        ("mmlu_redux", {"keep_errors": True}, 5700),
        ("dolly", {}, 5000),
        ("instructions", {}, 1100),
    ],
)
def test_named_dataset_counts(shared_data_dir, name, options, expected):
    records, report = load_dataset_with_report(name, **options)
    assert len(records) == expected
    assert report.problems == []
    assert all(isinstance(r, Record) and r.question.strip() for r in records)
    assert len({r.id for r in records}) == len(records), "ids must be unique"


def test_every_registered_name_is_tested():
    assert set(DATASETS) == {
        "countries", "tipsheets", "hotpotqa", "recall", "arc_challenge",
        "openbookqa", "mmlu_redux", "dolly", "instructions", "whereabouts", "handbook",  # handbook: tests/unit/test_knower.py
    }


def test_recall_is_a_dataset_made_here_held_out_by_default():
    records = load_dataset("recall", n=12)
    assert len(records) == 12 and all(r.source == "recall" and "-heldout-" in r.id for r in records)
    assert load_dataset("recall", n=12) == records  # seeded
    assert load_dataset("recall", n=5, split="train", data_seed=1)[0].id == "recall-train-1-0"


def test_whereabouts_is_held_out_by_landmark_city_and_person():
    """Held-out who-is-where records name landmarks, cities and people that no training record names;
    the page's presets' landmarks are held out; notes hold one to three people in different countries."""
    from kvviz.data import whereabouts

    records = load_dataset("whereabouts", n=30)
    assert len(records) == 30 and all(r.source == "whereabouts" and "-heldout-" in r.id for r in records)
    assert load_dataset("whereabouts", n=30) == records  # seeded
    assert [r.meta["people"] for r in records[:6]] == [1, 2, 3, 1, 2, 3]
    for kind in ("landmark", "city"):
        train, held = (dict(whereabouts.places(kind, s)) for s in ("train", "heldout"))
        assert train and held and not set(train) & set(held)
    assert set(whereabouts.PRESET_LANDMARKS) <= set(dict(whereabouts.places("landmark", "heldout")))
    assert not set(whereabouts.first_names("train")) & set(whereabouts.first_names("heldout"))
    train_places = {p for p, _ in whereabouts.places("landmark", "train") + whereabouts.places("city", "train")}
    for record in records:
        placed = [record.meta] + record.meta["others"]
        assert len(placed) == record.meta["people"] and record.meta["person"] in record.question
        assert len({p["country"] for p in placed}) == len(placed)
        assert all(p["landmark"] in record.context and p["landmark"] not in train_places for p in placed)
        assert record.answers[0] == record.meta["country"]
    mixed = whereabouts.generate("train", 40, seed=1, cities=0.5)
    assert {r.meta["landmark"] for r in mixed} & dict(whereabouts.places("city", "train")).keys()
    assert "USA" in whereabouts.answers_for("United States")


def test_countries_shape(shared_data_dir):
    records = load_dataset("countries")
    first = records[0]
    assert first.id == "countries_0000"
    assert first.context == "Uma is at the Mahaffie House."
    assert first.question == "Which country is Uma located in?"
    assert first.answers == ["United States"]
    assert not first.is_multiple_choice and first.answer_letter is None


def test_countries_split_holds_out_the_evaluators_sample_and_its_landmarks(shared_data_dir):
    from kvviz.studies.c2c.translator_sets import countries_split, heldout_sets

    train, held = countries_split()
    assert [r.id for r in held] == [r.id for r in heldout_sets(0, 100)["countries"]]
    assert not {r.id for r in train} & {r.id for r in held}
    assert not {r.meta.get("landmark") for r in train} & {r.meta.get("landmark") for r in held}
    assert train and len(train) + len(held) <= len(load_dataset("countries"))


def test_tipsheets_shape(shared_data_dir):
    records = load_dataset("tipsheets")
    for r in records:
        assert len(r.choices) == 3
        assert r.answers == [r.choices[r.answer_index]]
        assert r.question.endswith("The company name is:")
        assert r.context
    first = records[0]
    assert first.answers == ["Sable LLC"] and first.answer_letter == "B"


def test_arc_option_counts(shared_data_dir):
    records = load_dataset("arc_challenge")
    assert Counter(len(r.choices) for r in records) == {4: 1165, 3: 4, 5: 3}
    first = records[0]
    assert first.id == "Mercury_7175875"
    assert first.answer_letter == "C"
    assert first.answers == ["Planetary days will become shorter."]


def test_openbookqa_fact_as_context(shared_data_dir):
    plain = load_dataset("openbookqa")
    with_fact = load_dataset("openbookqa", with_fact=True)
    assert all(r.context is None for r in plain)
    assert all(r.context for r in with_fact)
    # Same questions, same answers: the *_complete file only adds fact1.
    assert [(r.id, r.answer_index) for r in plain] == [(r.id, r.answer_index) for r in with_fact]
    assert with_fact[0].context == "using less resources usually causes money to be saved"
    with pytest.raises(ValueError, match="split"):
        load_dataset("openbookqa", split="train")


def test_instruction_data_shape(shared_data_dir):
    dolly = load_dataset("dolly")
    assert sum(r.context is not None for r in dolly) == 1427  # SOURCE.txt: non-empty input
    rasbt = load_dataset("instructions")
    assert all(r.response is not None and r.answers == [] for r in dolly + rasbt)
    third = rasbt[2]
    assert third.question == "Convert 45 kilometers to meters."
    assert third.context is None  # input "" becomes None
    assert third.response == "45 kilometers is 45000 meters."


# ---------------------------------------------------------------------------
# HotpotQA contexts
# ---------------------------------------------------------------------------


def test_hotpotqa_supporting_facts_context(shared_data_dir):
    support = load_dataset("hotpotqa")
    full = {r.id: r for r in load_dataset("hotpotqa", all_paragraphs=True)}
    for r in support:
        other = full[r.id]
        assert len(r.context) < len(other.context)
        for sentence in r.context.split("\n"):
            assert sentence and sentence in other.context
    first = support[0]
    assert first.answers == ["yes"]
    assert first.context.split("\n") == [
        "Scott Derrickson (born July 16, 1966) is an American director, screenwriter and producer.",
        "Edward Davis Wood Jr. (October 10, 1924 – December 10, 1978) was an American filmmaker, "
        "actor, writer, producer, and director.",
    ]


# ---------------------------------------------------------------------------
# MMLU-Redux: messy CSVs
# ---------------------------------------------------------------------------


def test_mmlu_all_subjects_load(mmlu_all):
    records, report = mmlu_all
    assert report.problems == [] and report.filtered == 0
    per_subject = Counter(r.meta["subject"] for r in records)
    assert len(per_subject) == 57
    assert set(per_subject.values()) == {100}
    assert all(len(r.choices) == 4 and 0 <= r.answer_index < 4 for r in records)


def test_mmlu_error_types_match_source(mmlu_all):
    records, _ = mmlu_all
    # SOURCE.txt, after normalising the error_type spellings:
    assert Counter(r.meta["error_type"] for r in records) == {
        "ok": 5330,
        "bad_question_clarity": 132,
        "wrong_groundtruth": 107,
        "multiple_correct_answers": 39,
        "no_correct_answer": 35,
        "expert": 32,
        "bad_options_clarity": 25,
    }


def test_mmlu_error_rows_skipped_by_default(shared_data_dir):
    records, report = load_dataset_with_report("mmlu_redux")
    assert report.filtered == 370
    assert {r.meta["error_type"] for r in records} == {"ok"}


def test_mmlu_semicolon_file_parses(shared_data_dir):
    # mmlu_anatomy.csv is ';'-separated: a comma reader would see one column.
    records = load_dataset("mmlu_redux", subjects=["anatomy"], keep_errors=True)
    assert len(records) == 100
    first = records[0]
    assert first.id == "mmlu_redux/anatomy/0"
    assert first.question.startswith("Which of the following is a disorder characterized")
    assert first.choices == ["Dyslexia", "Epilepsy", "Hydrocephalus", "Narcolepsy"]
    assert first.answer_index == 3 and first.answer_letter == "D"


def test_mmlu_non_utf8_file_parses(shared_data_dir):
    # mmlu_moral_scenarios.csv is not UTF-8 and has correct_answer before error_type.
    records = load_dataset("mmlu_redux", subjects="moral_scenarios", keep_errors=True)
    assert len(records) == 100
    assert records[0].choices == ["Wrong, Wrong", "Wrong, Not wrong", "Not wrong, Wrong", "Not wrong, Not wrong"]
    assert records[0].answer_index == 3
    text = " ".join(r.question for r in records)
    assert "sister\u2019s head" in text  # byte 0xD5 decoded as a right quote, not "Õ"
    assert "\ufffd" not in text


def test_mmlu_other_column_layouts(shared_data_dir):
    # econometrics has two extra empty columns; machine_learning and moral_disputes
    # have a different column order.
    for subject in ("econometrics", "machine_learning", "moral_disputes"):
        records = load_dataset("mmlu_redux", subjects=[subject], keep_errors=True)
        assert len(records) == 100, subject
        assert all(r.meta["error_type"] and len(r.choices) == 4 for r in records), subject
    econ = load_dataset("mmlu_redux", subjects=["econometrics"], keep_errors=True)[0]
    assert econ.question.startswith("Consider the following AR(2) process:")
    assert econ.answers == ["Unit root process"]


def test_mmlu_unknown_subject(shared_data_dir):
    with pytest.raises(ValueError, match="unknown MMLU-Redux subject"):
        load_dataset("mmlu_redux", subjects=["astrology"])


# ---------------------------------------------------------------------------
# Errors, limit and seed
# ---------------------------------------------------------------------------


def test_unknown_dataset_lists_known_names():
    with pytest.raises(ValueError) as info:
        load_dataset("no_such_dataset")
    for name in DATASETS:
        assert name in str(info.value)


def test_missing_data_dir_message(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere"
    monkeypatch.setenv("KVVIZ_DATA_DIR", str(missing))
    with pytest.raises(FileNotFoundError) as info:
        load_dataset("countries")
    assert str(missing) in str(info.value)
    assert "KVVIZ_DATA_DIR" in str(info.value)


def test_env_var_overrides_data_dir(tmp_path, monkeypatch):
    folder = tmp_path / "kvcomm_countries"
    folder.mkdir()
    write_jsonl(folder / "countries.jsonl", [
        {"id": "c0", "prompt_A": "Ann is at the Louvre.", "prompt_B": "Which country is Ann in?", "y": "France"},
    ])
    monkeypatch.setenv("KVVIZ_DATA_DIR", str(tmp_path))
    assert get_data_dir() == tmp_path
    [record] = load_dataset("countries")
    assert record.answers == ["France"] and record.context == "Ann is at the Louvre."
    # The folder exists but another dataset's file does not: a clear error too.
    with pytest.raises(FileNotFoundError, match="arc_challenge_test"):
        load_dataset("arc_challenge")


def test_missing_file_path(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_dataset(tmp_path / "absent.jsonl")


def test_limit_must_be_non_negative(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answers": ["a"]}])
    with pytest.raises(ValueError, match="limit"):
        load_dataset(path, limit=-1)


def test_seeded_subset_is_reproducible(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"id": f"q{i}", "question": f"question {i}", "answers": [str(i)]} for i in range(50)
    ])
    first_ten = [r.id for r in load_dataset(path, limit=10)]
    assert first_ten == [f"q{i}" for i in range(10)]  # no seed: file order
    a = [r.id for r in load_dataset(path, limit=10, seed=7)]
    b = [r.id for r in load_dataset(path, limit=10, seed=7)]
    c = [r.id for r in load_dataset(path, limit=10, seed=8)]
    assert a == b
    assert a != c
    assert a != first_ten
    assert len(load_dataset(path, limit=500, seed=7)) == 50
    _, report = load_dataset_with_report(path, limit=3)
    assert report.loaded == 50


def test_seeded_subset_of_named_dataset(shared_data_dir):
    a = load_dataset("arc_challenge", limit=20, seed=123)
    b = load_dataset("arc_challenge", limit=20, seed=123)
    assert [r.id for r in a] == [r.id for r in b] and len(a) == 20


# ---------------------------------------------------------------------------
# Generic JSONL files
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("answer", [1, "B", "Paris", "b"])
def test_generic_multiple_choice_answer_forms(tmp_path, answer):
    path = write_jsonl(tmp_path / "mc.jsonl", [
        {"id": "x", "question": "Capital of France?", "choices": ["Rome", "Paris", "Oslo"], "answer": answer},
    ])
    [record] = load_dataset(path)
    assert record.answer_index == 1
    assert record.answer_letter == "B"
    assert record.answers == ["Paris"]
    assert record.is_multiple_choice
    assert record.source == "mc"
    assert format_choices(record) == "A. Rome\nB. Paris\nC. Oslo"


def test_generic_open_and_instruction_shapes(tmp_path):
    path = write_jsonl(tmp_path / "mixed.jsonl", [
        {"context": "Ann is in Paris.", "question": "Where is Ann?", "answers": ["Paris", "France"]},
        {"instruction": "Say hi.", "output": "hi"},
        {"id": "inst2", "instruction": "Translate.", "input": "Bonjour", "output": "Hello"},
    ])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean file must not warn
        open_q, inst, inst2 = load_dataset(path)
    assert open_q.id == "mixed:1"  # default id: file stem and line number
    assert open_q.context == "Ann is in Paris." and open_q.answers == ["Paris", "France"]
    assert open_q.choices is None and open_q.answer_index is None
    assert (inst.question, inst.context, inst.response) == ("Say hi.", None, "hi")
    assert (inst2.id, inst2.context, inst2.response) == ("inst2", "Bonjour", "Hello")


def test_record_to_dict_round_trips_through_generic_loader(tmp_path):
    record = Record("r1", "2+2?", "maths", ["4"], ["3", "4"], 1, "hand")
    d = record.to_dict()
    assert d["answer_index"] == 1 and d["choices"] == ["3", "4"] and d["response"] is None
    path = write_jsonl(tmp_path / "hand.jsonl", [d])
    [back] = load_dataset(path)
    assert back == record


def test_bad_lines_reported_with_line_numbers(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [
        {"id": "ok1", "question": "Q1", "answers": ["a1"]},                    # 1 ok
        "{not json",                                                           # 2
        {"answers": ["x"]},                                                    # 3 no question
        {"question": "Q", "choices": ["x", "y"], "answer": "z"},               # 4 not a choice
        {"question": "Q", "choices": ["x", "y"], "answer": 2},                 # 5 index out of range
        {"question": "Q", "choices": ["x", "y"], "answer": "D"},               # 6 letter out of range
        "",                                                                    # 7 blank: ignored
        {"question": "Q", "choices": ["B", "A"], "answer": "A"},               # 8 ambiguous
        {"id": "ok1", "question": "Q2", "answers": ["a2"]},                    # 9 duplicate id
        {"question": "Q", "choices": ["x", "y"], "answer": True},              # 10 boolean
        {"question": "Q", "answers": []},                                      # 11 no answers
        {"question": "Q", "choices": ["x", "y"]},                              # 12 no answer
        "[1, 2]",                                                              # 13 not an object
        {"question": "Q", "choices": ["x", "y"], "answer": "y"},               # 14 ok
    ])
    records, report = load_dataset_with_report(path)
    assert [r.answers for r in records] == [["a1"], ["y"]]
    assert [line for line, _ in report.lines] == [2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13]
    reasons = dict(report.lines)
    assert "invalid JSON" in reasons[2]
    assert "question" in reasons[3]
    assert "not among the choices" in reasons[4]
    assert "out of range" in reasons[5]
    assert "ambiguous" in reasons[8]
    assert "duplicate id" in reasons[9]
    assert all(p.path == str(path) for p in report.problems)

    with pytest.warns(UserWarning) as caught:
        assert len(load_dataset(path)) == 2
    message = str(caught[0].message)
    assert f"{path}:2:" in message and "skipped 11 bad record(s)" in message


def test_options_rejected_for_file_paths(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answers": ["a"]}])
    with pytest.raises(TypeError):
        load_dataset(path, keep_errors=True)


# ---------------------------------------------------------------------------
# Record
# ---------------------------------------------------------------------------


def test_record_validation_and_helpers():
    mc = Record("m", "Q?", None, ["y"], ["x", "y", "z"], 1, "t")
    assert mc.is_multiple_choice and mc.answer_letter == "B"
    with pytest.raises(ValueError):
        Record("m", "Q?", None, [], ["x"], 3, "t")  # index out of range
    with pytest.raises(ValueError):
        Record("m", "Q?", None, [], None, 0, "t")  # index without choices
    with pytest.raises(ValueError):
        format_choices(Record("o", "Q?", None, ["a"], None, None, "t"))
    with pytest.raises(Exception):
        mc.question = "changed"  # frozen
    assert json.loads(json.dumps(mc.to_dict()))["choices"] == ["x", "y", "z"]
    assert isinstance(LoadReport("x").problems, list)


# ---------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  An   apple, a day. ", "apple day"),
        ("Theory", "theory"),  # "the" only as a whole word
        ("U.S.A.", "usa"),
        ("", ""),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_token_f1():
    assert token_f1("Paris", "paris.") == 1.0
    assert token_f1("in Paris France", "Paris") == pytest.approx(0.5)  # P=1/3, R=1
    assert token_f1("London", "Paris") == 0.0
    assert token_f1("", "") == 1.0
    assert token_f1("the", "Paris") == 0.0  # prediction normalises to nothing
    # Tokens count as a multiset: a repeated token matches only as often as in gold.
    assert token_f1("paris paris", "paris") == pytest.approx(2 * 0.5 * 1 / 1.5)


def test_f1_match_threshold_is_strict():
    # Exactly 0.5: one of two tokens shared on each side.  KVComm requires > 0.5,
    # which is what keeps a wrong Tip Sheets company ("... LLC") from scoring.
    assert token_f1("Atlas LLC", "Sable LLC") == pytest.approx(0.5)
    assert not f1_match("Atlas LLC", ["Sable LLC"])
    assert f1_match("Sable", ["Sable LLC"])  # F1 = 2/3
    assert f1_match("Atlas LLC", ["Sable LLC"], threshold=0.49)
    assert f1_match("Paris!", ["London", "paris"])  # max over answers
    # Wordy answers fail even when right: F1("It is Paris", "Paris") = 0.5.
    assert not f1_match("It is Paris", ["Paris"])
    assert contains_answer("It is Paris", ["Paris"])
    assert f1_match("Paris", "Paris")  # a single answer string is fine
    assert not f1_match("Paris", [])


def test_contains_answer():
    assert contains_answer("I think it is the United States.", ["United States"])
    assert contains_answer("The answer: YES", ["yes"])
    assert not contains_answer("not sure", ["no"])  # whole tokens only
    assert not contains_answer("Paris", ["France"])
    assert not contains_answer("anything", ["the"])  # empty after normalising


def test_verdict_marks_an_answer_right_wrong_or_empty_and_needs_a_gold_answer():
    assert verdict("The code for locker 12 is 4471.", ["4471"]) == "right"  # F1 0.25, yet it says the code
    assert not f1_match("The code for locker 12 is 4471.", ["4471"])
    assert verdict("12", ["4471"]) == "wrong"
    assert verdict("  ", ["4471"]) == "none" and verdict("...", ["4471"]) == "none"  # nothing after normalising
    assert verdict("The United Kingdom", "United Kingdom") == "right"  # one gold as a string
    assert verdict("anything", []) is None and verdict("anything", ["the", " "]) is None  # no gold to judge by


@pytest.mark.parametrize(
    "text, expected",
    [
        ("B", "B"),
        ("(B)", "B"),
        ("B.", "B"),
        ("B) buildings will be made safer", "B"),
        ("Answer: B", "B"),
        ("answer: (c)", None),  # only capital letters count
        ("The answer is B", "B"),
        ("The correct answer is (D).", "D"),
        ("   \n C", "C"),
        ("**A**", "A"),
        ("Let me think... so (C) is right.", "C"),
        ("A bird flies south", None),  # the article "A", not option A
        ("Answer: E", None),  # E is not among 4 choices
        ("I am not sure", None),
        ("", None),
        ("The answer is not A, the answer is B", "B"),
    ],
)
def test_extract_choice_letter(text, expected):
    assert extract_choice_letter(text, 4) == expected


def test_extract_choice_letter_respects_choice_count():
    assert extract_choice_letter("E", 5) == "E"
    assert extract_choice_letter("E", 4) is None
    with pytest.raises(ValueError):
        extract_choice_letter("A", 0)


@pytest.mark.parametrize(
    "successes, n, low, high",
    [
        (0, 10, 0.0, 0.27753),
        (10, 10, 0.72247, 1.0),
        (5, 10, 0.23659, 0.76341),
        (50, 100, 0.40383, 0.59617),
    ],
)
def test_wilson_interval_known_values(successes, n, low, high):
    lo, hi = wilson_interval(successes, n)
    assert lo == pytest.approx(low, abs=1e-4)
    assert hi == pytest.approx(high, abs=1e-4)
    assert 0.0 <= lo <= successes / n <= hi <= 1.0


@pytest.mark.parametrize(
    "only_first, only_second, p",
    [(0, 0, 1.0), (3, 3, 1.0), (0, 5, 2 / 32), (5, 0, 2 / 32), (1, 9, 2 * 11 / 1024), (0, 1, 1.0)],
)
def test_mcnemar_exact_known_values(only_first, only_second, p):
    assert mcnemar_exact(only_first, only_second) == pytest.approx(p)


def test_mcnemar_exact_refuses_negative_counts():
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def test_paired_mcnemar_compares_two_variants_on_the_samples_both_answered():
    correct = {"a": {"s1": 1, "s2": 1, "s3": 0, "s4": 1}, "b": {"s1": 0, "s2": 1, "s3": 1, "s5": 1}}
    r = paired_mcnemar(correct, "a", "b")
    assert (r["first"], r["second"], r["n"], r["only_first"], r["only_second"]) == ("a", "b", 3, 1, 1)
    assert r["acc_first"] == pytest.approx(2 / 3) and r["acc_second"] == pytest.approx(2 / 3)
    assert r["p"] == mcnemar_exact(1, 1)
    assert paired_mcnemar({"a": {"s1": 1}, "b": {"s2": 0}}, "a", "b")["n"] == 0
    assert (format_p(0.04321), format_p(0.0004321)) == ("0.043", "4.3e-04")


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    narrow, wide = wilson_interval(50, 100), wilson_interval(5, 10)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]
    with pytest.raises(ValueError):
        wilson_interval(11, 10)
    with pytest.raises(ValueError):
        wilson_interval(-1, 10)
