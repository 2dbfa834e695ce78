"""Why distinct runs at once use about 1.5 of this machine's 2 cores, and two levers that did not change it
(issue 42; docs/SPEED.md 13.8). In this process, on the embedded pair, as the page serves it (one torch
thread per handoff, ``kvviz.engine.stream.use_one_thread_per_handoff``):

    PYTHONPATH=. python research/run_threads.py cores [--runs 8] [--tokens 8]
    PYTHONPATH=. python research/run_threads.py switch [--runs 8] [--tokens 8] [--rounds 4] [--intervals 5,0.2]
    PYTHONPATH=. python research/run_threads.py team [--runs 8] [--tokens 8] [--rounds 4]
    PYTHONPATH=. python research/run_threads.py intra [--tokens 32] [--rounds 4]

``cores``: ``--runs`` distinct locker runs at once (``run_speed.runs_together``), the process's CPU
seconds per wall second every 0.25 s: whether the cores idle throughout or only in the tail.

``switch``: the same runs at once and one run alone, under each of Python's switch intervals
(``sys.setswitchinterval``, milliseconds; a thread that comes back from a torch operation waits up to
that long for the interpreter behind a thread running Python), rounds interleaved, the order reversed
every other round; wall and CPU seconds, and whether every answer is the same.

``team``: MKL's and oneDNN's products size their OpenMP team from the calling thread's own setting, which
``torch.set_num_threads`` sets for the thread that calls it; a thread started later keeps the process
default (every core) until torch's own parallel loops set it. First a new thread whose first operations
are fp32 products (the CPU seconds of the whole process against the thread's own), then the runs at once
as served against the same runs with every new thread set to torch's count before it runs
(``torch.set_num_threads(torch.get_num_threads())`` at the start of each thread), rounds interleaved.

``intra``: would a run alone finish sooner with two torch threads per product (the other core is not
idle: the run's handoffs are threads)? First, which products keep a row's bits at one and at two threads
(MKL's ``F.linear``, the prompt passes; oneDNN's packed product, the decode step) on the stack's matrix
shapes; then one locker run alone at one and at two threads, rounds interleaved, the order reversed
every other round: wall and CPU seconds, and whether every answer is the same.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import torch

from kvviz.engine.runner import load_pair
from kvviz.engine.stream import use_one_thread_per_handoff
from kvviz.studies import run_speed


def the_runs(count: int, tokens: int):
    pair = load_pair("embedded")
    handoffs = list(run_speed.default_handoffs())
    requests = [run_speed.full_run_request(str(int(run_speed.FULL_RUN_GOLD) + i), tokens=tokens) for i in range(count)]
    for request in requests[:2]:  # warm: the models, KVComm's calibration, the fusers
        run_speed.runs_together(pair, [request], handoffs)
    return pair, handoffs, requests


def timed(pair, handoffs, requests):
    cpu = time.process_time()
    wall, found = run_speed.runs_together(pair, requests, handoffs)
    answers = [{name: result.get("answer_ids") for name, result in results.items()} for results in found]
    return wall, time.process_time() - cpu, answers


def cores(args) -> None:
    pair, handoffs, requests = the_runs(args.runs, args.tokens)
    samples, stop = [], threading.Event()

    def sample():
        cpu, wall = time.process_time(), time.perf_counter()
        while not stop.wait(0.25):
            now_cpu, now_wall = time.process_time(), time.perf_counter()
            samples.append(round((now_cpu - cpu) / (now_wall - wall), 2))
            cpu, wall = now_cpu, now_wall

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    wall, cpu, _ = timed(pair, handoffs, requests)
    stop.set()
    sampler.join()
    print(f"{args.runs} runs at once: {wall:.2f} s, {cpu:.2f} CPU-s ({cpu / wall:.2f} cores)")
    print("cores used every 0.25 s:", samples)


def switch(args) -> None:
    intervals = [float(value) for value in args.intervals.split(",")]
    pair, handoffs, requests = the_runs(args.runs, args.tokens)
    rows: dict[float, list[tuple[float, float, float, float]]] = {interval: [] for interval in intervals}
    answers: dict[float, list] = {}
    default = sys.getswitchinterval()
    try:
        for round_index in range(args.rounds):
            for interval in intervals if round_index % 2 == 0 else list(reversed(intervals)):
                sys.setswitchinterval(interval / 1000)
                wall, cpu, found = timed(pair, handoffs, requests)
                answers.setdefault(interval, found)
                wall_one, cpu_one, _ = timed(pair, handoffs, requests[:1])
                rows[interval].append((wall, cpu, wall_one, cpu_one))
                print(f"round {round_index + 1}, {interval} ms: {args.runs} at once {wall:.2f} s ({cpu:.2f} CPU-s), "
                      f"one {wall_one:.2f} s ({cpu_one:.2f} CPU-s)", flush=True)
    finally:
        sys.setswitchinterval(default)
    first = intervals[0]
    for interval, measured in rows.items():
        ratios = [row[0] / base[0] for row, base in zip(measured, rows[first])]
        print(f"{interval} ms: {args.runs} at once median {statistics.median(r[0] for r in measured):.2f} s "
              f"({statistics.median(r[1] for r in measured):.2f} CPU-s), one {statistics.median(r[2] for r in measured):.2f} s; "
              f"per round over {first} ms {[round(ratio, 3) for ratio in ratios]}")
    print("every answer the same under every interval:", all(found == answers[first] for found in answers.values()))


def team(args) -> None:
    torch.set_num_threads(1)
    weight = torch.randn(640, 2048)
    rows = torch.randn(54, 2048)

    def set_first():
        torch.set_num_threads(torch.get_num_threads())

    def fp32_products(setting_first: bool, seconds: dict):
        if setting_first:
            set_first()
        cpu, own = time.process_time(), time.thread_time()
        for _ in range(200):
            torch.nn.functional.linear(rows, weight)
        seconds["process"], seconds["thread"] = time.process_time() - cpu, time.thread_time() - own

    for setting_first in (False, True):
        seconds: dict = {}
        worker = threading.Thread(target=fp32_products, args=(setting_first, seconds))
        worker.start()
        worker.join()
        print(f"a new thread's fp32 products (F.linear, MKL), torch set to 1 thread, "
              f"{'set first' if setting_first else 'as started'}: the process spent "
              f"{seconds['process']:.3f} CPU-s, the thread itself {seconds['thread']:.3f}")

    use_one_thread_per_handoff()
    pair, handoffs, requests = the_runs(args.runs, args.tokens)
    start = threading.Thread.run

    def run_set_first(thread):
        set_first()
        return start(thread)

    rows_by: dict[str, list[tuple[float, float]]] = {"as served": [], "every thread set first": []}
    answers: dict[str, list] = {}
    try:
        for round_index in range(args.rounds):
            for label in list(rows_by) if round_index % 2 == 0 else list(reversed(rows_by)):
                threading.Thread.run = run_set_first if label == "every thread set first" else start
                wall, cpu, found = timed(pair, handoffs, requests)
                answers.setdefault(label, found)
                rows_by[label].append((wall, cpu))
                print(f"round {round_index + 1}, {label}: {args.runs} at once {wall:.2f} s ({cpu:.2f} CPU-s)", flush=True)
    finally:
        threading.Thread.run = start
    base = rows_by["as served"]
    for label, measured in rows_by.items():
        print(f"{label}: median {statistics.median(r[0] for r in measured):.2f} s, "
              f"{statistics.median(r[1] for r in measured):.2f} CPU-s; per round over as served: wall "
              f"{[round(r[0] / b[0], 3) for r, b in zip(measured, base)]}, CPU {[round(r[1] / b[1], 3) for r, b in zip(measured, base)]}")
    print("every answer the same both ways:", answers["as served"] == answers["every thread set first"])


def intra(args) -> None:
    import torch.nn.functional as F

    torch.manual_seed(0)
    for out_features, in_features in ((2048, 640), (640, 2048), (1024, 640), (256, 640)):
        weight = torch.randn(out_features, in_features) * 0.02
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        same = {"MKL": [], "oneDNN packed": []}
        for rows in (1, 6, 16, 33, 97):
            x = torch.randn(rows, in_features)
            outputs = {}
            for threads in (1, 2):
                torch.set_num_threads(threads)
                outputs[threads] = (F.linear(x, weight), torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
            for index, kernel in enumerate(same):
                if torch.equal(outputs[1][index], outputs[2][index]):
                    same[kernel].append(rows)
        print(f"[{out_features} x {in_features}] rows whose bits are the same at 1 and 2 threads: "
              + "; ".join(f"{kernel} {rows}" for kernel, rows in same.items()))
    torch.set_num_threads(1)
    pair, handoffs, requests = the_runs(1, args.tokens)
    rows: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    answers: dict[int, list] = {}
    for round_index in range(args.rounds):
        for threads in (1, 2) if round_index % 2 == 0 else (2, 1):
            torch.set_num_threads(threads)
            wall, cpu, found = timed(pair, handoffs, requests)
            answers.setdefault(threads, found)
            rows[threads].append((wall, cpu))
            print(f"round {round_index + 1}, {threads} thread(s): {wall:.2f} s ({cpu:.2f} CPU-s)", flush=True)
    torch.set_num_threads(1)
    for threads, measured in rows.items():
        print(f"{threads} thread(s): median {statistics.median(r[0] for r in measured):.2f} s, "
              f"{statistics.median(r[1] for r in measured):.2f} CPU-s; per round over one thread "
              f"{[round(r[0] / b[0], 3) for r, b in zip(measured, rows[1])]}")
    print("every answer the same at 1 and 2 threads:", answers[1] == answers[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("cores", "switch", "team", "intra"))
    parser.add_argument("--runs", type=int, default=8, help="distinct runs at once")
    parser.add_argument("--tokens", type=int, default=None,
                        help="new tokens per answer (default: 8, the class load test's; intra: 32, the speed report's)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--intervals", default="5,0.2", help="switch intervals in milliseconds, the first is the baseline")
    args = parser.parse_args()
    if args.tokens is None:
        args.tokens = run_speed.FULL_RUN_TOKENS if args.what == "intra" else 8
    if args.what not in ("team", "intra"):
        use_one_thread_per_handoff()
    {"cores": cores, "switch": switch, "team": team, "intra": intra}[args.what](args)


if __name__ == "__main__":
    main()
