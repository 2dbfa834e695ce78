"""Dynamic int8 quantisation (fbgemm: int8 weights and per-batch int8 activations) of the stack's
linears: ms per pass at M rows (thread CPU time, min of 7), beside fp32 oneDNN and the stream time."""

import time

import torch
import torch.nn.functional as F

from kvviz.runtime.models import load_model


def main():
    torch.set_num_threads(1)
    print(torch.backends.quantized.supported_engines, torch.backends.quantized.engine)
    for name in ("gemma3-270m", "smollm2-135m"):
        loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
        mats = [m for l in loaded.model.model.layers for m in l.modules() if isinstance(m, torch.nn.Linear)]
        packed = [torch.ops.quantized.linear_prepack(torch.quantize_per_channel(m.weight.detach(), (m.weight.abs().amax(1) / 127).double().clamp(min=1e-12), torch.zeros(m.weight.shape[0], dtype=torch.long), 0, torch.qint8), None) for m in mats]
        mk = [torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), None) for m in mats]
        def best(fn):
            fn(); r = []
            for _ in range(7):
                t = time.thread_time(); fn(); r.append(time.thread_time() - t)
            return round(1000 * min(r), 1)
        out = {"stream": best(lambda: [m.weight.sum() for m in mats])}
        for M in (1, 6):
            xs = [torch.randn(M, m.in_features) for m in mats]
            out[f"dynamic int8 M={M}"] = best(lambda: [torch.ops.quantized.linear_dynamic(x, p) for x, p in zip(xs, packed)])
            out[f"fp32 oneDNN M={M}"] = best(lambda: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for x, w in zip(xs, mk)])
            y = torch.ops.quantized.linear_dynamic(xs[0], packed[0]); ref = F.linear(xs[0], mats[0].weight)
            out[f"rel err M={M}"] = round(float((y - ref).norm() / ref.norm()), 4)
        print(name, out)


if __name__ == "__main__":
    main()
