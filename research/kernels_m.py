"""ms per pass over all stack matrices, per kernel and row count M, one thread; interleaved rounds;
prints median and min over rounds. Also the fp32 stream time (sum of each weight)."""

import statistics
import sys
import time

import torch
import torch.nn.functional as F

from kvviz.runtime.models import load_model


def main():
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    name = sys.argv[1]
    import os

    CLOCK = time.thread_time if os.environ.get("CLOCK", "cpu") == "cpu" else time.perf_counter
    Ms = [int(m) for m in sys.argv[3].split(",")] if len(sys.argv) > 3 else [1, 2, 4, 6, 8]
    loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
    mats = [m.weight.detach() for l in loaded.model.model.layers for m in l.modules() if isinstance(m, torch.nn.Linear)]
    mk = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in mats]
    try:
        bfk = [torch.ops.mkldnn._reorder_linear_weight(w.bfloat16(), None) for w in mats]
    except RuntimeError as error:
        print("bf16 mkldnn unavailable:", str(error)[:90]); bfk = None
    q = []
    for w in mats:
        s = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
        q.append((torch.round(w / s[:, None]).to(torch.int8), s.bfloat16()))
    xs = {M: [torch.randn(M, w.shape[1]) for w in mats] for M in Ms}
    xb = {M: [x.bfloat16() for x in xs[M]] for M in Ms}
    kern = {
        "fp32 MKL": lambda M: [F.linear(x, w) for x, w in zip(xs[M], mats)],
        "fp32 mkldnn": lambda M: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for x, w in zip(xs[M], mk)],
        **({} if bfk is None else {"bf16 mkldnn": lambda M: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for x, w in zip(xb[M], bfk)]}),
        "int8 pack (bf16 x)": lambda M: [torch.ops.aten._weight_int8pack_mm(x, qw, s) for x, (qw, s) in zip(xb[M], q)],
    }
    def once(fn):
        s = CLOCK(); fn(); return 1000 * (CLOCK() - s)
    res = {(k, M): [] for k in kern for M in Ms}; stream = []
    for f in kern.values():
        for M in Ms: f(M)
    for rnd in range(7):
        stream.append(once(lambda: [w.sum() for w in mats]))
        for k, f in kern.items():
            for M in Ms:
                res[(k, M)].append(once(lambda: f(M)))
    print(f"{name} threads {torch.get_num_threads()} stream fp32 median {statistics.median(stream):.1f} min {min(stream):.1f} ms")
    print("| kernel | " + " | ".join(f"M={M}" for M in Ms) + " |")
    for k in kern:
        print(f"| {k} | " + " | ".join(f"{statistics.median(res[(k, M)]):.1f} ({min(res[(k, M)]):.1f})" for M in Ms) + " |")


if __name__ == "__main__":
    main()
