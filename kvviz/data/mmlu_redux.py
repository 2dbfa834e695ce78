"""MMLU-Redux v1: 57 subjects, the annotators' error types."""

from __future__ import annotations

import ast
import csv
import io
import re
import unicodedata
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from kvviz.data.files import dataset_path
from kvviz.data.record import LoadReport, Record


def _normalize_error_type(value: str) -> str:
    # The annotators spelled it many ways: "OK", "Ok", "ok ", "Wrong Groundtruth",
    # "wrong_groundtruth ", "bad question clarity", ...
    return re.sub(r"[\s\-]+", "_", value.strip().lower())


def _decode_csv_bytes(raw: bytes) -> tuple[str, str]:
    """Decode a CSV that may not be UTF-8; return (text, encoding used).

    SOURCE.txt calls the one non-UTF-8 MMLU-Redux file (moral_scenarios)
    cp1252, but its only non-ASCII byte is 0xD5 in "sister\\xd5s", which is
    "'" (U+2019) in Mac Roman and a nonsensical "Õ" in cp1252: it was saved
    by a Mac.  So try both 8-bit encodings and keep the one whose non-ASCII
    characters are more often punctuation (curly quotes, dashes), which is
    what stray non-ASCII bytes in English text almost always are; cp1252 wins
    ties.
    """
    try:
        return raw.decode("utf-8-sig"), "utf-8"  # -sig: tolerate a BOM
    except UnicodeDecodeError:
        pass

    def punctuation_share(text: str) -> int:
        return sum(unicodedata.category(ch).startswith("P") for ch in text if ord(ch) > 127)

    candidates = [(enc, raw.decode(enc, errors="replace")) for enc in ("cp1252", "mac_roman")]
    encoding, text = max(candidates, key=lambda c: punctuation_share(c[1]))  # max keeps the first on ties
    return text, encoding


def _read_mmlu_csv(path: Path, report: LoadReport) -> Iterator[tuple[int, int, dict[str, str]]]:
    """Yield (start_line, row_index, row) from one MMLU-Redux CSV, whatever its dialect."""
    text, _encoding = _decode_csv_bytes(path.read_bytes())
    header_line = text.split("\n", 1)[0]
    # Some files are ';'-separated; the header has no quoted text, so counting
    # separators there is a reliable sniff (csv.Sniffer stumbles on the
    # multi-line quoted questions).
    delimiter = ";" if header_line.count(";") > header_line.count(",") else ","
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = next(reader)
    except StopIteration:
        report.add(path, 1, "empty file")
        return
    # Column order differs between files and one has extra empty columns:
    # address cells by (normalised) header name, ignore unnamed columns.
    columns = [h.strip().lower() for h in header]
    missing = {"question", "choices", "answer", "error_type"} - set(columns)
    if missing:
        report.add(path, 1, f"header lacks column(s) {sorted(missing)}: {header!r}")
        return
    prev_line = reader.line_num
    row_index = 0
    for cells in reader:
        start_line, prev_line = prev_line + 1, reader.line_num
        if not any(c.strip() for c in cells):
            continue  # blank line
        row = {name: cell for name, cell in zip(columns, cells) if name}
        yield start_line, row_index, row
        row_index += 1


def load_mmlu_redux(
    *,
    subjects: Iterable[str] | None = None,
    keep_errors: bool = False,
    data_dir: Path | None = None,
    report: LoadReport | None = None,
) -> list[Record]:
    """MMLU-Redux v1: 57 subjects x 100 questions, 4 options each.

    Rows whose (normalised) ``error_type`` is not "ok" are dropped unless
    ``keep_errors=True`` (they count in ``report.filtered``).  Kept error rows
    still use the original ``answer`` label; the annotators' free-form
    ``correct_answer`` is in ``meta``.  ``subjects`` restricts to some
    subjects (names without the "mmlu_" prefix, e.g. "anatomy").  Ids are
    "mmlu_redux/<subject>/<row index in file>".
    """
    report = report if report is not None else LoadReport("mmlu_redux")
    folder = dataset_path(data_dir, "mmlu_redux", "mmlu_redux")
    files = sorted(folder.glob("mmlu_*.csv"))
    if not files:
        raise FileNotFoundError(f"no mmlu_*.csv files in {folder}")
    available = {f.stem.removeprefix("mmlu_"): f for f in files}
    if subjects is not None:
        wanted = [subjects] if isinstance(subjects, str) else list(subjects)
        unknown = sorted(set(wanted) - set(available))
        if unknown:
            raise ValueError(f"unknown MMLU-Redux subject(s) {unknown}; known: {sorted(available)}")
        available = {s: available[s] for s in sorted(set(wanted))}

    records = []
    for subject, path in available.items():
        for line_no, row_index, row in _read_mmlu_csv(path, report):
            error_type = _normalize_error_type(row.get("error_type", ""))
            if error_type != "ok" and not keep_errors:
                report.filtered += 1
                continue
            question = row.get("question", "")
            if not question.strip():
                report.add(path, line_no, "empty question")
                continue
            try:
                # The choices cell is a Python list literal; literal_eval only
                # accepts literals, so a hostile cell cannot run code.
                choices = ast.literal_eval(row.get("choices", ""))
            except (ValueError, SyntaxError) as exc:
                report.add(path, line_no, f"choices is not a Python list literal: {exc}")
                continue
            if not isinstance(choices, (list, tuple)) or not choices:
                report.add(path, line_no, f"choices is not a non-empty list: {row.get('choices')!r}")
                continue
            choices = [str(c) for c in choices]
            try:
                idx = int(row.get("answer", "").strip())
            except ValueError:
                idx = -1
            if not 0 <= idx < len(choices):
                report.add(path, line_no, f"answer {row.get('answer')!r} is not an index into {len(choices)} choices")
                continue
            meta: dict[str, Any] = {"subject": subject, "error_type": error_type}
            if row.get("correct_answer", "").strip():
                meta["correct_answer"] = row["correct_answer"].strip()
            records.append(
                Record(
                    id=f"mmlu_redux/{subject}/{row_index}",
                    question=question,
                    context=None,
                    answers=[choices[idx]],
                    choices=choices,
                    answer_index=idx,
                    source="mmlu_redux",
                    meta=meta,
                )
            )
    return records
