"""The inserted contradiction (kvviz.data.contradictions, kvviz.engine.contradiction, ``run --contradict``,
``bench --contradict``): the swap's other value stated in one sentence right after the original, every
handoff run on it, and the gold and counter answers' first-token probabilities. Tiny models."""

from __future__ import annotations

import argparse
import json

import pytest

from kvviz.cli import build_parser
from kvviz.commands import contradiction_from_args
from kvviz.core.results import HandoffRequest
from kvviz.data import load_dataset, recall
from kvviz.data.contradictions import contradiction_from_swap, contradiction_outcome, contradictions_for, insert_after
from kvviz.data.swaps import Swap, swaps_for
from kvviz.engine import contradiction
from kvviz.studies import bench
from tests.unit.test_bench import read_csv


def test_a_contradiction_states_the_swaps_value_right_after_the_original_sentence(shared_data):
    records = recall.generate("heldout", 12, seed=1)
    swaps = swaps_for("recall", records, 0)
    made = contradictions_for("recall", records, 0)
    assert made and set(made) <= set(swaps)
    for record in records:
        if record.id not in made:
            continue
        c, swap = made[record.id], swaps[record.id]
        assert c.answers == swap.answers and c.sentence in swap.context and c.sentence not in record.context
        # the original note is all there, the new sentence right after the one holding the answer
        assert c.context.replace(" " + c.sentence, "", 1) == record.context
        holding = next(s for s in record.context.split(". ") if record.answers[0] in s)
        assert c.context.index(c.sentence) > c.context.index(holding)
    countries = load_dataset("countries", limit=5, seed=0)
    for record in countries:
        c = contradictions_for("countries", countries, 0).get(record.id)
        if c:
            assert c.context.startswith(record.context) and record.meta["person"] in c.sentence


def test_a_typed_contradiction_goes_after_the_sentence_that_states_the_gold():
    note = "The shed is blue. The code for locker 12 is 4471. The gym opens at nine."
    placed = insert_after(note, "The code for locker 12 is 8125.", "4471")
    assert placed == "The shed is blue. The code for locker 12 is 4471. The code for locker 12 is 8125. The gym opens at nine."
    assert insert_after(note, "It is 8125.", "nowhere") == note + " It is 8125."
    with pytest.raises(ValueError, match="empty"):
        insert_after(note, "  ", "4471")
    with pytest.raises(ValueError, match="already in the note"):
        insert_after(note, "The gym opens at nine.", "4471")
    # a swap that moves a sentence end makes no contradiction rather than a wrong one
    assert contradiction_from_swap("Ann is at St Paul.", Swap("Ann is at St. Paul. Really.", ("UK",), "")) is None


def test_an_answer_on_the_contradicted_note_gives_the_gold_the_counter_both_or_neither():
    assert contradiction_outcome("It is 4471.", ["4471"], ["8125"]) == "gold"
    assert contradiction_outcome("8125", ["4471"], ["8125"]) == "counter"
    assert contradiction_outcome("4471 and then 8125", ["4471"], ["8125"]) == "both"
    assert contradiction_outcome("I do not know", ["4471"], ["8125"]) == "neither"
    assert contradiction_outcome("x", [], ["8125"]) is None


def test_every_handoff_runs_on_the_contradicted_note_with_both_probabilities(tiny_engine):
    pair, calls = tiny_engine
    note = "The code for locker 12 is 4471."
    made = contradiction_from_swap(note, Swap("The code for locker 12 is 8125.", ("8125",), "4471 -> 8125"))
    request = HandoffRequest(query="What is the code for locker 12?", context=note, inspect={"gold": "4471"})
    results = contradiction.results(pair, request, ["receiver", "skyline"], made, ["4471"])
    assert [r.handoff for r in results] == ["receiver", "skyline"] and len(calls) == 4
    for result in results:
        c = result.contradiction
        assert c["sentence"] == "The code for locker 12 is 8125." and c["answers"] == ["8125"]
        assert c["outcome"] in ("gold", "counter", "both", "neither")
        for key in ("p_gold", "p_counter", "p_gold_clean", "p_counter_clean"):
            assert 0.0 <= c[key] <= 1.0
        assert result.logit_lens["counter"] == "8125" and len(result.logit_lens["counter_probability"]) == pair.receiver.facts.num_layers
    receiver = results[0].contradiction
    assert receiver["answer"] == results[0].answer and receiver["p_gold"] == receiver["p_gold_clean"]  # it never reads the note


def test_bench_adds_the_contradiction_arm_beside_the_swap(tmp_path, tiny_engine):
    pair, calls = tiny_engine
    out = tmp_path / "contra"
    args = build_parser().parse_args(
        ["bench", "--pair", "tiny", "--dataset", "recall", "--dataset-option", "n=6", "--swap", "--contradict", "--limit", "3",
         "--handoffs", "receiver,skyline", "--out", str(out), "--quiet", "--max-new-tokens", "4"])
    assert bench.main(args) == 0
    rows = read_csv(out / "rows.csv")
    assert len(rows) == 3 * 2 and len(calls) == 3 * 2 * 3  # the note, its swap and its contradiction
    assert all(row["contra_sentence"] and row["contra_outcome"] in ("gold", "counter", "both", "neither") for row in rows)
    assert all(0.0 <= float(row["contra_p_counter"]) <= 1.0 for row in rows)
    assert all(row["contra_answer"] == row["answer"] for row in rows if row["variant"] == "receiver")
    entries = json.loads((out / "contradiction.json").read_text())
    assert [e["variant"] for e in entries] == ["receiver", "skyline"] and entries[1]["counter"]["n"] == 3
    assert set(entries[1]["paired"]) == {"receiver"} and "Inserted contradiction" in (out / "summary.md").read_text()
    # matched / control in one cell: Skyline's control is the receiver alone
    assert entries[1]["control"]["variant"] == "receiver" and entries[0]["control"] is None
    assert f"{entries[1]['accuracy']['rate']:.2f} / {entries[0]['accuracy']['rate']:.2f} (receiver)" in (out / "summary.md").read_text()


def run_args(**values):
    base = dict(context="The code for locker 12 is 4471.", gold="4471", contradict="The code is 8125.", contradict_answer=["8125"])
    return argparse.Namespace(**{**base, **values})


def test_run_contradict_says_what_it_needs():
    made = contradiction_from_args(run_args(), None)
    assert made.context == "The code for locker 12 is 4471. The code is 8125." and made.answers == ("8125",)
    assert contradiction_from_args(run_args(contradict=None, contradict_answer=None), None) is None
    assert contradiction_from_args(run_args(contradict_answer=None), Swap("x", ("8125",), "")).answers == ("8125",)
    for values, message in ((dict(gold=None), "--gold"), (dict(contradict_answer=None), "--contradict-answer"),
                            (dict(context=None), "--context"), (dict(contradict=None), "needs --contradict")):
        with pytest.raises(ValueError, match=message):
            contradiction_from_args(run_args(**values), None)


def test_run_contradict_refuses_a_sentence_that_states_no_other_value():
    """The CLI and the page share one check (``typed_contradiction``)."""
    for values, message in ((dict(contradict="It is 4471, really.", contradict_answer=["4471"]), "another value"),
                            (dict(contradict="The code is 4471."), "states the expected answer"),
                            (dict(contradict="The code for locker 12 is 4471."), "states the expected answer"),
                            (dict(contradict="  "), "is empty")):
        with pytest.raises(ValueError, match=message):
            contradiction_from_args(run_args(**values), None)
