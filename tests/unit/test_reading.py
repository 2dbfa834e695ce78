"""The reading of a run (kvviz.app.reading): the evidence rule case by case, a run read into typed
columns, every question of the one vocabulary answered, the catalog of methods the registry gives,
and no torch behind any of it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvviz.app.reading import catalog, evidence
from kvviz.app.reading.questions import Claim, Question, agrees, parse_claims, parse_question
from kvviz.app.reading.reading import read


def result(name: str, answer: str, *, swap: str | None = None, swapped: str = "", seconds: float = 0.5, sent: int = 0,
           layers=(), applicable: bool = True, **extra) -> dict:
    out = {"handoff": name, "applicable": applicable, "answer": answer, "timings": {"total": seconds},
           "bytes_communicated": sent, "tokens": {"generated": 1}, "seen": {"receiver": "prompt"},
           "layers": [{"layer": layer, "selected": True} for layer in layers], **extra}
    if swap is not None:
        out["swap"] = {"outcome": swap, "answer": swapped, "applicable": True, "changed": "4471 -> 3902"}
    return out


def payload(*results, **extra) -> dict:
    return {"pair": "embedded", "stamp": "run:1", "request": {"query": "What is the code?", "context": "It is 4471."},
            "results": list(results), **extra}


@pytest.mark.parametrize("mark, has_control, control, swap, kind", [
    ("right", True, "wrong", "followed", evidence.CROSSED),
    ("right", True, "right", "followed", evidence.KNOWN),  # the capital of France: it crossed, and was known
    ("right", True, "wrong", "none", evidence.DIFFERS),  # a shared question: never "got through"
    ("right", True, "wrong", "kept", evidence.DID_NOT_FOLLOW),
    ("right", True, "wrong", "neither", evidence.DID_NOT_FOLLOW),
    ("right", True, "right", "kept", evidence.NOT_NEEDED),
    ("right", True, "right", "none", evidence.NOT_NEEDED),
    ("right", True, "notrun", "none", evidence.UNCHECKED),
    ("right", True, "na", "none", evidence.UNCHECKED),
    ("right", True, "running", "none", evidence.PENDING),  # never "unchecked" while its control runs
    ("right", True, "waiting", "none", evidence.PENDING),
    ("right", True, "notrun", "followed", evidence.CROSSED),  # the swap alone shows it
    ("right", False, "notrun", "none", evidence.OWN),
    ("wrong", True, "wrong", "followed", evidence.MISREAD),
    ("wrong", True, "wrong", "kept", None),
    ("na", True, "wrong", "none", None),
])
def test_the_evidence_rule_says_each_case_a_learner_meets(mark, has_control, control, swap, kind):
    assert evidence.rule(mark, has_control, control, swap) == kind
    if kind is not None:
        assert evidence.sentence("KVComm", kind).startswith("KVComm: ") and kind in evidence.CLAUSES


def test_a_run_is_read_into_typed_columns_with_marks_evidence_swaps_times_and_bytes():
    reading = read(payload(
        result("receiver", "12", swap="kept", swapped="12"),
        result("text", "The code is 4471.", swap="followed", swapped="3902", seconds=2.0, sent=40),
        result("kvcomm", "4471", swap="neither", swapped="12", sent=9000, layers=(0, 3, 5), alone_total=0.4),
        result("kvcomm_control", "12"),
        result("c2c", "4471", timed="alone"),
        result("ac", "", applicable=False, reason="needs a same-width sender"),
    ), ["4471"], states={"skyline": "running"})
    assert list(reading.columns) == [n for n in catalog.names() if n in reading.columns]  # page order
    assert reading.marks(["receiver", "text", "kvcomm", "ac", "skyline"]) == {
        "receiver": "wrong", "text": "right", "kvcomm": "right", "ac": "na", "skyline": "running"}
    assert reading.evidence(reading.columns) == {"text": evidence.CROSSED, "kvcomm": evidence.DID_NOT_FOLLOW,
                                                 "c2c": evidence.UNCHECKED}
    assert reading.crossed() == ["text"]
    text, kvcomm = reading.column("text"), reading.column("kvcomm")
    assert text.swap.outcome == "followed" and text.swap.answer == "3902" and text.bytes == 40
    assert kvcomm.sent_layers == [0, 3, 5] and kvcomm.timing.timed == "shared" and kvcomm.timing.alone == 0.4
    assert reading.column("c2c").timing.timed == "alone" and reading.column("c2c").timing.pair == "embedded"
    assert reading.column("ac").timing is None and reading.column("ac").reason == "needs a same-width sender"
    assert reading.column("sharer").mark == "notrun" and reading.column("sharer").result is None
    assert reading.asks("What is the code?", "It is 4471.", "embedded")
    assert not reading.asks("What is the code?", "It is 4471.", "embedded-gemma")
    assert not reading.asks("Where is Tomas?", "It is 4471.", "embedded")


def test_every_question_of_the_vocabulary_is_answered_from_the_reading():
    reading = read(payload(
        result("receiver", "12", seconds=0.5),
        result("text", "The code is 4471.", swap="followed", swapped="3902", seconds=5.0, sent=40,
               seen={"message": "The code for locker 12 is 4471."}),
        result("kvcomm", "4471", swap="neither", sent=12000, layers=(0, 9)),
        result("kvcomm_control", "12"),
        result("c2c", "4471", details={"communication": {"ci95": [-0.01, 0.02]}}),
        result("c2c_control", "12"),
    ), ["4471"])
    asked = {
        Question("verdict", "text"): "right", Question("evidence", "text"): evidence.CROSSED,
        Question("evidence", "receiver"): "none", Question("follow", "kvcomm"): "neither",
        Question("follow", "c2c"): None, Question("beats", "c2c"): "yes", Question("beats", "receiver"): None,
        Question("layers", "kvcomm"): 2, Question("sent", "kvcomm"): [0, 9], Question("says", "kvcomm"): "4471",
        Question("writes", "text"): "The code for locker 12 is 4471.", Question("seconds", "text"): 5.0,
        Question("seconds", "text", over="receiver"): 10.0, Question("bytes", "kvcomm", over="text"): 300.0,
        Question("gain", "c2c"): "includes 0", Question("crossed"): ["text"],
        Question("which", "followed", among=("text", "kvcomm")): "text",
        Question("which", "right", among=("text", "kvcomm")): None,  # two are: it cannot say which one
        Question("verdict", "skyline"): None,  # did not run
    }
    for question, expected in asked.items():
        assert reading.answer(question) == expected, question
    assert reading.holds(Claim(Question("says", "text"), "4471"))
    assert reading.failures([Claim(Question("verdict", "kvcomm"), "wrong"), Claim(Question("verdict", "skyline"), "right")],
                            "x") == ["x: verdict of kvcomm is 'wrong', the run shows 'right' ('4471')",
                                     "x: no result for skyline (verdict of skyline is 'right')"]


def test_a_live_run_read_again_keeps_the_marks_of_its_finished_columns():
    first = read(payload(result("receiver", "12")), ["4471"], states={"text": "running"})
    assert first.column("text").mark == "running"
    again = read(payload(result("receiver", "12"), result("text", "4471")), ["4471"], previous=first)
    assert again.column("receiver").mark == "wrong" and again.column("text").mark == "right"
    assert first.column("receiver").mark == "wrong" and first.column("receiver").evidence is None
    assert again.column("text").evidence == evidence.DIFFERS  # its control, the receiver alone, is wrong; no swap


def test_claims_and_questions_are_read_from_the_toml_shapes_with_a_line_per_problem():
    claims, problems = parse_claims({"verdict": {"text": "right"}, "sent": {"kvcomm": [0, 12]}, "crossed": ["text"]}, "p")
    assert problems == [] and [c.question.kind for c in claims] == ["crossed", "verdict", "sent"]
    _, problems = parse_claims({"verdict": {"txt": "right", "kvcomm": "maybe"}, "rigth": {}}, "p")
    assert any("unknown claim(s) rigth" in p for p in problems)
    assert any("'txt' is not a column" in p for p in problems) and any("not 'maybe'" in p for p in problems)
    question, problems = parse_question({"seconds": "text", "over": "receiver"}, "e")
    assert problems == [] and question == Question("seconds", "text", "receiver")
    assert parse_question({"verdict": "text", "over": "receiver"}, "e")[1] == ["e: check.over (a ratio) goes with "
                                                                              "seconds or bytes only"]
    assert agrees(Question("layers", "kvcomm"), 9, 10, tolerance=1) and not agrees(Question("layers", "k"), 9, 11, 1)


def test_the_catalog_is_the_one_the_registry_and_the_page_entries_give():
    import importlib.util
    from pathlib import Path

    from kvviz.app.methods.registry import catalog as from_registry

    assert [vars(method) for method in catalog.METHODS.values()] == from_registry()
    path = Path(__file__).resolve().parents[2] / "scripts" / "methods_catalog.py"
    spec = importlib.util.spec_from_file_location("methods_catalog", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--check"]) == 0, "python scripts/methods_catalog.py"


def test_the_reading_imports_no_torch():
    code = ("import sys, kvviz.app.reading.reading; "
            "print(sorted(m for m in ('torch', 'transformers', 'kvviz.handoffs', 'gradio') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
