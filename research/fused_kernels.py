"""Kernel time of one decode step's matrix products, fused (QKV, gate-up) vs separate, M rows, one
thread, thread CPU time; beside streaming the same fp32 weights once."""
import statistics
import sys
import time

import torch

torch.set_num_threads(1)
from kvviz.runtime.models import load_model
from research.speed_prototype import LayerWeights, apply_linear

for name in sys.argv[1].split(","):
    loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
    layers = loaded.model.model.layers
    H = loaded.facts.hidden_size
    res = {}
    for fuse in (False, True):
        lw = [LayerWeights(l, "mkldnn", fuse) for l in layers]
        for M in (1, 6):
            x = torch.randn(M, H); xo = torch.randn(M, layers[0].self_attn.o_proj.in_features); xd = torch.randn(M, layers[0].mlp.down_proj.in_features)
            def run():
                for w in lw:
                    w.qkv_of(x); apply_linear(xo, w.o); w.gate_up_of(x); apply_linear(xd, w.down)
            run()
            ts = []
            for _ in range(9):
                t = time.thread_time(); run(); ts.append(time.thread_time() - t)
            res[f"{'fused' if fuse else 'separate'} M={M}"] = round(1000 * min(ts), 1)
    stack = list(layers.parameters())
    ts = []
    for _ in range(9):
        t = time.thread_time(); [p.sum() for p in stack]; ts.append(time.thread_time() - t)
    print(name, "stream", round(1000 * min(ts), 1), res)
