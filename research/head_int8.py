"""An int8 copy of the output head for the approximate scan (per-row activation scales, torch._int_mm:
exact integer sums, so a row's scan does not depend on the other rows): ms by rows (thread CPU time,
min of 5), beside the int4 and bf16 scans; and how often the exact winner is in its top 256."""

import time

import torch

from kvviz.runtime.head import GROUP_SIZE
from kvviz.runtime.models import load_model


def main():
    torch.set_num_threads(1)
    for name in ("gemma3-270m", "smollm2-135m"):
        loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
        head = loaded.head; packed, sz = head.scan_index(); W = head.linear.weight.detach()
        s = (W.abs().amax(1) / 127).clamp(min=1e-12); q = torch.round(W / s[:, None]).to(torch.int8).t().contiguous()
        bf = torch.ops.mkldnn._reorder_linear_weight(W.bfloat16(), None)
        def int8_scan(x):
            xs = (x.abs().amax(1, keepdim=True) / 127).clamp(min=1e-12)
            return torch._int_mm(torch.round(x / xs).to(torch.int8), q).float() * xs * s
        def best(fn):
            fn(); r = []
            for _ in range(5):
                t = time.thread_time(); fn(); r.append(time.thread_time() - t)
            return round(1000 * min(r), 1)
        out = {}
        for M in (1, 4, 6, 8):
            x = torch.randn(M, W.shape[1])
            out[f"int8 M={M}"] = best(lambda: int8_scan(x))
            out[f"int4 M={M}"] = best(lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), packed, GROUP_SIZE, sz))
            out[f"bf16 M={M}"] = best(lambda: torch.ops.mkldnn._linear_pointwise(x.bfloat16(), bf, None, "none", [], ""))
        # winner rank on real-ish hidden states: final norm outputs of random prompts
        ranks = []
        from kvviz.runtime import cache as kv
        from kvviz.runtime.decode import prefill
        for seed in range(20):
            g = torch.Generator().manual_seed(seed)
            ids = torch.randint(100, 5000, (12,), generator=g).tolist()
            nt, _ = prefill(loaded, kv.KVState(), ids)
            h = nt.hidden
            exact = head.logits(h)[0]; winner = int(exact.argmax())
            approx = int8_scan(h)[0]
            ranks.append(int((approx > approx[winner]).sum()))
        out["int8 scan: winner rank max over 20 prompts"] = max(ranks)
        print(name, out)


if __name__ == "__main__":
    main()
