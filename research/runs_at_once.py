"""Several learners' runs on the models at once, in one process (issue 32): do their decode steps
share well enough that k distinct runs take much less than k runs one after another?

    PYTHONPATH=. python research/runs_at_once.py [--counts 1,2,4,8] [--repeats 2] [--tokens 32]

Each run is the page's six default handoffs (``kvviz.engine.stream.run``, every handoff at once) on
the locker preset with its own code (``4471``, ``4472`` ...: distinct questions, so nothing is shared
but the models). ``k`` runs start together, each in its own thread, as ``k`` learners' runs do on a
server whose models' gate lets ``k`` through; every model's decode steps are then shared by all the
sequences of all the runs (``kvviz.runtime.batching``). For each k, in rounds interleaved with
k = 1 so that the machine's load falls on all alike: the wall seconds until every run finished,
that over one run's (the target: 8 at once <= 3x one), over k runs one after another (k x one),
the mean and largest batch size the receiver's decode steps saw, and whether every handoff's answer
equals its answer when its run is alone.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch


def requests(count: int, tokens: int):
    from kvviz.core.results import GenerationSettings, HandoffRequest
    from kvviz.studies.speed import FULL_RUN_CONTEXT, FULL_RUN_QUERY

    made = []
    for index in range(count):
        code = str(4471 + index)
        made.append(HandoffRequest(query=FULL_RUN_QUERY, context=FULL_RUN_CONTEXT.replace("4471", code),
                                   generation=GenerationSettings(max_new_tokens=tokens)))
    return made


def run_all(pair, names, batch_of_requests) -> tuple[float, list[dict]]:
    """Every request's run at once, each in its own thread: (wall seconds, each run's results)."""
    from kvviz.engine.events import Done
    from kvviz.engine.stream import ALL_AT_ONCE, run

    found: list[dict] = [{} for _ in batch_of_requests]

    def one(index, request):
        for batch in run(pair.name, request, names, ALL_AT_ONCE, loaded=pair):
            for event in batch:
                if isinstance(event, Done):
                    found[index][event.handoff] = event.result

    threads = [threading.Thread(target=one, args=(i, r)) for i, r in enumerate(batch_of_requests)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the page serves: one torch thread per handoff
    from kvviz.engine.runner import load_pair
    from kvviz.handoffs.registry import default_handoffs

    pair = load_pair("embedded", "cpu", "float32", progress=lambda *a: None)
    names = default_handoffs()
    counts = [int(c) for c in args.counts.split(",")]
    most = requests(max(counts), args.tokens)
    alone = []
    for request in most:  # each run alone: the answers every run at once must give; also warms up
        alone.append(run_all(pair, names, [request])[1][0])
    walls = {count: [] for count in counts}
    sizes = {count: [] for count in counts}
    differ = {count: 0 for count in counts}
    for _ in range(args.repeats):
        for count in counts:
            wall, found = run_all(pair, names, most[:count])
            walls[count].append(wall)
            for index, results in enumerate(found):
                for name, result in results.items():
                    if result.get("answer_ids") != alone[index][name].get("answer_ids"):
                        differ[count] += 1
                    if name == "receiver":
                        sizes[count] += [(batch["mean_size"], batch["max_size"])
                                         for batch in result["details"].get("decode_batches", []) if batch.get("batched")]
    print("wall seconds per round:", walls, flush=True)
    one = statistics.median(walls[1]) if 1 in walls else None
    print(f"{len(names)} handoffs a run ({', '.join(names)}), {args.tokens} new tokens at most, "
          f"{args.repeats} rounds, torch threads {torch.get_num_threads()}")
    print("| runs at once | wall s (median [min, max]) | over one run | over one after another | receiver's batch, "
          "mean / largest | answers != alone |")
    print("|---|---|---|---|---|---|")
    for count in counts:
        median = statistics.median(walls[count])
        ratio = f"{median / one:.2f}x" if one else "n/a"
        serial = f"{median / (one * count):.2f}x" if one else "n/a"
        mean = (f"{statistics.mean(m for m, _ in sizes[count]):.1f} / {max(x for _, x in sizes[count])}"
                if sizes[count] else "n/a")
        print(f"| {count} | {median:.2f} [{min(walls[count]):.2f}, {max(walls[count]):.2f}] | {ratio} | {serial} | "
              f"{mean} | {differ[count]} |")


if __name__ == "__main__":
    main()
