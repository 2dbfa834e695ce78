"""Whole runs in this process: the speed report's warm run of the page's handoffs and its runs at once.

* ``full_run``: the page's default handoffs on the locker preset (32 new tokens at most), warm, wall
  time per repeat, three ways interleaved in each repeat:
  - ``warm_full_run_seconds``: through the page's engine (``kvviz.engine.stream.run``: every handoff
    at once, decode steps shared per model), recording nothing, with each handoff's own total and
    the wall time from the start to its first streamed answer token (``first_token_wall_seconds``);
  - ``warm_recorded_run_seconds``: the same run recording what crossed, as the page does
    (``HandoffRequest.inspect``: attention rows, the logit lens, the scores against the controls),
    with the CPU seconds each handoff's thread spent on the lens, the attention table and the
    scoring (``details["crossed_seconds"]``);
  - ``warm_serial_run_seconds``: one handoff after another (each alone).
* ``runs_at_once``: ``k`` learners' distinct runs (the locker preset with its own code each: nothing
  shared but the models) started together, each in its own thread, as ``k`` runs on a server whose
  models take ``k`` at once, computed where the served page computes them (``compute``: in its
  worker processes, ``kvviz.engine.run_processes``, or in this process); the wall seconds until every run finished, over one run's (the target: 8
  at once <= 3x one) and over ``k`` runs one after another, and whether every handoff's answer equals
  its answer when its run is alone. Rounds interleave the counts, so the machine's load falls on all.
"""

from __future__ import annotations

import statistics
import threading

from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine.events import Done, Failed, Stopped, Token
from kvviz.engine.runner import run_handoff
from kvviz.engine.stream import ALL_AT_ONCE, default_workers, run
from kvviz.handoffs.registry import default_handoffs
from kvviz.runtime.measure import clock, spread

FULL_RUN_QUERY = "What is the code for locker 12?"
FULL_RUN_CONTEXT = "The code for locker 12 is 4471."
FULL_RUN_GOLD = "4471"
FULL_RUN_TOKENS = 32
RUNS_AT_ONCE = (1, 4, 8)


def full_run_request(code: str = FULL_RUN_GOLD, record: bool = False, tokens: int = FULL_RUN_TOKENS) -> HandoffRequest:
    """The locker preset (with ``code`` in its note); ``record``: recording what crossed, as the page does."""
    return HandoffRequest(query=FULL_RUN_QUERY, context=FULL_RUN_CONTEXT.replace(FULL_RUN_GOLD, code),
                          generation=GenerationSettings(max_new_tokens=tokens), inspect={"gold": code} if record else None)


def engine_run(pair, request: HandoffRequest, handoffs: list[str], workers: int = ALL_AT_ONCE,
               compute=None) -> tuple[float, dict, dict]:
    """One run through the page's engine: (wall seconds, each handoff's result, each one's first
    streamed answer token in wall seconds from the start). ``compute``: where the run is computed,
    called as ``kvviz.engine.stream.run`` is (``RunProcesses.run``: in worker processes, as
    ``python app.py`` computes it); by default on ``pair`` in this process."""
    started = clock()
    done, first = {}, {}
    batches = (run(pair.name, request, handoffs, workers, loaded=pair) if compute is None
               else compute(pair.name, request, handoffs, workers))
    for event in (event for batch in batches for event in batch):
        match event:
            case Token(name) if name not in first:
                first[name] = clock() - started
            case Done(name, result):
                first.setdefault(name, clock() - started)
                done[name] = result
            case Failed(reason) | Stopped(reason):
                raise RuntimeError(f"the warm run could not finish: {reason}")
    return clock() - started, done, first


def plain_run(pair) -> float:
    """The wall seconds of one warm run of the page's default handoffs recording nothing (``/run`` as served)."""
    return engine_run(pair, full_run_request(), list(default_handoffs()), default_workers())[0]


def full_run(pair, repeats: int, handoffs: list[str] | None = None) -> dict:
    """The warm run, three ways per repeat (the module docstring)."""
    handoffs = list(handoffs or default_handoffs())
    plain_request, recorded_request = full_run_request(), full_run_request(record=True)
    walls = {"plain": [], "recorded": [], "serial": []}
    per_handoff, first_seen = {name: [] for name in handoffs}, {name: [] for name in handoffs}
    crossed_cpu: dict[str, list[float]] = {}
    answers, tokens, batches = {}, {}, {}
    for repeat in range(repeats + 1):  # the first run warms up (calibration, fusers, head index)
        wall, done, first = engine_run(pair, plain_request, handoffs, default_workers())
        recorded_wall, recorded, _ = engine_run(pair, recorded_request, handoffs, default_workers())
        started = clock()
        alone = {name: run_handoff(name, pair, plain_request) for name in handoffs}
        serial_wall = clock() - started
        if repeat:
            walls["plain"].append(wall)
            walls["recorded"].append(recorded_wall)
            walls["serial"].append(serial_wall)
            for name, seconds in first.items():
                first_seen[name].append(seconds)
            for name, data in recorded.items():
                for part, seconds in data["details"].get("crossed_seconds", {}).items():
                    crossed_cpu.setdefault(part, []).append(seconds)
        for name, data in done.items():
            if repeat:
                per_handoff[name].append(data["timings"].get("total", 0.0) if data["applicable"] else 0.0)
            answers[name] = data["answer"] if data["applicable"] else f"(not applicable: {data['reason']})"
            tokens[name] = data["tokens"].get("generated", 0)
            batches[name] = data["details"].get("decode_batches", [])
            if data["applicable"] and recorded[name]["answer"] != data["answer"]:
                answers[name] += f" (recording: {recorded[name]['answer']!r})"
        for name, result in alone.items():
            if result.applicable and result.answer != done[name]["answer"]:
                answers[name] += f" (alone: {result.answer!r})"
    per_repeat = max(1, repeats)
    return {
        "handoffs": handoffs,
        "query": FULL_RUN_QUERY,
        "context": FULL_RUN_CONTEXT,
        "max_new_tokens": FULL_RUN_TOKENS,
        "workers": default_workers(),
        "warm_full_run_seconds": spread(walls["plain"]),
        "warm_recorded_run_seconds": spread(walls["recorded"]),
        "warm_serial_run_seconds": spread(walls["serial"]),
        "recorded_over_plain": spread([r / p for r, p in zip(walls["recorded"], walls["plain"])]),
        # CPU seconds a recorded run's handoff threads spent per part of what crossed (summed over handoffs)
        "crossed_cpu_seconds_per_run": {part: sum(values) / per_repeat for part, values in crossed_cpu.items()},
        "handoff_seconds": {name: spread(values) for name, values in per_handoff.items()},
        "first_token_wall_seconds": {name: spread(values) for name, values in first_seen.items()},
        "generated_tokens": tokens,
        "decode_batches": batches,
        "answers": answers,
    }


def runs_together(pair, requests: list[HandoffRequest], handoffs: list[str], compute=None) -> tuple[float, list[dict]]:
    """Every request's run at once, each in its own thread: (wall seconds, each run's results);
    ``compute`` as ``engine_run`` takes it."""
    found: list[dict] = [{} for _ in requests]

    def one(index, request):
        found[index] = engine_run(pair, request, handoffs, compute=compute)[1]

    threads = [threading.Thread(target=one, args=(i, r)) for i, r in enumerate(requests)]
    started = clock()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return clock() - started, found


def runs_at_once(pair, counts=RUNS_AT_ONCE, repeats: int = 2, tokens: int = FULL_RUN_TOKENS,
                 handoffs: list[str] | None = None, compute=None) -> dict:
    """``k`` distinct runs at once for each ``k`` of ``counts`` (the module docstring); ``compute`` as
    ``engine_run`` takes it."""
    handoffs = list(handoffs or default_handoffs())
    requests = [full_run_request(str(int(FULL_RUN_GOLD) + index), tokens=tokens) for index in range(max(counts))]
    if compute is not None:  # every worker process loads the models and warms up before anything is timed
        runs_together(pair, requests, handoffs, compute)
    alone = [runs_together(pair, [request], handoffs, compute)[1][0] for request in requests]  # also warms up
    walls: dict[int, list[float]] = {count: [] for count in counts}
    differ = {count: 0 for count in counts}
    receiver_batches: dict[int, list[int]] = {count: [] for count in counts}
    for _ in range(repeats):
        for count in counts:
            wall, found = runs_together(pair, requests[:count], handoffs, compute)
            walls[count].append(wall)
            for index, results in enumerate(found):
                for name, result in results.items():
                    differ[count] += result.get("answer_ids") != alone[index][name].get("answer_ids")
                    if name == "receiver":
                        receiver_batches[count] += [b["max_size"] for b in result["details"].get("decode_batches", [])
                                                    if b.get("batched")]
    one = statistics.median(walls[counts[0]]) if counts[0] == 1 else None
    return {
        "handoffs": handoffs, "max_new_tokens": tokens, "repeats": repeats,
        "counts": {
            str(count): {
                "wall_seconds": spread(walls[count]),
                "over_one_run": statistics.median(walls[count]) / one if one else None,
                "over_one_after_another": statistics.median(walls[count]) / (one * count) if one else None,
                "receiver_largest_batch": max(receiver_batches[count], default=0),
                "answers_different_from_alone": differ[count],
            } for count in counts
        },
    }
