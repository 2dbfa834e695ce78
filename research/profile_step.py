"""Profile one decode step of each embedded model (phase A research, one thread)."""

import statistics
import sys
import time

import torch

from kvviz.runtime import cache as kv
from kvviz.runtime.decode import prefill
from kvviz.runtime.models import load_model
from kvviz.studies.model_speed import prompt_ids


def main():
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    for name in ("gemma3-270m", "smollm2-135m"):
        loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
        prompt = prompt_ids(loaded, 32)
        state = kv.KVState()
        first, _ = prefill(loaded, state, prompt)
        token = first.greedy_token()
        for _ in range(5):
            prefill(loaded, state, [token])
        stack = [p for n, p in loaded.model.named_parameters() if ".layers." in n]
        stream = lambda: [p.sum() for p in stack]
        steps, streams = [], []
        for _ in range(15):
            t = time.perf_counter(); prefill(loaded, state, [token]); steps.append(time.perf_counter() - t)
            t = time.perf_counter(); stream(); streams.append(time.perf_counter() - t)
        print(name, "stack bytes MB", sum(p.numel()*4 for p in stack)/1e6, "stack ms", 1000*statistics.median(steps),
              "stream stack ms", 1000*statistics.median(streams))
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                prefill(loaded, state, [token])
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
