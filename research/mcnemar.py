"""Paired comparison of benchmark variants: accuracy per variant and McNemar's exact test per pair.

    python research/mcnemar.py runs/table-countries/rows.csv
    python research/mcnemar.py runs/bench-countries/rows*.csv --pairs kvcomm@0.3:skyline,kvcomm@0.3:kvcomm-random@0.3

Reads rows with ``sample_id``, ``variant`` and ``correct`` (0/1) columns (``python -m kvviz bench``
rows or ``research/kvcomm_table.py`` rows). Two variants are compared on the samples both
answered: b = samples only the first got right, c = samples only the second got right; under the
null hypothesis that both are equally accurate each discordant sample is a fair coin, so the
exact two-sided p-value is min(1, 2 * P(Binomial(b + c, 1/2) <= min(b, c))).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvviz.data import paired_mcnemar  # noqa: E402

DEFAULT_PAIRS = (
    "kvcomm@0.3:skyline", "kvcomm@0.5:skyline", "kvcomm@0.7:skyline",
    "kvcomm@0.3:kvcomm-random@0.3", "kvcomm@0.3:kvcomm-contiguous@0.3", "kvcomm@0.3:kvcomm-prior@0.3",
    "kvcomm@0.3:kvcomm-builtin@0.3", "kvcomm@0.3:kvcomm-refmask@0.3", "kvcomm@0.3:kvcomm-query@0.3",
    "kvcomm@0.3:kvcomm-top0@0.3", "kvcomm-all:skyline", "kvcomm@0.3:receiver",
)


def read_correct(paths: list[Path]) -> dict[str, dict[str, int]]:
    """variant -> sample_id -> 0/1, from applicable rows."""
    table: dict[str, dict[str, int]] = {}
    for path in paths:
        with path.open(newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if str(row.get("applicable", "1")) not in ("1", "True", "true"):
                    continue
                table.setdefault(row["variant"], {})[row["sample_id"]] = int(float(row["correct"] or 0))
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", nargs="+", type=Path)
    parser.add_argument("--pairs", default=",".join(DEFAULT_PAIRS), help="FIRST:SECOND,... (missing variants are skipped)")
    args = parser.parse_args()
    table = read_correct(args.rows)
    print("| variant | n | accuracy |\n|---|---|---|")
    for variant, answers in table.items():
        print(f"| {variant} | {len(answers)} | {sum(answers.values()) / len(answers):.2f} |")
    print("\n| A | B | n | acc A | acc B | A - B | only A right | only B right | McNemar exact p |")
    print("|---|---|---|---|---|---|---|---|---|")
    for item in args.pairs.split(","):
        first, second = item.split(":")
        if first not in table or second not in table:
            continue
        r = paired_mcnemar(table, first, second)
        print(
            f"| {first} | {second} | {r['n']} | {r['acc_first']:.2f} | {r['acc_second']:.2f} | "
            f"{r['acc_first'] - r['acc_second']:+.2f} | {r['only_first']} | {r['only_second']} | {r['p']:.3g} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
