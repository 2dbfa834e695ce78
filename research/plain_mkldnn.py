"""Can oneDNN run on the model's own fp32 weights (no packed copy)? ms per stack pass (thread time, min of 7)."""

import time

import torch
import torch.nn.functional as F

from kvviz.runtime.models import load_model


def main():
    torch.set_num_threads(1)
    loaded = load_model("gemma3-270m", "cpu", "float32", progress=lambda *a: None)
    mats = [m.weight.detach() for l in loaded.model.model.layers for m in l.modules() if isinstance(m, torch.nn.Linear)]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in mats]
    def best(fn):
        fn(); r = []
        for _ in range(7):
            t = time.thread_time(); fn(); r.append(time.thread_time() - t)
        return round(1000 * min(r), 1)
    for M in (1, 6):
        xs = [torch.randn(M, w.shape[1]) for w in mats]
        out = {}
        try:
            out["plain weight"] = best(lambda: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for x, w in zip(xs, mats)])
            eq = torch.equal(torch.ops.mkldnn._linear_pointwise(xs[0], mats[0], None, "none", [], ""), torch.ops.mkldnn._linear_pointwise(xs[0], packed[0], None, "none", [], ""))
            out["plain == packed bits"] = eq
        except Exception as e:
            out["plain weight"] = f"error {e}"[:80]
        out["packed"] = best(lambda: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for x, w in zip(xs, packed)])
        out["MKL F.linear"] = best(lambda: [F.linear(x, w) for x, w in zip(xs, mats)])
        out["stream"] = best(lambda: [w.sum() for w in mats])
        print("M", M, out)
    print("packed bytes == plain bytes?", packed[0].numel() * packed[0].element_size(), mats[0].numel() * 4, packed[0].layout, packed[0].is_mkldnn)


if __name__ == "__main__":
    main()
