"""The batched step (kvviz/runtime/step.py) at 1 and 2 torch threads, wall clock, B = 1 and 6, interleaved
rounds (min of the per-round medians), beside streaming the stack's weights at the same thread count."""

import statistics
import sys
import time

import torch

from kvviz.runtime import cache as kv
from kvviz.runtime.decode import prefill
from kvviz.runtime.models import load_model
from kvviz.runtime.step import DecodeStep
from kvviz.studies.model_speed import prompt_ids


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "gemma3-270m"
    loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
    torch.set_num_threads(1)
    base = kv.KVState(); first, _ = prefill(loaded, base, prompt_ids(loaded, 32)); token = first.greedy_token()
    step = DecodeStep(loaded)
    stack = list(loaded.model.model.layers.parameters())
    res = {}
    for rnd in range(5):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            t = time.perf_counter(); [p.sum() for p in stack]; res.setdefault(("stream", threads), []).append(time.perf_counter() - t)
            for B in (1, 6):
                states = [base.copy() for _ in range(B)]
                times = []
                for _ in range(6):
                    t = time.perf_counter(); step.step(states, [token] * B); times.append(time.perf_counter() - t)
                res.setdefault((f"step B={B}", threads), []).append(statistics.median(times))
    print(name, {f"{k} {t} thr": round(1000 * min(v), 1) for (k, t), v in res.items()})


if __name__ == "__main__":
    main()
