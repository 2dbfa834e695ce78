"""Pair two benchmark runs of the same samples under two prompt layouts (``research/layout_bench.py``).

    python research/layout_compare.py runs/layout-plain-countries runs/layout-fewshot3-countries

Per variant (receiver, skyline, kvcomm@R ...): accuracy of each run by both of the project's
metrics (token F1 > 0.5, the benchmark's ``correct``; and "contains a gold answer"), the samples
only one run got right and McNemar's exact p (``research/mcnemar.py``), empty answers, the median
answer length in words, how many answers repeat a worked example's answer where the gold answer is
something else (the few-shot layout's copying risk), and the median prefill times of the second
run over the first (receiver prefill; KVComm's sender prefill), measured in the two runs: compare
them only when both ran side by side on the same machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mcnemar import mcnemar_exact  # noqa: E402
from skyline_probe import NEUTRAL_EXAMPLES, WORKED_EXAMPLES  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--show", type=int, default=0, help="print this many answers that changed per variant")
    args = parser.parse_args(argv)

    from kvviz.data import normalize_answer
    from kvviz.studies.bench.rows import read_rows

    first, second = read_rows(args.first), read_rows(args.second)
    merged = first.merge(second, on=["dataset", "sample_id", "variant"], suffixes=("_a", "_b"))
    examples = {normalize_answer(answer) for _, _, answer in WORKED_EXAMPLES + NEUTRAL_EXAMPLES}
    print(f"A = {args.first}, B = {args.second}; {merged['sample_id'].nunique()} samples in both\n")
    print("| variant | n | A F1>0.5 | B F1>0.5 | only A | only B | McNemar p | A contains | B contains | only A | only B | "
          "McNemar p | empty A / B | words A / B | copies an example A / B | prefill B/A |")
    print("|" + "---|" * 16)
    for variant, rows in merged.groupby("variant", sort=False):
        cells = [variant, str(len(rows))]
        for metric in ("correct_f1", "correct_contains"):
            a, b = rows[f"{metric}_a"].astype(int), rows[f"{metric}_b"].astype(int)
            only_a, only_b = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
            cells += [f"{a.mean():.2f}", f"{b.mean():.2f}"] if metric == "correct_f1" else [f"{a.mean():.2f}", f"{b.mean():.2f}"]
            cells += [str(only_a), str(only_b), f"{mcnemar_exact(only_a, only_b):.3g}"]
        answers_a, answers_b = rows["answer_a"].fillna("").astype(str), rows["answer_b"].fillna("").astype(str)
        empty = f"{int((answers_a.str.strip() == '').sum())} / {int((answers_b.str.strip() == '').sum())}"
        words = f"{statistics.median(len(x.split()) for x in answers_a):g} / {statistics.median(len(x.split()) for x in answers_b):g}"

        def copies(answers) -> int:
            return sum(1 for answer, gold in zip(answers, rows["gold_a"].fillna("").astype(str))
                       if normalize_answer(answer) in examples and normalize_answer(answer) not in
                       {normalize_answer(g) for g in gold.split(" | ")})

        stage = "time_sharer_prefill" if variant.startswith("kvcomm") else "time_receiver_prefill"
        ratio = rows[f"{stage}_b"].astype(float).median() / max(1e-9, rows[f"{stage}_a"].astype(float).median())
        cells += [empty, words, f"{copies(answers_a)} / {copies(answers_b)}", f"{ratio:.2f}"]
        print("| " + " | ".join(cells) + " |")
        if args.show:
            changed = rows[answers_a != answers_b].head(args.show)
            for _, row in changed.iterrows():
                print(f"    {row['sample_id']} gold {row['gold_a']!r}: A {row['answer_a']!r} -> B {row['answer_b']!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
