"""A whole run with and without the shared decode, in one process, interleaved (issue 20).

    PYTHONPATH=. python research/batched_run.py [--repeats 3] [--threads 1]

The page's six default handoffs on the locker preset, warm, A B C A B C ...:
(a) one after another, each decode token through the model's own forward (``KVVIZ_BATCHED_DECODE=0``,
    the engine before issue 20); (b) through ``kvviz.engine.stream.run`` two side by side, the same
    decode path (the page's engine before issue 20); (c) through ``run`` all at once with the
    decode steps shared per model (the page's engine now). Wall seconds and the process's CPU
    seconds (the work done, which another process on the machine does not inflate), the batch sizes each
    handoff's decode saw, and whether every handoff's answer is the same in (a) and (c).
(The phase-A prototype of (c) patched its own decode loop into the handoffs; it is now the engine's.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from kvviz.engine.events import Done
    from kvviz.engine.runner import load_pair, run_handoff
    from kvviz.engine.stream import ALL_AT_ONCE, run
    from kvviz.handoffs.registry import default_handoffs
    from kvviz.studies.run_speed import full_run_request

    pair = load_pair("embedded", "cpu", "float32", progress=lambda *a: None)
    names = default_handoffs()
    request = full_run_request()

    def with_batching(on: bool, function):
        os.environ["KVVIZ_BATCHED_DECODE"] = "1" if on else "0"
        try:
            return function()
        finally:
            os.environ.pop("KVVIZ_BATCHED_DECODE")

    def streamed(workers):
        events = [event for batch in run(pair.name, request, names, workers, loaded=pair) for event in batch]
        return {event.handoff: event.result for event in events if isinstance(event, Done)}

    variants = {
        "before: one after another, the model's own forward": lambda: with_batching(
            False, lambda: {n: run_handoff(n, pair, request).to_dict() for n in names}),
        "before: kvviz.engine.stream, two side by side": lambda: with_batching(False, lambda: streamed(2)),
        "now: kvviz.engine.stream, all at once, decode steps shared": lambda: with_batching(True, lambda: streamed(ALL_AT_ONCE)),
    }
    results = {label: function() for label, function in variants.items()}  # warm-up
    walls = {label: [] for label in variants}
    work = {label: [] for label in variants}
    for _ in range(args.repeats):
        for label, function in variants.items():
            started, cpu = time.perf_counter(), time.process_time()
            results[label] = function()
            walls[label].append(time.perf_counter() - started)
            work[label].append(time.process_time() - cpu)
    print(f"warm run of {', '.join(names)} on the locker preset, {args.threads} torch thread(s), median [min, max] of "
          f"{args.repeats}, interleaved: wall s, and the CPU seconds the process used (the work, whatever else the machine runs):")
    for label in variants:
        w, c = walls[label], work[label]
        print(f"  {label}: wall {statistics.median(w):.2f} [{min(w):.2f}, {max(w):.2f}] s; "
              f"CPU {statistics.median(c):.2f} [{min(c):.2f}, {max(c):.2f}] s")
    before, now = results[next(iter(variants))], results[list(variants)[-1]]
    for name in names:
        batches = [(b["steps"], round(b["mean_size"], 1), b["max_size"]) for b in now[name]["details"].get("decode_batches", []) if b["batched"]]
        print(f"  {name}: same answer as before {now[name]['answer_ids'] == before[name]['answer_ids']}; "
              f"{now[name]['answer']!r}; decode (steps, mean batch, largest) {batches}; own total {now[name]['timings']['total']:.2f} s")


if __name__ == "__main__":
    main()
