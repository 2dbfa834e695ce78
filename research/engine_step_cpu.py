"""The engine's decode step (kvviz.runtime.decode: the shared batch's step and head) by batch size, against
today's path (KVVIZ_BATCHED_DECODE=0: the model's own forward) and the stack's weight-stream time,
in thread CPU time (robust to other processes on the machine), one thread, interleaved rounds, min
of the per-round medians.    PYTHONPATH=. python research/engine_step_cpu.py [--rounds 5]"""

import argparse
import statistics
import time

import torch

from kvviz.runtime import cache as kv
from kvviz.runtime.batching import decode_batch
from kvviz.runtime.decode import prefill
from kvviz.runtime.models import load_model
from kvviz.studies.model_speed import DECODE_STEPS, PROMPT_TOKENS, prompt_ids


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in ("gemma3-270m", "smollm2-135m"):
        loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
        base = kv.KVState(); first, _ = prefill(loaded, base, prompt_ids(loaded, PROMPT_TOKENS)); token = first.greedy_token()
        batch = decode_batch(loaded)
        stack = list(loaded.model.model.layers.parameters())
        copy = lambda: kv.KVState(cache=kv.copy_cache(base.cache), next_position=base.next_position)  # noqa: E731
        res = {}
        for rnd in range(args.rounds + 1):
            t = time.thread_time(); [p.sum() for p in stack]; res.setdefault("stream", []).append(time.thread_time() - t)
            state = copy(); parts = []
            for _ in range(DECODE_STEPS):
                t = time.thread_time(); n, _ = prefill(loaded, state, [token]); m = time.thread_time(); n.greedy_token(); parts.append((m - t, time.thread_time() - m))
            res.setdefault("today stack", []).append(statistics.median(p[0] for p in parts)); res.setdefault("today head", []).append(statistics.median(p[1] for p in parts))
            for B in (1, 2, 4, 6):
                states = [copy() for _ in range(B)]; parts = []
                for _ in range(DECODE_STEPS):
                    t = time.thread_time(); h = batch.step_function(states, [token] * B); m = time.thread_time(); loaded.head.greedy_tokens(h); parts.append((m - t, time.thread_time() - m))
                res.setdefault(f"B={B} stack", []).append(statistics.median(p[0] for p in parts)); res.setdefault(f"B={B} head", []).append(statistics.median(p[1] for p in parts))
        m = {k: 1000 * min(v[1:]) for k, v in res.items()}
        print(f"{name}: stack stream {m['stream']:.1f} ms; today {m['today stack']:.1f} + {m['today head']:.1f} ms (stack {m['today stack'] / m['stream']:.2f}x stream); "
              + "; ".join(f"B={B} {m[f'B={B} stack']:.1f} + {m[f'B={B} head']:.1f}" for B in (1, 2, 4, 6))
              + f"; stack B=1 {m['B=1 stack'] / m['stream']:.2f}x stream; step 6/1 {(m['B=6 stack'] + m['B=6 head']) / (m['B=1 stack'] + m['B=1 head']):.2f}")


if __name__ == "__main__":
    main()
