"""Swapped facts: the same note with its answer-bearing fact changed, and what a reader of the new
note answers instead. A right answer is evidence that the note's content crossed only when the
answer *follows* the swap (on the swapped note it gives the swapped answer); one that *keeps* its
first answer, or gives neither, got it from somewhere else (a likely guess, the prompt's layout).

Swaps are made from the data, seeded and reproducible (the same records and seed give the same
swaps), one rule per dataset:

* Countries: the person's landmark becomes the landmark of another record in another country
  (the swapped answer is that country);
* recall: the asked fact's value becomes another value of the same kind from the same split's pool
  (another town, colour, code, time ...), one that appears nowhere else in the note;
* who is where (``kvviz.data.whereabouts``): the asked person's landmark becomes another landmark
  of the same split in a country that no one in the note is in (the swapped answer is its country);
* HotpotQA: the gold answer, where it appears word for word in the supporting sentences, is
  replaced there by the gold answer of another question of the same type (a year by a year, a
  number by a number, a name by a name); yes/no questions have no swap;
* the handbook (``kvviz.data.handbook``, facts the sharer learned, no note): the note stays, the
  *sharer* changes: the swapped arm runs on the pair's counterpart whose sharer learned the facts
  permuted (``Swap.pair``: ``OPPOSITE``), and the swapped answer is that sharer's value;
* any note: ``replace_fact`` (a typed note and the word to change, as the page does).

``swap_outcome`` says what a column did with the swap: "followed", "kept" or "neither".
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from kvviz.data import recall, whereabouts
from kvviz.data.metrics import normalize_answer, verdict
from kvviz.data.record import Record

OUTCOMES = ("followed", "kept", "neither")
# ``Swap.pair`` for "the pair's own counterpart whose sharer learned the opposite facts"
# (``kvviz.runtime.models.PairSpec.opposite``)
OPPOSITE = "opposite"


@dataclass(frozen=True)
class Swap:
    """A record's note with its answer-bearing fact changed."""

    context: str | None  # the swapped note (the note as it was, when the sharer is what changes)
    answers: tuple[str, ...]  # what the swapped note says instead (the swapped gold answers)
    changed: str  # what was changed, in words ("Mahaffie House (United States) -> Louvre (France)")
    # the pair the swapped arm runs on, when the swap is a sharer that learned other facts: a pair's
    # name, or OPPOSITE (the pair's own ``opposite``); None: this pair, on the swapped note
    pair: str | None = None

    def to_dict(self) -> dict:
        return {"context": self.context, "answers": list(self.answers), "changed": self.changed,
                **({"pair": self.pair} if self.pair else {})}

    @classmethod
    def from_dict(cls, data: dict) -> "Swap":
        return cls(context=data["context"], answers=tuple(data["answers"]), changed=data.get("changed", ""),
                   pair=data.get("pair"))


SHARER_SWAP = "the sharer that learned the opposite"  # what a sharer swap changed, in words


def sharer_swap(context: str | None, answers) -> Swap:
    """The same question (and note) to the pair's counterpart whose sharer learned the opposite facts,
    which answers ``answers`` there (a preset's stored sharer swap, or one typed on the page)."""
    return Swap(context=context or None, answers=tuple(answers), changed=SHARER_SWAP, pair=OPPOSITE)


def swap_outcome(swapped_answer: str, original_answers, swapped_answers) -> str | None:
    """What a column answered on the swapped note: "followed" (the swapped answer, not the old one),
    "kept" (the old answer, not the swapped one) or "neither" (both, none, or an empty answer), by
    the page's verdict rule; None when there is nothing to judge by."""
    follows = verdict(swapped_answer, list(swapped_answers))
    keeps = verdict(swapped_answer, list(original_answers))
    if follows is None or keeps is None:
        return None
    if follows == "right" and keeps != "right":
        return "followed"
    if keeps == "right" and follows != "right":
        return "kept"
    return "neither"


def swap_record(result: dict, swapped: dict, swap: Swap, gold=None) -> dict:
    """What one handoff did with the swap (``HandoffResult.swap``): its answer on the swapped note
    and the outcome. ``gold``: the original answers, when known; without them "kept" means the
    answer did not change (the same words, ignoring case and punctuation)."""
    tokens = (swapped.get("token_attention") or {}).get("answer_tokens") or []
    record = {**swap.to_dict(), "answer": swapped.get("answer", ""), "answer_ids": list(swapped.get("answer_ids") or []),
              "answer_tokens": list(tokens),  # its answer as tokens, where the swapped run recorded them
              "applicable": bool(swapped.get("applicable", True)), "reason": swapped.get("reason", ""),
              "outcome": None, "right": None}
    if not record["applicable"] or not result.get("applicable", True):
        return record
    golds = [g for g in (gold or []) if normalize_answer(g)]
    if golds:
        record["right"] = verdict(result.get("answer", ""), golds) == "right"
        record["outcome"] = swap_outcome(record["answer"], golds, swap.answers)
        return record
    unchanged = normalize_answer(record["answer"]) == normalize_answer(result.get("answer", ""))
    follows = verdict(record["answer"], list(swap.answers)) == "right"
    record["outcome"] = "followed" if follows and not unchanged else ("kept" if unchanged else "neither")
    return record


def _names(word: str, text: str) -> bool:
    """``word`` appears in ``text`` as whole words (the substring test first: most values are not in it)."""
    return word in text and re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text) is not None


def replace_fact(context: str, old: str, new: str) -> str:
    """``context`` with every whole-word occurrence of ``old`` replaced by ``new``; a ValueError says
    so when ``old`` is not in the note, or when the two are the same."""
    old, new = old.strip(), new.strip()
    if not old or not new:
        raise ValueError("Name the word of the note to change and what to change it to.")
    if old == new:
        raise ValueError(f"The swapped fact must differ from the note's: both are {old!r}.")
    pattern = re.compile(rf"(?<!\w){re.escape(old)}(?!\w)")
    if not pattern.search(context):
        raise ValueError(f"{old!r} is not in the note, so it cannot be swapped.")
    return pattern.sub(new, context)


# --- per dataset ---------------------------------------------------------------------------------


def countries_swaps(records: list[Record], seed: int = 0) -> dict[str, Swap]:
    """record id -> swap: another record's landmark, in another country."""
    rng = random.Random(f"swap-countries-{seed}")
    swaps = {}
    for record in records:
        landmark, country = record.meta.get("landmark"), (record.answers or [None])[0]
        if not landmark or not country or not record.context or landmark not in record.context:
            continue
        others = [r for r in records if r.answers and r.answers[0] != country and r.meta.get("landmark")]
        if not others:
            continue
        other = rng.choice(others)
        swaps[record.id] = Swap(
            context=record.context.replace(landmark, other.meta["landmark"]),
            answers=(other.answers[0],),
            changed=f"{landmark} ({country}) -> {other.meta['landmark']} ({other.answers[0]})",
        )
    return swaps


def recall_swaps(records: list[Record], seed: int = 0) -> dict[str, Swap]:
    """record id -> swap: the asked fact's value replaced by another of its kind (the record's own
    split's pool), absent from the rest of the note."""
    rng = random.Random(f"swap-recall-{seed}")
    swaps = {}
    for record in records:
        kind, answer = record.meta.get("kind"), (record.answers or [None])[0]
        split = "heldout" if "-heldout-" in record.id else "train"
        if kind is None or answer is None or not record.context:
            continue
        values = [v for v in recall.values_of(kind, split) if v != answer and not _names(v, record.context)]
        if not values:
            continue
        value = rng.choice(values)
        try:
            context = replace_fact(record.context, answer, value)
        except ValueError:
            continue
        swaps[record.id] = Swap(context=context, answers=(value,), changed=f"{answer} -> {value}")
    return swaps


def whereabouts_swaps(records: list[Record], seed: int = 0) -> dict[str, Swap]:
    """record id -> swap: the asked person's place becomes another place of the record's split and
    kind, in a country no one in the note is in (the swapped answers: that country's names)."""
    rng = random.Random(f"swap-whereabouts-{seed}")
    swaps = {}
    for record in records:
        place, country = record.meta.get("landmark"), record.meta.get("country")
        if not place or not country or not record.context or place not in record.context:
            continue
        split = "heldout" if "-heldout-" in record.id else "train"
        kind = "city" if place in dict(whereabouts.CITIES) else "landmark"
        taken = {country} | {other["country"] for other in record.meta.get("others", [])}
        options = [(p, c) for p, c in whereabouts.places(kind, split) if c not in taken and p not in record.context]
        if not options:
            continue
        new_place, new_country = rng.choice(options)
        swaps[record.id] = Swap(context=replace_fact(record.context, place, new_place),
                                answers=tuple(whereabouts.answers_for(new_country)),
                                changed=f"{place} ({country}) -> {new_place} ({new_country})")
    return swaps


def answer_type(answer: str) -> str:
    """A coarse type, so that a swapped answer is of the same kind: "year", "number", "yesno",
    "name" (capitalised words) or "other"."""
    text = answer.strip()
    if text.lower() in ("yes", "no"):
        return "yesno"
    if re.fullmatch(r"1\d{3}|20\d{2}", text):
        return "year"
    if re.fullmatch(r"[\d.,]+( [a-z]+)?", text):
        return "number"
    if all(word[:1].isupper() for word in text.split() if word[:1].isalpha()):
        return "name"
    return "other"


def hotpotqa_swaps(records: list[Record], seed: int = 0) -> dict[str, Swap]:
    """record id -> swap: the gold answer in the supporting sentences replaced by another question's
    gold of the same type (absent from this note); none for yes/no or a gold not in the note."""
    rng = random.Random(f"swap-hotpotqa-{seed}")
    swaps = {}
    for record in records:
        answer = (record.answers or [None])[0]
        kind = answer_type(answer) if answer else "yesno"
        if kind == "yesno" or not record.context or not re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", record.context):
            continue
        others = sorted({r.answers[0] for r in records if r.answers and r.answers[0] != answer
                         and answer_type(r.answers[0]) == kind and r.answers[0] not in record.context})
        if not others:
            continue
        other = rng.choice(others)
        swaps[record.id] = Swap(context=replace_fact(record.context, answer, other), answers=(other,),
                                changed=f"{answer} -> {other}")
    return swaps


def handbook_swaps(records: list[Record], seed: int = 0) -> dict[str, Swap]:
    """record id -> swap: the same question (and note) to the pair's counterpart whose sharer learned
    the handbook permuted (``OPPOSITE``); the swapped answer is that sharer's value."""
    swaps = {}
    for record in records:
        value, other = record.meta.get("value"), record.meta.get("permuted")
        if not value or not other or record.answers[:1] != [value]:
            continue
        swaps[record.id] = Swap(context=record.context, answers=(other,), pair=OPPOSITE,
                                changed=f"{value} -> {other} (the sharer that learned the opposite)")
    return swaps


SWAPPERS = {"handbook": handbook_swaps, "countries": countries_swaps, "recall": recall_swaps, "hotpotqa": hotpotqa_swaps, "whereabouts": whereabouts_swaps}


def swaps_for(dataset: str, records: list[Record], seed: int = 0) -> dict[str, Swap]:
    """The swaps of a registered dataset's records (record id -> swap; a record without one is left
    out); a ValueError names the datasets that have swaps."""
    if dataset not in SWAPPERS:
        raise ValueError(f"No swapped facts for {dataset!r}; datasets with swaps: {', '.join(SWAPPERS)}.")
    return SWAPPERS[dataset](records, seed)
