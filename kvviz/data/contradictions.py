"""Inserted contradictions: the second counterfactual beside the swapped fact (``kvviz.data.swaps``).

A swap *replaces* the answer-bearing fact; a contradiction *keeps* it and adds, right after the
sentence that states it, one fluent sentence stating another value for the same fact (K2's second
test of a cache channel). A reader of the note now holds both; which one it answers, and how likely
it finds each answer's first token, says how much of the note's text reaches it, sentence by
sentence, against its own prior for the first-stated value.

Contradictions are made from the swaps, so that both counterfactuals of a record name the same
other value: the contradicting sentence is the swapped note's version of the first sentence the swap
changed ("Peggy is at the Gevangenpoort." gets "Peggy is at the Colosseum." after it), seeded and
reproducible with the swaps. A typed note takes a typed sentence (``insert_after``;
``typed_contradiction`` checks that it states another value, for ``run --contradict`` and the page).

``contradiction_outcome`` says what a column answered on the contradicted note: "gold" (the value
stated first), "counter" (the contradicting one), "both" or "neither".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvviz.data.metrics import normalize_answer, verdict
from kvviz.data.record import Record
from kvviz.data.swaps import Swap, swaps_for

OUTCOMES = ("gold", "counter", "both", "neither")
_UNIT = re.compile(r"((?<=[.!?])\s+|\n+)")  # sentence ends and line breaks, kept as separators


@dataclass(frozen=True)
class Contradiction:
    """A note with one contradicting sentence inserted after the sentence holding the fact."""

    context: str  # the contradicted note
    sentence: str  # the sentence inserted
    answers: tuple[str, ...]  # what the inserted sentence answers (the counter answers)
    changed: str  # what was contradicted, in words

    def to_dict(self) -> dict:
        return {"context": self.context, "sentence": self.sentence, "answers": list(self.answers), "changed": self.changed}


def _units(text: str) -> list[str]:
    """The text as alternating units and separators (joined again it is the text)."""
    return _UNIT.split(text)


def insert_after(context: str, sentence: str, after: str | None = None) -> str:
    """``context`` with ``sentence`` inserted right after the first sentence that holds ``after``
    (whole words), or at the end when ``after`` is None or in no sentence. A ValueError says why an
    empty sentence, or one already in the note, is refused."""
    sentence = " ".join(sentence.split())
    if not sentence:
        raise ValueError("The contradicting sentence is empty.")
    if sentence in context:
        raise ValueError("The contradicting sentence is already in the note: it must add another value.")
    parts = _units(context)
    if after and after.strip():
        pattern = re.compile(rf"(?<!\w){re.escape(after.strip())}(?!\w)")
        for index in range(0, len(parts), 2):
            if pattern.search(parts[index]):
                return "".join(parts[: index + 1]) + " " + sentence + "".join(parts[index + 1:])
    return context.rstrip() + " " + sentence


def typed_contradiction(context: str | None, sentence: str | None, gold, counter) -> Contradiction:
    """The note ``context`` with a typed ``sentence`` inserted after the sentence that states the
    first ``gold`` answer; ``counter``: what the sentence answers. A ValueError says why it is
    refused: no note, no gold, an empty sentence, no counter answer, a counter answer that is a gold
    one, a sentence that states a gold answer, or one already in the note. (Whether the sentence
    implies its counter answer is the writer's to say: "Mei is near Machu Picchu." answers Peru.)"""
    gold = [answer for answer in gold or () if normalize_answer(answer)]
    counter = [answer for answer in counter or () if normalize_answer(answer)]
    sentence = " ".join(str(sentence or "").split())
    if not (context or "").strip():
        raise ValueError("A contradiction needs a note: it inserts a sentence into the private note, and this question "
                         "has none. Type a note with the fact in it first.")
    if not gold:
        raise ValueError("A contradiction needs the expected answer: the value the note states, whose sentence the "
                         "contradiction follows.")
    if not sentence:
        raise ValueError("The contradicting sentence is empty: write one sentence that states another value.")
    if not counter:
        raise ValueError("Say what the contradicting sentence answers (the other value it states).")
    same = [answer for answer in counter if verdict(answer, gold) == "right" or verdict(gold[0], [answer]) == "right"]
    if same:
        raise ValueError(f"The contradicting sentence must state another value than the expected answer: {same[0]!r} "
                         f"is the expected answer ({'; '.join(gold)}).")
    if verdict(sentence, gold) == "right":
        raise ValueError(f"The contradicting sentence states the expected answer ({gold[0]!r}) itself: it must state "
                         "only the other value.")
    return Contradiction(context=insert_after(context, sentence, gold[0]), sentence=sentence, answers=tuple(counter),
                         changed=f"{gold[0]} -> {counter[0]} (inserted after the sentence stating {gold[0]!r})")


def contradiction_from_swap(context: str, swap: Swap) -> Contradiction | None:
    """The contradiction a swap makes: the swapped note's version of the first sentence the swap
    changed, inserted after the original one; None when the two notes do not split into the same
    sentences (the swap moved a sentence end)."""
    original, swapped = _units(context), _units(swap.context)
    if len(original) != len(swapped):
        return None
    for index in range(0, len(original), 2):
        if original[index] != swapped[index]:
            sentence = swapped[index].strip()
            text = "".join(original[: index + 1]) + " " + sentence + "".join(original[index + 1:])
            return Contradiction(context=text, sentence=sentence, answers=swap.answers, changed=swap.changed)
    return None


def contradictions_for(dataset: str, records: list[Record], seed: int = 0) -> dict[str, Contradiction]:
    """record id -> contradiction, from the dataset's seeded swaps (a record without one is left out)."""
    swaps = swaps_for(dataset, records, seed)
    out = {}
    for record in records:
        swap = swaps.get(record.id)
        made = contradiction_from_swap(record.context, swap) if swap is not None and record.context else None
        if made is not None:
            out[record.id] = made
    return out


def contradiction_outcome(answer: str, gold_answers, counter_answers) -> str | None:
    """What an answer on the contradicted note gives, by the page's verdict rule: "gold", "counter",
    "both" or "neither"; None when there is nothing to judge by."""
    gold = verdict(answer, list(gold_answers))
    counter = verdict(answer, list(counter_answers))
    if gold is None or counter is None:
        return None
    return {(True, False): "gold", (False, True): "counter", (True, True): "both"}.get((gold == "right", counter == "right"), "neither")
