"""Compare the answers of two benchmark runs sample by sample (e.g. two precisions or head paths).

    KVVIZ_FAST_HEAD=1 python -m kvviz bench --pair embedded --dataset countries --handoffs receiver,skyline \\
        --limit 100 --seed 0 --threads 1 --out runs/head-fast
    KVVIZ_FAST_HEAD=0 python -m kvviz bench ... --out runs/head-full
    python scripts/compare_runs.py runs/head-fast runs/head-full

Prints, per variant, how many answers are identical and the accuracy of each run, then the
samples whose answers differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first")
    parser.add_argument("second")
    args = parser.parse_args(argv)

    from kvviz.studies.bench.rows import read_rows

    first, second = read_rows(Path(args.first)), read_rows(Path(args.second))
    merged = first.merge(second, on=["dataset", "sample_index", "variant"], suffixes=("_1", "_2"))
    if merged.empty:
        print("no sample and variant in common")
        return 1
    merged["same"] = merged["answer_1"].fillna("") == merged["answer_2"].fillna("")
    print(f"| variant | samples | identical answers | accuracy {args.first} | accuracy {args.second} |")
    print("|---|---|---|---|---|")
    for (dataset, variant), group in merged.groupby(["dataset", "variant"]):
        print(f"| {dataset} {variant} | {len(group)} | {int(group['same'].sum())} | "
              f"{group['correct_1'].astype(float).mean():.3f} | {group['correct_2'].astype(float).mean():.3f} |")
    for _, row in merged[~merged["same"]].iterrows():
        print(f"  {row['dataset']} #{row['sample_index']} {row['variant']}: {row['answer_1']!r} vs {row['answer_2']!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
