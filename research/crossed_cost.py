"""What recording what crossed costs (issue 22), in-process, without the app around it.

    PYTHONPATH=. OMP_NUM_THREADS=1 python research/crossed_cost.py [--rounds 4]

1. The page's default handoffs on the first preset, one after another (``kvviz.engine.stream.results``),
   with and without ``HandoffRequest.inspect``, interleaved: median wall and process CPU time each
   way and their ratio (the app's own measurement is ``scripts/bench_app.py --crossed both``).
2. The logit lens alone (one fp32 pass of the receiver's output head for every layer's row) on a few
   presets, against the same from the head's packed bfloat16 copy (where the CPU has it): time, and
   the largest difference in the first answer token's probability.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kvviz.app.presets import PRESETS
from kvviz.engine import stream
from kvviz.engine.runner import load_pair, run_handoff
from kvviz.handoffs.registry import build_request, default_handoffs
from kvviz.runtime import crossed


def timed(pair, names, inspect):
    request = build_request(PRESETS[0].query, PRESETS[0].context, 32, inspect=inspect)
    wall, cpu = time.perf_counter(), time.process_time()  # the run's handoffs run in worker threads
    stream.results(pair, request, names)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = load_pair("embedded", progress=lambda message: None)
    names = default_handoffs()
    timed(pair, names, None), timed(pair, names, {"gold": PRESETS[0].answers[0]})  # warm-up each way
    rows = {"off": [], "on": []}
    for _ in range(args.rounds):
        rows["off"].append(timed(pair, names, None))
        rows["on"].append(timed(pair, names, {"gold": PRESETS[0].answers[0]}))
    for index, what in enumerate(("wall", "process CPU")):
        on, off = (statistics.median(run[index] for run in rows[way]) for way in ("on", "off"))
        print(f"{what}: recording {on:.2f} s, not recording {off:.2f} s (median of {args.rounds}): x{on / off:.3f}")

    head = pair.receiver.head
    seen = {}
    lens = crossed.logit_lens

    def keep(inspection):
        seen["hidden"], seen["ids"] = inspection.lens_hidden, inspection.answer_ids
        return lens(inspection)

    crossed.logit_lens = keep
    try:
        for preset in PRESETS[:3]:
            run_handoff("kvcomm", pair, build_request(preset.query, preset.context, 8, inspect={}))
            hidden, token = seen["hidden"], seen["ids"][0]
            started = time.perf_counter()
            exact = torch.softmax(head.logits(hidden), dim=-1)[:, token]
            exact_seconds = time.perf_counter() - started
            wide = head._wide_scan()
            if wide is None:
                print(f"{preset.key}: exact lens {exact_seconds:.3f} s; no bfloat16 copy on this CPU")
                continue
            started = time.perf_counter()
            logits = torch.ops.mkldnn._linear_pointwise(hidden.to(torch.bfloat16), wide, None, "none", [], "")
            approximate = torch.softmax(logits.float(), dim=-1)[:, token]
            print(f"{preset.key}: exact lens {exact_seconds:.3f} s, bfloat16 {time.perf_counter() - started:.3f} s, "
                  f"largest probability difference {float((exact - approximate).abs().max()):.4f}")
    finally:
        crossed.logit_lens = lens


if __name__ == "__main__":
    main()
