"""Linear kernels for small-batch decode on this CPU, one thread, over a model's stack matrices.
Interleaved repeats, median ms per full pass over every stack matrix."""

import statistics
import sys
import time

import torch
import torch.nn.functional as F

from kvviz.runtime.models import load_model


def t(fn, n=5):
    fn(); out = []
    for _ in range(n):
        s = time.perf_counter(); fn(); out.append(time.perf_counter() - s)
    return 1000 * statistics.median(out)


def main():
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    name = sys.argv[1] if len(sys.argv) > 1 else "gemma3-270m"
    loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
    mats = [m.weight.detach() for l in loaded.model.model.layers for m in l.modules() if isinstance(m, torch.nn.Linear)]
    print(name, "MB fp32", sum(w.numel() for w in mats) * 4 / 1e6, "threads", torch.get_num_threads())
    Bs = (1, 2, 4, 6)
    xs = {B: [torch.randn(B, w.shape[1]) for w in mats] for B in Bs}
    variants = {}
    variants["fp32 F.linear (MKL)"] = {B: (lambda B=B: [F.linear(x, w) for x, w in zip(xs[B], mats)]) for B in Bs}
    wt = [w.t().contiguous() for w in mats]
    variants["fp32 mm(x, W^T contiguous)"] = {B: (lambda B=B: [torch.mm(x, w) for x, w in zip(xs[B], wt)]) for B in Bs}
    mk = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in mats]
    variants["fp32 mkldnn packed"] = {B: (lambda B=B: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for x, w in zip(xs[B], mk)]) for B in Bs}
    try:
        mklp = {B: [torch.ops.mkl._mkl_reorder_linear_weight(w, B) for w in mats] for B in Bs}
        variants["fp32 mkl packed (per B)"] = {B: (lambda B=B: [torch.ops.mkl._mkl_linear(x, p, w, None, B) for x, p, w in zip(xs[B], mklp[B], mats)]) for B in Bs}
    except Exception as e:
        print("mkl packed:", e)
    bf = [w.bfloat16() for w in mats]
    xb = {B: [x.bfloat16() for x in xs[B]] for B in Bs}
    variants["bf16 F.linear"] = {B: (lambda B=B: [F.linear(x, w) for x, w in zip(xb[B], bf)]) for B in Bs}
    bfk = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in bf]
    variants["bf16 mkldnn packed"] = {B: (lambda B=B: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for x, w in zip(xb[B], bfk)]) for B in Bs}
    q = []
    for w in mats:
        s = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
        q.append((torch.round(w / s[:, None]).to(torch.int8), s))
    variants["int8 w8 _weight_int8pack_mm fp32 x"] = {B: (lambda B=B: [torch.ops.aten._weight_int8pack_mm(x, qw, s) for x, (qw, s) in zip(xs[B], q)]) for B in Bs}
    qb = [(qw, s.bfloat16()) for qw, s in q]
    variants["int8 w8 _weight_int8pack_mm bf16 x"] = {B: (lambda B=B: [torch.ops.aten._weight_int8pack_mm(x, qw, s) for x, (qw, s) in zip(xb[B], qb)]) for B in Bs}
    results = {k: {B: [] for B in Bs} for k in variants}
    stream = []
    for rep in range(3):
        stream.append(t(lambda: [w.sum() for w in mats]))
        for k, fns in variants.items():
            for B in Bs:
                results[k][B].append(t(fns[B]))
    s = statistics.median(stream)
    print(f"stream fp32 weights once (sum): {s:.1f} ms")
    print("| variant | " + " | ".join(f"B={B} ms" for B in Bs) + " | B=6 / B=1 | B=1 / stream |")
    for k, r in results.items():
        m = {B: statistics.median(v) for B, v in r.items()}
        print(f"| {k} | " + " | ".join(f"{m[B]:.1f}" for B in Bs) + f" | {m[6]/m[1]:.2f} | {m[1]/s:.2f} |")
    # exactness vs fp32
    x = xs[6][0]; w = mats[0]
    ref = F.linear(x, w)
    print("max abs diff mm(W^T)", (torch.mm(x, wt[0]) - ref).abs().max().item(), "mkldnn", (torch.ops.mkldnn._linear_pointwise(x, mk[0], None, "none", [], "") - ref).abs().max().item())
    print("row-wise equality B=6 vs B=1 (F.linear):", torch.equal(F.linear(x, w)[2:3], F.linear(x[2:3], w)))
    print("row-wise equality B=6 vs B=1 (mkldnn):", torch.equal(torch.ops.mkldnn._linear_pointwise(x, mk[0], None, "none", [], "")[2:3], torch.ops.mkldnn._linear_pointwise(x[2:3], mk[0], None, "none", [], "")))


if __name__ == "__main__":
    main()
