"""The lean step's cost without its matrix products (linears replaced by a preallocated output):
what the per-layer Python, norms, rotary, cache appends and per-sequence attention cost, by B."""
import statistics
import sys
import time

import torch

torch.set_num_threads(1)
import research.speed_prototype as sp
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import prefill
from kvviz.runtime.models import load_model
from kvviz.studies.speed import _prompt_ids

outputs = {}
def fake_linear(x, packed, bias=None):
    kind, w = packed
    n = w.shape[0] if kind == "mkl" else packed_rows[id(w)]
    key = (x.shape[:-1], n)
    if key not in outputs: outputs[key] = torch.zeros(*x.shape[:-1], n)
    return outputs[key]
packed_rows = {}
real_pack = sp.pack
def pack(weight, kind):
    p = real_pack(weight, kind); packed_rows[id(p[1])] = weight.shape[0]; return p
sp.pack = pack
for name in sys.argv[1].split(","):
    loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
    base = kv.KVState(); first, _ = prefill(loaded, base, _prompt_ids(loaded, 32)); token = first.greedy_token()
    st = sp.Stepper(loaded, kind="mkldnn", fuse=True, bucket=6)
    res = {}
    for real in (True, False):
        sp.apply_linear = real_apply if real is True and 'real_apply' in dir() else sp.apply_linear
    real_apply = sp.apply_linear
    for rnd in range(4):
        for mode in ("real", "no products"):
            sp.apply_linear = real_apply if mode == "real" else fake_linear
            for B in (1, 6):
                states = [sp.copy_state(base) for _ in range(B)]
                times = []
                for _ in range(6):
                    t = time.thread_time(); st.step(states, [token] * B); times.append(time.thread_time() - t)
                if rnd: res.setdefault((mode, B), []).append(statistics.median(times))
    print(name, {f"{m} B={B}": round(1000 * min(v), 1) for (m, B), v in res.items()})
