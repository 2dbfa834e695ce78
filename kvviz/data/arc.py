"""ARC-Challenge (test)."""

from __future__ import annotations

from pathlib import Path

from kvviz.data.choices import LETTERS
from kvviz.data.files import dataset_path, iter_jsonl, nonempty_str
from kvviz.data.record import LoadReport, Record, letter_to_index


def load_arc_challenge(*, data_dir: Path | None = None, report: LoadReport | None = None) -> list[Record]:
    """ARC-Challenge test set (1,172 questions; 3 to 5 options, labels A..E)."""
    report = report if report is not None else LoadReport("arc_challenge")
    path = dataset_path(data_dir, "arc_challenge_test", "arc_challenge_test.jsonl")
    records = []
    for line_no, obj in iter_jsonl(path, report):
        options = obj.get("options")
        if not nonempty_str(obj.get("question")) or not isinstance(options, list) or not options:
            report.add(path, line_no, "missing question or options")
            continue
        labels = [o.get("label") for o in options]
        if labels != list(LETTERS[: len(options)]):
            # Positional letters must equal the file's labels, otherwise
            # "answer_letter" would silently point at a different option.
            report.add(path, line_no, f"option labels {labels} are not A, B, C... in order")
            continue
        idx = letter_to_index(obj.get("answer"), len(options))
        if idx is None:
            report.add(path, line_no, f"answer {obj.get('answer')!r} is not one of the option labels")
            continue
        choices = [o["text"] for o in options]
        records.append(
            Record(
                id=str(obj.get("id", f"arc_{line_no:04d}")),
                question=obj["question"],
                context=None,
                answers=[choices[idx]],
                choices=choices,
                answer_index=idx,
                source="arc_challenge",
            )
        )
    return records
