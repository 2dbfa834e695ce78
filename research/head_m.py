"""The output head's approximate scan for M rows at once, per kernel (thread CPU ms), one thread."""

import statistics
import sys
import time

import torch
import torch.nn.functional as F

from kvviz.runtime.head import GROUP_SIZE
from kvviz.runtime.models import load_model


def main():
    torch.set_num_threads(1)
    loaded = load_model(sys.argv[1] if len(sys.argv) > 1 else "gemma3-270m", "cpu", "float32", progress=lambda *a: None)
    head = loaded.head
    packed, sz = head.scan_index()
    W = head.linear.weight.detach()
    Wbf = torch.ops.mkldnn._reorder_linear_weight(W.bfloat16(), None)
    s = (W.abs().amax(dim=1) / 127).clamp(min=1e-12); q8 = torch.round(W / s[:, None]).to(torch.int8); s = s.bfloat16()
    Ms = (1, 2, 4, 6, 8)
    xs = {M: torch.randn(M, W.shape[1]) for M in Ms}
    k = {
        "int4 scan (today)": lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), packed, GROUP_SIZE, sz),
        "bf16 mkldnn": lambda x: torch.ops.mkldnn._linear_pointwise(x.bfloat16(), Wbf, None, "none", [], ""),
        "int8 pack": lambda x: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), q8, s),
        "fp32 exact MKL": lambda x: F.linear(x, W),
        "greedy_token per row (today)": lambda x: [head.greedy_token(x[i:i+1]) for i in range(x.shape[0])],
    }
    res = {(n, M): [] for n in k for M in Ms}
    for f in k.values():
        for M in Ms: f(xs[M])
    for r in range(5):
        for n, f in k.items():
            for M in Ms:
                t = time.thread_time(); f(xs[M]); res[(n, M)].append(1000 * (time.thread_time() - t))
    print("| head kernel | " + " | ".join(f"M={M}" for M in Ms) + " |")
    for n in k:
        print(f"| {n} | " + " | ".join(f"{statistics.median(res[(n, M)]):.1f}" for M in Ms) + " |")


if __name__ == "__main__":
    main()
