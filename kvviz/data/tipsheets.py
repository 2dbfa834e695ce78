"""KVComm's Tip Sheets."""

from __future__ import annotations

from pathlib import Path

from kvviz.data.files import dataset_path, iter_jsonl, nonempty_str, optional_text
from kvviz.data.record import LoadReport, Record


def load_tipsheets(*, data_dir: Path | None = None, report: LoadReport | None = None) -> list[Record]:
    """KVComm "Tip Sheets": pick the company with the positive tip sheet.

    The question (prompt_B) already ends in an answer prefix
    ("The company name is:") and asks for the *name*, not a letter, so score
    it with ``f1_match`` on ``answers`` as KVComm does.  ``choices`` /
    ``answer_index`` are filled as well for letter-style prompting.
    """
    report = report if report is not None else LoadReport("tipsheets")
    path = dataset_path(data_dir, "kvcomm_tipsheets", "tipsheets.jsonl")
    records = []
    for line_no, obj in iter_jsonl(path, report):
        options, label = obj.get("options"), obj.get("label")
        if not nonempty_str(obj.get("prompt_B")):
            report.add(path, line_no, "missing prompt_B")
            continue
        if not isinstance(options, list) or not options or label not in options:
            report.add(path, line_no, f"label {label!r} is not one of the options {options!r}")
            continue
        records.append(
            Record(
                # The file has no ids; the line number is stable.
                id=f"tipsheets_{line_no - 1:04d}",
                question=obj["prompt_B"],
                context=optional_text(obj.get("prompt_A")),
                answers=[label],
                choices=list(options),
                answer_index=options.index(label),
                source="tipsheets",
                meta={"attitudes": obj["attitudes"]} if "attitudes" in obj else {},
            )
        )
    return records
