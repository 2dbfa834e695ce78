"""The benchmark's rows on disk: the CSV layout, appending one row at a time, reading every part
file back as one DataFrame, and what a resumed run skips.

Rows are appended and flushed as they are produced (a killed run loses at most one row); one file
per process when a run is split (``rows.part-R-of-W.csv``). Records end with ``\\r\\n``; newlines
inside a quoted field (a message) are plain ``\\n``, so a half-written last row can be cut off.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from kvviz.core.results import STAGES

TIME_COLUMNS = [f"time_{stage}" for stage in STAGES] + ["time_total", "ttft"]
# the swap arm's columns (bench --swap; kvviz.studies.bench.content): what changed, the swapped gold, the
# answer on the swapped note, its outcome, and 0/1 for right (on the original note), followed and kept
SWAP_COLUMNS = ["swap_changed", "swap_gold", "swap_answer", "swap_outcome", "right", "followed", "kept"]
# the contradiction arm's (bench --contradict; kvviz.studies.bench.contradiction): the inserted sentence, its
# (counter) answer, the answer on the contradicted note and its outcome, and the gold and counter answers'
# first-token probabilities on the contradicted note and on the original one
CONTRADICTION_COLUMNS = ["contra_sentence", "contra_gold", "contra_answer", "contra_outcome", "contra_p_gold",
                         "contra_p_counter", "contra_p_gold_clean", "contra_p_counter_clean", "contra_same_first_token"]
COLUMNS = [
    "dataset",
    "pair",
    "sample_index",
    "sample_id",
    "variant",
    "handoff",
    "strategy",
    "ratio",
    "applicable",
    "reason",
    "question",
    "gold",
    "answer",
    "kind",  # open | choice
    "f1",
    "correct_f1",
    "correct_contains",
    "gold_letter",
    "answer_letter",
    "correct_letter",
    "likelihood_letter",
    "correct_likelihood",
    "likelihood_note",
    "correct",  # the headline metric: correct_f1 for open answers, correct_letter for choices
    *TIME_COLUMNS,
    "bytes",
    "communication",
    "flops_sharer",
    "flops_receiver",
    "flops_total",
    "generated_tokens",
    "message",
    "selected_layers",
    *SWAP_COLUMNS,
    *CONTRADICTION_COLUMNS,
    "rank",
    "world_size",
    "seed",
]
LINE_END = "\r\n"


def part_path(out: Path, rank: int, world: int) -> Path:
    return out / ("rows.csv" if world == 1 else f"rows.part-{rank}-of-{world}.csv")


def row_files(out: Path) -> list[Path]:
    return sorted(Path(out).glob("rows*.csv"))


def read_csv(path: Path) -> pd.DataFrame:
    """A rows file as strings, exactly as written ("" stays "", never NaN)."""
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def read_rows(out: Path) -> pd.DataFrame:
    """Every part file in ``out`` merged into one table (the merge across ranks)."""
    frames = [read_csv(path) for path in row_files(out) if path.stat().st_size > 0]
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(frames, ignore_index=True)


def done_pairs(out: Path) -> set[tuple[str, str]]:
    rows = read_rows(out)
    return set(zip(rows["sample_id"], rows["variant"]))


def drop_partial_last_line(path: Path) -> None:
    """A run killed in the middle of a write leaves a line without its newline: cut it off."""
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(LINE_END.encode()):
        return
    cut = data.rfind(LINE_END.encode())
    path.write_bytes(data[: cut + 2] if cut >= 0 else b"")


def write_frame(path: Path, frame: pd.DataFrame) -> None:
    """Write a table atomically (a temporary file renamed over the old one)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    frame.to_csv(temporary, index=False, lineterminator=LINE_END)
    os.replace(temporary, path)


def drop_variants(out: Path, variants: set[str]) -> int:
    """Remove the rows of some variants from every part file (``--redo``); returns how many."""
    dropped = 0
    for path in row_files(out):
        drop_partial_last_line(path)
        rows = read_csv(path)
        keep = rows[~rows["variant"].isin(variants)]
        if len(keep) != len(rows):
            dropped += len(rows) - len(keep)
            write_frame(path, keep)
    return dropped


class RowWriter:
    """Appends rows to a CSV file and flushes each one (a killed run loses at most one row). A file
    begun by an older kvviz keeps its own columns (a newer column is left out of its rows)."""

    def __init__(self, path: Path):
        self.path = path
        drop_partial_last_line(path)
        new = not path.exists() or path.stat().st_size == 0
        self.columns = COLUMNS if new else list(read_csv(path).columns)
        self.handle = path.open("a", newline="", encoding="utf-8")
        if new:
            self.handle.write(",".join(COLUMNS) + LINE_END)
            self.handle.flush()

    def write(self, row: dict) -> None:
        pd.DataFrame([row], columns=self.columns).to_csv(self.handle, header=False, index=False, lineterminator=LINE_END)
        self.handle.flush()
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        self.handle.close()
