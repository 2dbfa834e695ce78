"""Swapped facts (kvviz.data.swaps): one rule per dataset, seeded; what a column did with the swap."""

from __future__ import annotations

import re

import pytest

from kvviz.data import recall, whereabouts
from kvviz.data.record import Record
from kvviz.data.swaps import (
    Swap,
    answer_type,
    countries_swaps,
    hotpotqa_swaps,
    recall_swaps,
    replace_fact,
    swap_outcome,
    swap_record,
    swaps_for,
    whereabouts_swaps,
)


def countries_record(i: int, person: str, landmark: str, country: str) -> Record:
    return Record(id=f"c{i}", question=f"Which country is {person} located in?", context=f"{person} is at the {landmark}.",
                  answers=[country], choices=None, answer_index=None, source="countries",
                  meta={"person": person, "landmark": landmark})


COUNTRIES = [
    countries_record(0, "Uma", "Mahaffie House", "United States"),
    countries_record(1, "Ada", "Eiffel Tower", "France"),
    countries_record(2, "Kofi", "Big Ben", "United Kingdom"),
    countries_record(3, "Mei", "Mount Fuji", "Japan"),
]


def test_a_countries_swap_moves_the_person_to_another_countrys_landmark():
    swaps = countries_swaps(COUNTRIES, seed=0)
    assert set(swaps) == {r.id for r in COUNTRIES}
    for record in COUNTRIES:
        swap = swaps[record.id]
        other = next(r for r in COUNTRIES if r.meta["landmark"] in swap.context)
        assert other.answers[0] != record.answers[0] and swap.answers == (other.answers[0],)
        assert record.meta["landmark"] not in swap.context and record.meta["person"] in swap.context
        assert swap.changed.startswith(record.meta["landmark"])
    assert countries_swaps(COUNTRIES, seed=0) == swaps  # seeded: the same swaps again
    assert countries_swaps(COUNTRIES, seed=1) != swaps or len(COUNTRIES) < 3


def test_a_whereabouts_swap_moves_the_asked_person_to_a_country_no_one_in_the_note_is_in():
    records = whereabouts.generate("heldout", 30, seed=2)
    swaps = whereabouts_swaps(records, seed=0)
    assert len(swaps) == len(records)
    held = dict(whereabouts.places("landmark", "heldout"))
    for record in records:
        swap, place = swaps[record.id], record.meta["landmark"]
        new = next(p for p in held if p in swap.context and p not in record.context)
        taken = {record.meta["country"]} | {o["country"] for o in record.meta["others"]}
        assert held[new] not in taken and swap.answers == tuple(whereabouts.answers_for(held[new]))
        assert swap.context == record.context.replace(place, new) and record.meta["person"] in swap.context
        for other in record.meta["others"]:  # the other people stay where they were
            assert other["landmark"] in swap.context
    assert whereabouts_swaps(records, seed=0) == swaps
    assert set(swaps_for("whereabouts", records, 0)) == set(swaps)


def test_a_recall_swap_changes_the_asked_value_and_nothing_else():
    records = recall.generate("heldout", 40, seed=3)
    swaps = recall_swaps(records, seed=0)
    assert len(swaps) >= 35
    for record in records:
        if record.id not in swaps:
            continue
        swap, old = swaps[record.id], record.answers[0]
        new = swap.answers[0]
        assert new != old and new in recall.values_of(record.meta["kind"], "heldout")
        assert swap.context == replace_fact(record.context, old, new)
        assert not re.search(rf"(?<!\w){re.escape(old)}(?!\w)", swap.context) and new not in record.context


def test_hotpotqa_swaps_keep_the_answers_type_and_skip_yes_no():
    def record(i, answer, context):
        return Record(id=f"h{i}", question="Q?", context=context, answers=[answer], choices=None, answer_index=None,
                      source="hotpotqa")

    records = [record(0, "1945", "The film came out in 1945."), record(1, "1999", "It opened in 1999."),
               record(2, "Shirley Temple", "It starred Shirley Temple."), record(3, "Chief of Protocol", "She was Chief of Protocol."),
               record(4, "yes", "Both are rivers."), record(5, "Paris", "The river is in London.")]
    swaps = hotpotqa_swaps(records, seed=0)
    assert swaps["h0"].answers == ("1999",) and swaps["h0"].context == "The film came out in 1999."
    assert swaps["h2"].answers[0] in ("Chief of Protocol", "Paris") and "Shirley Temple" not in swaps["h2"].context
    assert "h4" not in swaps and "h5" not in swaps  # yes/no, and a gold not in the note
    assert [answer_type(a) for a in ("1945", "12", "yes", "Shirley Temple", "red bicycle")] == ["year", "number", "yesno", "name", "other"]


def test_replacing_a_fact_refuses_what_the_note_does_not_say():
    assert replace_fact("The code for locker 12 is 4471.", "4471", "8125") == "The code for locker 12 is 8125."
    assert replace_fact("12 and 125", "12", "7") == "7 and 125"  # whole words only
    with pytest.raises(ValueError, match="not in the note"):
        replace_fact("The code is 4471.", "9999", "8125")
    with pytest.raises(ValueError, match="must differ"):
        replace_fact("The code is 4471.", "4471", "4471")
    with pytest.raises(ValueError, match="swaps"):
        swaps_for("tipsheets", [], 0)


def test_an_answer_follows_keeps_or_does_neither():
    assert swap_outcome("Japan", ["United States"], ["Japan"]) == "followed"
    assert swap_outcome("It is in the United States.", ["United States"], ["Japan"]) == "kept"
    assert swap_outcome("Spain", ["United States"], ["Japan"]) == "neither"
    assert swap_outcome("Japan or the United States", ["United States"], ["Japan"]) == "neither"
    assert swap_outcome("", ["United States"], ["Japan"]) == "neither"


def test_a_swap_record_without_gold_says_kept_when_the_answer_did_not_change():
    swap = Swap(context="The code is 8125.", answers=("8125",), changed="4471 -> 8125")
    same = swap_record({"answer": "12"}, {"answer": "12", "answer_ids": [1]}, swap)
    assert same["outcome"] == "kept" and same["right"] is None
    moved = swap_record({"answer": "4471"}, {"answer": "The code is 8125."}, swap)
    assert moved["outcome"] == "followed" and moved["answer"] == "The code is 8125."
    judged = swap_record({"answer": "4471"}, {"answer": "4471"}, swap, gold=["4471"])
    assert judged["outcome"] == "kept" and judged["right"] is True
    off = swap_record({"answer": "4471"}, {"applicable": False, "reason": "no context"}, swap, gold=["4471"])
    assert off["outcome"] is None and not off["applicable"]
