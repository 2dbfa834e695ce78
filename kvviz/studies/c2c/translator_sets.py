"""The KV translator's held-out records (``eval-translator``'s sets), their swapped facts, the record
each control reads, and the page's private presets as records.

Sets (context private to the sharer; names, values, landmarks and paragraphs never in training):

* ``recall``: ``kvviz.data.recall``'s held-out entities (seed + 1, as eval-fuser draws them);
* ``countries``: the first ``n`` of KVComm's Countries shuffled with ``seed`` (eval-fuser's sample;
  only ``seed`` 0 keeps them out of the training notes);
* ``whereabouts``: ``kvviz.data.whereabouts``, one to three people per note at held-out landmarks,
  asked a person's country, which the note does not say (seed + 1);
* ``paragraphs``: HotpotQA's questions over their whole supporting paragraphs
  (``kvviz.data.passages``: held out by paragraph, never trained on, never used to choose a run);
  its swaps are HotpotQA's;
* ``unneeded``: held-out who-is-where notes asked the country of a held-out landmark nobody in the
  note is at (seed + 1): the note does not hold the answer, the receiver may know it (the harm set:
  reading the note must not make the answer worse than the receiver alone's);
* ``passages``: Dolly's extractive passages, never trained on: the *validation* passages a training
  run is compared on (``train-translator``'s legs read them), so never a final held-out number.

A *fresh draw* is another ``seed`` than any run was chosen on (the draws are independent; the
paragraphs are one fixed set).
"""

from __future__ import annotations

import random
import tomllib
from pathlib import Path

from kvviz.core.paths import ASSETS
from kvviz.data import load_dataset, passages, recall, whereabouts
from kvviz.data.record import Record
from kvviz.data.swaps import SWAPPERS, swaps_for
from kvviz.studies.c2c.communication import derangement

PRESETS_FILE = ASSETS / "presets.toml"
SWAP_RULES = {"recall": "recall", "countries": "countries", "whereabouts": "whereabouts", "paragraphs": "hotpotqa"}


def unneeded_records(n: int, seed: int = 0) -> list[Record]:
    """``n`` held-out who-is-where notes, each asked the country of a held-out landmark that no one in
    the note is at (seeded)."""
    rng = random.Random(f"translator-unneeded-{seed}")
    landmarks = whereabouts.places("landmark", "heldout")
    out = []
    for record in whereabouts.generate("heldout", n, seed=10_000 + seed):  # not the whereabouts set's notes
        place, country = rng.choice([p for p in landmarks if p[0].removeprefix("the ") not in record.context])
        out.append(Record(id=f"unneeded-{seed}-{len(out)}", question=f"Which country is {place} in?", context=record.context,
                          answers=whereabouts.answers_for(country), choices=None, answer_index=None, source="unneeded",
                          response=country, meta={"landmark": place, "country": country}))
    return out


def heldout_sets(recall_n: int, countries_n: int, seed: int = 0, whereabouts_n: int = 0, paragraphs_n: int = 0,
                 unneeded_n: int = 0, passages_n: int = 0) -> dict:
    """The held-out records of each set asked for (``n`` 0 leaves a set out), as the module docstring says."""
    sets = {}
    if recall_n:
        sets["recall"] = recall.generate("heldout", recall_n, seed=seed + 1)
    if countries_n:
        sets["countries"] = load_dataset("countries", limit=countries_n, seed=seed)
    if whereabouts_n:
        sets["whereabouts"] = whereabouts.generate("heldout", whereabouts_n, seed=seed + 1)
    if paragraphs_n:
        sets["paragraphs"] = passages.heldout_paragraphs()[:paragraphs_n]
    if unneeded_n:
        sets["unneeded"] = unneeded_records(unneeded_n, seed + 1)
    if passages_n:
        sets["passages"] = passages.dolly_passages()[1][:passages_n]
    return sets


def set_swaps(name: str, records: list[Record], seed: int) -> dict:
    """record id -> its swapped note, for a set that has a swap rule (else none)."""
    rule = SWAP_RULES.get(name, name)
    return swaps_for(rule, records, seed) if rule in SWAPPERS else {}


def countries_split(heldout: int = 100, seed: int = 0) -> tuple[list, list]:
    """Countries as the evaluators split it, as (records a trainer may read, held-out records): the
    held-out ones are the first ``heldout`` of Countries shuffled with ``seed`` (``heldout_sets``'
    sample, eval-fuser's too); the others, less any record whose landmark a held-out record names
    (its country would be a held-out answer), are the training side."""
    records = load_dataset("countries", seed=seed)
    held, rest = records[:heldout], records[heldout:]
    held_landmarks = {record.meta.get("landmark") for record in held}
    return [record for record in rest if record.meta.get("landmark") not in held_landmarks], held


def partners(records, seed: int) -> list[int]:
    """The record whose note each record's control reads (a seeded derangement, never the same note)."""
    return derangement(len(records), seed, same=lambda i, j: records[i].context == records[j].context)


def preset_records(path: Path = PRESETS_FILE) -> list[tuple[Record, dict | None]]:
    """The page's presets with a private note, as (record, its stored swap or None)."""
    with path.open("rb") as handle:
        raw = tomllib.load(handle)["preset"]
    out = []
    for preset in raw:
        if preset.get("scenario") != "private" or not preset.get("context"):
            continue
        record = Record(id=f"preset-{preset['key']}", question=preset["query"], context=preset["context"],
                        answers=list(preset["answers"]), choices=None, answer_index=None, source="presets",
                        response=preset["answers"][0], meta={"preset": preset["key"]})
        out.append((record, preset.get("swap")))
    return out
