"""Matrix-vector products of the decoder stacks' weights, one thread: how close to streaming?"""

import statistics
import time

import torch
import torch.nn.functional as F

from kvviz.runtime.models import load_model


def t(fn, n=7):
    fn(); out = []
    for _ in range(n):
        s = time.perf_counter(); fn(); out.append(time.perf_counter() - s)
    return 1000 * statistics.median(out)


def main():
    torch.set_num_threads(1)
    for name in ("gemma3-270m", "smollm2-135m"):
        loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
        mats = [m.weight for l in loaded.model.model.layers for m in l.modules() if isinstance(m, torch.nn.Linear)]
        shapes = sorted({tuple(w.shape) for w in mats})
        print(name, len(mats), "matrices", shapes, "MB", sum(w.numel() for w in mats) * 4 / 1e6)
        xs = {B: [torch.randn(B, w.shape[1]) for w in mats] for B in (1, 2, 4, 6, 8)}
        rows = {}
        for rep in range(3):  # interleaved
            rows.setdefault("sum", []).append(t(lambda: [w.sum() for w in mats]))
            for B in (1, 2, 4, 6, 8):
                rows.setdefault(f"linear B={B}", []).append(t(lambda: [F.linear(x, w) for x, w in zip(xs[B], mats)]))
            rows.setdefault("mv", []).append(t(lambda: [torch.mv(w, x[0]) for x, w in zip(xs[1], mats)]))
        for k, v in rows.items():
            print(f"  {k:14s} {statistics.median(v):7.1f} ms")


if __name__ == "__main__":
    main()
