"""OpenBookQA v1."""

from __future__ import annotations

from pathlib import Path

from kvviz.data.choices import LETTERS
from kvviz.data.files import dataset_path, iter_jsonl, nonempty_str
from kvviz.data.record import LoadReport, Record, letter_to_index


def load_openbookqa(
    *,
    split: str = "test",
    with_fact: bool = False,
    data_dir: Path | None = None,
    report: LoadReport | None = None,
) -> list[Record]:
    """OpenBookQA v1 ("test" or "dev", 500 each, 4 options).

    With ``with_fact=True`` the ``*_complete.jsonl`` file is read and its
    ``fact1`` (the gold science fact) becomes the sender context.
    """
    if split not in ("test", "dev"):
        raise ValueError(f"openbookqa split must be 'test' or 'dev', not {split!r}")
    report = report if report is not None else LoadReport("openbookqa")
    filename = f"{split}_complete.jsonl" if with_fact else f"{split}.jsonl"
    path = dataset_path(data_dir, "openbookqa", filename)
    records = []
    for line_no, obj in iter_jsonl(path, report):
        q = obj.get("question") or {}
        stem, options = q.get("stem"), q.get("choices")
        if not nonempty_str(stem) or not isinstance(options, list) or not options:
            report.add(path, line_no, "missing question stem or choices")
            continue
        labels = [o.get("label") for o in options]
        if labels != list(LETTERS[: len(options)]):
            report.add(path, line_no, f"choice labels {labels} are not A, B, C... in order")
            continue
        idx = letter_to_index(obj.get("answerKey"), len(options))
        if idx is None:
            report.add(path, line_no, f"answerKey {obj.get('answerKey')!r} is not one of the labels")
            continue
        if with_fact and not nonempty_str(obj.get("fact1")):
            report.add(path, line_no, "with_fact=True but fact1 is missing")
            continue
        choices = [o["text"] for o in options]
        records.append(
            Record(
                id=str(obj.get("id", f"openbookqa_{line_no:04d}")),
                question=stem,
                context=obj["fact1"] if with_fact else None,
                answers=[choices[idx]],
                choices=choices,
                answer_index=idx,
                source="openbookqa",
            )
        )
    return records
