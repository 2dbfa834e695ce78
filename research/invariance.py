"""Is a row's result of a linear kernel independent of the batch it sits in (bitwise)?
For each kernel and stack matrix: row r of an M-row product vs the same row alone (M=1), vs the same
row padded into a fixed 8-row block at another position with other rows' content changed."""

import sys

import torch
import torch.nn.functional as F

from kvviz.runtime.models import load_model


def main():
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    name = sys.argv[1] if len(sys.argv) > 1 else "gemma3-270m"
    loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
    mats = [m.weight.detach() for l in loaded.model.model.layers[:3] for m in l.modules() if isinstance(m, torch.nn.Linear)]
    g = torch.Generator().manual_seed(0)
    mk = {id(w): torch.ops.mkldnn._reorder_linear_weight(w, None) for w in mats}
    wt = {id(w): w.t().contiguous() for w in mats}
    kernels = {
        "MKL F.linear": lambda x, w: F.linear(x, w),
        "mm(x, W^T)": lambda x, w: torch.mm(x, wt[id(w)]),
        "mkldnn packed": lambda x, w: torch.ops.mkldnn._linear_pointwise(x, mk[id(w)], None, "none", [], ""),
    }
    for kname, k in kernels.items():
        m_dep = pos_dep = other_dep = 0; total = 0
        for w in mats:
            for M in range(1, 9):
                x = torch.randn(M, w.shape[1], generator=g)
                full = k(x, w)
                for r in range(M):
                    alone = k(x[r:r + 1], w)
                    m_dep += not torch.equal(full[r], alone[0])
                    total += 1
                # fixed block of 8: same row at two positions, other rows different
                block = torch.randn(8, w.shape[1], generator=g); row = x[0]
                b1 = block.clone(); b1[0] = row
                b2 = torch.randn(8, w.shape[1], generator=g); b2[5] = row
                pos_dep += not torch.equal(k(b1, w)[0], k(b2, w)[5])
                b3 = torch.zeros(8, w.shape[1]); b3[0] = row
                other_dep += not torch.equal(k(b1, w)[0], k(b3, w)[0])
        print(f"{kname:16s}: row != alone in {m_dep}/{total}; fixed 8-block position-dependent {pos_dep}/{len(mats)*8}; other-rows-dependent {other_dep}/{len(mats)*8}")


if __name__ == "__main__":
    main()
