"""Passages, held out by paragraph: what the KV translator reads beside its one-line notes.

Three sources, split so that no paragraph an evaluation asks about is ever trained on:

* **HotpotQA's supporting paragraphs** (``heldout_paragraphs``): the whole paragraphs that hold the
  supporting facts of HotpotQA's first 103 dev questions (``load_dataset("hotpotqa",
  supporting_paragraphs=True)``), asked their question: the final held-out set, never trained on,
  never used to choose a run;
* **HotpotQA's other paragraphs** (``training_paragraphs``): the distractor paragraphs of the same
  questions whose title is no question's supporting title: generic text the receiver reads on from
  (its continuation loss);
* **Dolly's passages** (``dolly_passages``): Dolly records with an input, as (question, passage,
  response). The *extractive* ones (a short response found word for word in the passage: closed QA
  and information extraction) are the validation passages a training run is compared on; every
  other one may be trained on.
"""

from __future__ import annotations

from pathlib import Path

from kvviz.data.files import dataset_path, iter_json_array
from kvviz.data.hotpotqa import load_hotpotqa
from kvviz.data.instructions import load_dolly
from kvviz.data.metrics import normalize_answer
from kvviz.data.record import LoadReport, Record

HOTPOTQA_FILE = ("hotpotqa_dev_first103", "hotpot_dev_distractor_v1_first103.json")
EXTRACTIVE_LONGEST = 60  # characters of a response that counts as a span, not a summary
LONGEST_PASSAGE = 1200  # characters of a Dolly passage kept for training (longer ones cost the CPU more than they teach)


def _questions(data_dir: Path | None) -> list[dict]:
    path = dataset_path(data_dir, *HOTPOTQA_FILE)
    return [obj for _, obj in iter_json_array(path, LoadReport("hotpotqa"))]


def heldout_titles(data_dir: Path | None = None) -> set[str]:
    """The titles of every supporting paragraph of HotpotQA's first 103 questions."""
    return {title for obj in _questions(data_dir) for title, _ in obj.get("supporting_facts", [])}


def heldout_paragraphs(data_dir: Path | None = None) -> list[Record]:
    """HotpotQA's questions over their whole supporting paragraphs (the held-out passages)."""
    return load_hotpotqa(supporting_paragraphs=True, data_dir=data_dir)


def training_paragraphs(data_dir: Path | None = None) -> list[str]:
    """HotpotQA's distractor paragraphs ("title\\ntext"), less every paragraph under a held-out title,
    each once, in file order."""
    held = heldout_titles(data_dir)
    seen, out = set(), []
    for obj in _questions(data_dir):
        for title, sentences in obj.get("context", []):
            text = "".join(sentences).strip()
            if title in held or title in seen or not text:
                continue
            seen.add(title)
            out.append(f"{title}\n{text}")
    return out


def is_extractive(record: Record) -> bool:
    """A short response found word for word (SQuAD-normalised) in the record's passage."""
    response = (record.response or "").strip().rstrip(".")
    gold = normalize_answer(response)
    return bool(record.context and gold and len(response) <= EXTRACTIVE_LONGEST
                and f" {gold} " in f" {normalize_answer(record.context)} ")


def dolly_passages(data_dir: Path | None = None) -> tuple[list[Record], list[Record]]:
    """(Dolly records with a passage a run may train on, the extractive ones it is validated on).
    The extractive records carry their response as their one answer; the passages of the two lists
    never overlap."""
    with_passage = [r for r in load_dolly(data_dir=data_dir) if r.context and r.response and r.response.strip()]
    validation = [Record(id=r.id, question=r.question, context=r.context, answers=[r.response.strip().rstrip(".")],
                         choices=None, answer_index=None, source="dolly_extractive", response=r.response)
                  for r in with_passage if is_extractive(r)]
    held = {r.context for r in validation}
    training = [r for r in with_passage if r.context not in held and len(r.context) <= LONGEST_PASSAGE]
    return training, validation
