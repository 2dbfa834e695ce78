"""Instruction data: Dolly 5k and the small instruction set (instruction, input, output)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvviz.data.files import dataset_path, iter_json_array, iter_jsonl, nonempty_str, optional_text
from kvviz.data.record import LoadReport, Record


def instruction_record(obj: dict[str, Any], rid: str, source: str) -> Record:
    return Record(
        id=rid,
        question=obj["instruction"],
        context=optional_text(obj.get("input")),
        answers=[],
        choices=None,
        answer_index=None,
        source=source,
        response=obj["output"],
    )


def instruction_problem(obj: dict[str, Any]) -> str | None:
    if not nonempty_str(obj.get("instruction")):
        return "missing or empty instruction"
    if not isinstance(obj.get("output"), str):
        return "missing output"
    if obj.get("input") is not None and not isinstance(obj.get("input"), str):
        return "input is not a string"
    return None


def load_dolly(*, data_dir: Path | None = None, report: LoadReport | None = None) -> list[Record]:
    """5,000 Dolly-15k records (instruction, input -> context, output -> response)."""
    report = report if report is not None else LoadReport("dolly")
    path = dataset_path(data_dir, "dolly_5k", "dolly_5k.jsonl")
    records = []
    for line_no, obj in iter_jsonl(path, report):
        if (why := instruction_problem(obj)) is not None:
            report.add(path, line_no, why)
            continue
        records.append(instruction_record(obj, f"dolly_{line_no - 1:05d}", "dolly"))
    return records


def load_instructions(*, data_dir: Path | None = None, report: LoadReport | None = None) -> list[Record]:
    """1,100 small Alpaca-style records from rasbt/LLMs-from-scratch chapter 7."""
    report = report if report is not None else LoadReport("instructions")
    path = dataset_path(data_dir, "instruction_data_rasbt_1100", "instruction-data.json")
    records = []
    for item_no, obj in iter_json_array(path, report):
        if (why := instruction_problem(obj)) is not None:
            report.add(path, item_no, why)
            continue
        records.append(instruction_record(obj, f"instructions_{item_no - 1:04d}", "instructions"))
    return records
