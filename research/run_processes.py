"""Distinct runs at once in the server's process against the same runs in worker processes
(issue 42; docs/SPEED.md 13.9; ``kvviz.engine.run_processes``):

    PYTHONPATH=. python research/run_processes.py [--runs 8] [--tokens 8] [--rounds 3] [--processes 2]

Each round, the same ``--runs`` distinct locker runs at once (each in a thread of its own, as the page's
requests come): once in this process (``kvviz.engine.stream.run`` on the loaded pair, as a server without
worker processes computes them), once through ``RunProcesses(--processes).run`` (as ``python app.py``
computes them); the order reversed every other round; then one run alone each way. Reported per arm:
wall seconds, the CPU seconds of this process and its workers, the voluntary context switches, and
whether every answer is the same both ways.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import sys
from pathlib import Path

from kvviz.engine.events import Done
from kvviz.engine.run_processes import RunProcesses
from kvviz.engine.runner import load_pair
from kvviz.engine.stream import ALL_AT_ONCE, run, use_one_thread_per_handoff
from kvviz.runtime.measure import clock
from kvviz.studies import run_speed

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from load_test import cpu_seconds, process_tree  # noqa: E402 (a script beside this one, as scripts/ab_app.py reads it)


def tree_counters() -> tuple[float, int]:
    """(CPU seconds, voluntary context switches) of this process and its workers so far."""
    switches = 0
    for pid in process_tree(os.getpid()):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            continue
        switches += sum(int(line.split()[1]) for line in status.splitlines() if line.startswith("voluntary_ctxt_switches:"))
    return cpu_seconds(os.getpid()), switches


def answers_of(batches) -> dict:
    return {event.handoff: event.result.get("answer_ids") for batch in batches for event in batch
            if isinstance(event, Done)}


def at_once(requests, one_run) -> tuple[float, float, int, list[dict]]:
    """``one_run(request) -> answers`` for every request at once, each in a thread: (wall, CPU
    seconds, context switches, answers)."""
    found: list[dict] = [{} for _ in requests]

    def one(index, request):
        found[index] = one_run(request)

    threads = [threading.Thread(target=one, args=(index, request)) for index, request in enumerate(requests)]
    cpu, switches = tree_counters()
    started = clock()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = clock() - started
    cpu_after, switches_after = tree_counters()
    return wall, cpu_after - cpu, switches_after - switches, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=8, help="distinct runs at once")
    parser.add_argument("--tokens", type=int, default=8, help="new tokens per answer (the class load test's 8)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2, help="worker processes (the app's default on this CPU)")
    args = parser.parse_args()
    use_one_thread_per_handoff()
    pair = load_pair("embedded")
    handoffs = list(run_speed.default_handoffs())
    requests = [run_speed.full_run_request(str(int(run_speed.FULL_RUN_GOLD) + i), tokens=args.tokens)
                for i in range(args.runs)]
    workers = RunProcesses(args.processes)
    arms = {
        "this process": lambda request: answers_of(run(pair.name, request, handoffs, ALL_AT_ONCE, loaded=pair)),
        f"{args.processes} worker processes": lambda request: answers_of(workers.run(pair.name, request, handoffs,
                                                                                     ALL_AT_ONCE)),
    }
    for one_run in arms.values():  # warm: the models in every worker, KVComm's calibration, the fusers
        at_once(requests[: 2 * args.processes], one_run)
    rows: dict[str, list] = {name: [] for name in arms}
    alone: dict[str, list] = {name: [] for name in arms}
    answers: dict[str, list] = {}
    for round_index in range(args.rounds):
        names = list(arms) if round_index % 2 == 0 else list(reversed(arms))
        for name in names:
            wall, cpu, switches, found = at_once(requests, arms[name])
            rows[name].append((wall, cpu, switches))
            answers[name] = found
        for name in names:
            alone[name].append(at_once(requests[:1], arms[name])[:2])
    workers.close()
    print(f"{args.runs} distinct runs at once, {args.tokens} new tokens, {os.cpu_count()} cores")
    for name in arms:
        print(f"{name}: wall {[round(r[0], 2) for r in rows[name]]} s, CPU {[round(r[1], 1) for r in rows[name]]} s, "
              f"context switches {[r[2] for r in rows[name]]}; one run alone {[round(a[0], 2) for a in alone[name]]} s "
              f"({[round(a[1], 1) for a in alone[name]]} CPU-s)")
    first, second = arms
    ratios = [b[0] / a[0] for a, b in zip(rows[first], rows[second])]
    print(f"wall, worker processes over this process, per round: {[round(r, 3) for r in ratios]} "
          f"(median {statistics.median(ratios):.3f})")
    at_once_over_alone = {name: statistics.median(r[0] for r in rows[name]) / statistics.median(a[0] for a in alone[name])
                          for name in arms}
    print("runs at once over one run alone:", {name: round(value, 2) for name, value in at_once_over_alone.items()})
    print("every answer the same both ways:", answers[first] == answers[second])


if __name__ == "__main__":
    main()
