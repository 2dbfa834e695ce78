"""int8 x int8 -> int32 products (torch._int_mm) with per-row activation scales: exact integer
accumulation, so a row's result cannot depend on the other rows. Speed (thread CPU time, min of 7)."""

import time

import torch
import torch.nn.functional as F

from kvviz.runtime.models import load_model


def main():
    torch.set_num_threads(1)
    for name in ("gemma3-270m", "smollm2-135m"):
        loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
        mats = [m.weight.detach() for l in loaded.model.model.layers for m in l.modules() if isinstance(m, torch.nn.Linear)]
        qs = []
        for w in mats:
            s = (w.abs().amax(1) / 127).clamp(min=1e-12)
            qs.append((torch.round(w / s[:, None]).to(torch.int8).t().contiguous(), s))  # [K, N]
        def lin(x, q, s):
            xs = (x.abs().amax(1, keepdim=True) / 127).clamp(min=1e-12)
            xi = torch.round(x / xs).to(torch.int8)
            return torch._int_mm(xi, q).float() * xs * s
        def best(fn):
            fn(); r = []
            for _ in range(7):
                t = time.thread_time(); fn(); r.append(time.thread_time() - t)
            return round(1000 * min(r), 1)
        out = {"stream fp32": best(lambda: [w.sum() for w in mats])}
        for M in (1, 2, 6, 8):
            xs = [torch.randn(M, w.shape[1]) for w in mats]
            try:
                out[f"int_mm M={M}"] = best(lambda: [lin(x, q, s) for x, (q, s) in zip(xs, qs)])
            except Exception as e:
                out[f"int_mm M={M}"] = str(e)[:60]
        x = torch.randn(6, mats[0].shape[1]); q, s = qs[0]
        full = lin(x, q, s); row = lin(x[2:3], q, s)
        out["row 2 alone == in batch"] = torch.equal(full[2], row[0])
        out["rel err"] = round(float((full - F.linear(x, mats[0])).norm() / F.linear(x, mats[0]).norm()), 4)
        print(name, out)


if __name__ == "__main__":
    main()
