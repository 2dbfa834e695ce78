"""Several learners' runs on the models at once, in one process (issue 32): do their decode steps
share well enough that k distinct runs take much less than k runs one after another?

    PYTHONPATH=. python research/runs_at_once.py [--counts 1,2,4,8] [--repeats 2] [--tokens 32]

The measurement is the speed report's (``kvviz.studies.run_speed.runs_at_once``, which ``python -m kvviz
bench --perf --speed-only`` runs for 1, 4 and 8): each run is the page's six default handoffs on the
locker preset with its own code (``4471``, ``4472`` ...: distinct questions, so nothing is shared but the
models); ``k`` runs start together, each in its own thread, as ``k`` learners' runs do on a server whose
models' gate lets ``k`` through. For each k, in rounds interleaved over the counts: the wall seconds
until every run finished, that over one run's (the target: 8 at once <= 3x one) and over k runs one
after another, the largest batch the receiver's decode steps saw, and how many answers differ from
their run alone. This script prints it for any counts, in this process's numeric mode.
"""

from __future__ import annotations

import argparse

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the page serves: one torch thread per handoff
    from kvviz.engine.runner import load_pair
    from kvviz.studies.run_speed import runs_at_once

    pair = load_pair("embedded", "cpu", progress=lambda *a: None)
    counts = tuple(int(c) for c in args.counts.split(","))
    report = runs_at_once(pair, counts, args.repeats, args.tokens)
    print(f"{len(report['handoffs'])} handoffs a run ({', '.join(report['handoffs'])}), {args.tokens} new tokens at most, "
          f"{args.repeats} rounds, numeric mode {pair.receiver.numerics}")
    print("| runs at once | wall s (median [min, max]) | over one run | over one after another | receiver's largest batch "
          "| answers != alone |")
    print("|---|---|---|---|---|---|")
    for count, entry in report["counts"].items():
        wall = entry["wall_seconds"]
        print(f"| {count} | {wall['median']:.2f} [{wall['min']:.2f}, {wall['max']:.2f}] | {entry['over_one_run'] or 0:.2f}x | "
              f"{entry['over_one_after_another'] or 0:.2f}x | {entry['receiver_largest_batch']} | {entry['answers_different_from_alone']} |")


if __name__ == "__main__":
    main()
