"""Which row counts M give a row the same bits with oneDNN packed fp32 linears (and MKL)?
Prints, per kernel, the classes of M in 1..16 whose rows agree bitwise with each other."""

import sys

import torch
import torch.nn.functional as F

from kvviz.runtime.models import load_model


def main():
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    for name in ("gemma3-270m", "smollm2-135m"):
        loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
        mats = [m.weight.detach() for l in loaded.model.model.layers[:2] for m in l.modules() if isinstance(m, torch.nn.Linear)]
        mk = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in mats]
        g = torch.Generator().manual_seed(1)
        for kname, fn in (("mkldnn", lambda x, i: torch.ops.mkldnn._linear_pointwise(x, mk[i], None, "none", [], "")),
                          ("MKL", lambda x, i: F.linear(x, mats[i]))):
            signature = {}
            for M in range(1, 17):
                sig = []
                for i, w in enumerate(mats):
                    row = torch.randn(w.shape[1], generator=torch.Generator().manual_seed(i))
                    x = torch.randn(M, w.shape[1], generator=g); x[M - 1] = row
                    sig.append(fn(x, i)[M - 1])
                signature[M] = sig
            classes = []
            for M in range(1, 17):
                for c in classes:
                    if all(torch.equal(a, b) for a, b in zip(signature[c[0]], signature[M])):
                        c.append(M); break
                else:
                    classes.append([M])
            print(name, kname, "threads", torch.get_num_threads(), "classes of M with equal bits:", classes)


if __name__ == "__main__":
    main()
