"""The knowing sharer's table: ``python -m kvviz knower-report --bench DIR [--probe FILE]``.

Reads a ``bench --pair knower --dataset handbook --swap`` run (its rows: every handoff on the
held-out entities, and again on the pair whose sharer learned the opposite) and writes what issue
44 asks of it:

* per handoff, right (the knowing sharer's value), **followed** (on the opposite pair it gives the
  permuted sharer's value, not the first one) and kept, each with its 95% Wilson interval;
* paired comparisons on the same questions (``kvviz.data.stats.paired_comparison``:
  the difference with a bootstrap 95% interval, the discordant counts, McNemar's exact p):
  C2C against its control, against the receiver alone, and text against the receiver alone, for
  being right and for following;
* C2C's follow rate where text follows (of the questions on which text followed the permuted
  sharer, the share C2C followed too): the issue's goal is at least half;
* with ``--probe`` (``probe-kv``'s JSON), where the answer can be read in each model's KV.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from kvviz.data import format_p, handbook, wilson_interval
from kvviz.studies.bench.rows import read_rows
from kvviz.data.stats import paired_comparison
from kvviz.studies.knower.probe import best_cells

# (first, second, what the difference says)
COMPARISONS = (
    ("c2c", "c2c_control", "C2C minus its control"),
    ("c2c", "receiver", "C2C minus the receiver alone"),
    ("text", "receiver", "text minus the receiver alone"),
    ("c2c", "text", "C2C minus text"),
)


def configure_parser(parser) -> None:
    parser.add_argument("--bench", required=True, help="the folder of a bench --pair knower --dataset handbook --swap run")
    parser.add_argument("--probe", action="append", default=None,
                        help="probe-kv's JSON report, for where the knowledge is (repeat for several; their models are listed together)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    parser.add_argument("--out", default=None, help="also write the markdown here")


def outcomes(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per variant, its judged rows (sample id -> right, followed, kept as 0/1), in the run's order."""
    rows = rows.fillna("")
    judged = rows[rows["swap_outcome"].astype(str) != ""]
    out = {}
    for name, group in judged.groupby("variant", sort=False):
        frame = group.set_index(group["sample_id"].astype(str))[["right", "followed", "kept"]]
        out[name] = frame.apply(pd.to_numeric, errors="coerce").fillna(0).astype(int)
    return out


def rate(hits: int, n: int) -> str:
    if not n:
        return "n/a"
    low, high = wilson_interval(hits, n)
    return f"{hits / n:.2f} [{low:.2f}, {high:.2f}] ({hits}/{n})"


def compare(first: pd.DataFrame, second: pd.DataFrame, column: str, seed: int) -> dict:
    shared = sorted(set(first.index) & set(second.index))
    return paired_comparison([int(first.at[s, column]) for s in shared], [int(second.at[s, column]) for s in shared], seed)


def follow_where_text_follows(by: dict[str, pd.DataFrame]) -> tuple[int, int] | None:
    """(questions both text and C2C followed on, questions text followed on)."""
    if "text" not in by or "c2c" not in by:
        return None
    text, c2c = by["text"], by["c2c"]
    followed = [s for s in text.index if text.at[s, "followed"] and s in c2c.index]
    return sum(int(c2c.at[s, "followed"]) for s in followed), len(followed)


def tables(rows: pd.DataFrame, seed: int = 0) -> str:
    by = outcomes(rows)
    chance = 1 / len(handbook.RELATIONS[0].values)
    lines = ["| handoff | n | right (the knowing sharer's value) | followed the sharer that learned the opposite | "
             "kept the first value |", "|---|---|---|---|---|"]
    for name, frame in by.items():
        n = len(frame)
        lines.append(f"| {name} | {n} | {rate(int(frame['right'].sum()), n)} | {rate(int(frame['followed'].sum()), n)} | "
                     f"{rate(int(frame['kept'].sum()), n)} |")
    lines += ["", f"Chance: 1/{len(handbook.RELATIONS[0].values)} = {chance:.3f} (a relation's twelve values).", "",
              "| paired, on the same questions | right: difference [95% CI] | only first / only second, McNemar p | "
              "followed: difference [95% CI] | only first / only second, McNemar p |", "|---|---|---|---|---|"]
    for first, second, label in COMPARISONS:
        if first not in by or second not in by:
            continue
        cells = []
        for column in ("right", "followed"):
            result = compare(by[first], by[second], column, seed)
            low, high = result["ci95"]
            cells += [f"{result['difference']:+.3f} [{low:+.3f}, {high:+.3f}]",
                      f"{result['only_first']} / {result['only_second']}, p = {format_p(result['mcnemar_p'])}"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    where = follow_where_text_follows(by)
    if where is not None:
        both, text = where
        lines += ["", f"Where text follows the sharer that learned the opposite ({text} questions), C2C follows too on "
                      f"{rate(both, text)} (goal: at least half)."]
    return "\n".join(lines) + "\n"


def probe_lines(report: dict) -> str:
    lines = ["", f"Where is the knowledge? (`probe-kv`; held-out entities in unseen phrasings, n = {report['test']}, "
                 f"chance {report['chance']:.3f}; the best layer and part per place)", "",
             "| model | " + " | ".join(report["places"]) + " |", "|---|" + "---|" * len(report["places"])]
    for model in report["reports"]:
        best = best_cells(model)
        cells = [f"{best[p]['accuracy']:.2f} [{best[p]['ci95'][0]:.2f}, {best[p]['ci95'][1]:.2f}] (layer {best[p]['layer']} "
                 f"{best[p]['part']})" for p in report["places"]]
        lines.append(f"| {model['model']}{' (its permuted values)' if model['permuted'] else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(args) -> int:
    rows = read_rows(Path(args.bench))
    if rows.empty:
        raise FileNotFoundError(f"no bench rows in {args.bench}")
    text = tables(rows, args.seed)
    if args.probe:
        reports = [json.loads(Path(path).read_text()) for path in args.probe]
        text += probe_lines({**reports[0], "reports": [model for report in reports for model in report["reports"]]})
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0
