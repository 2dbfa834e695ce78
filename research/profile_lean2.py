import sys

import torch

torch.set_num_threads(1)
from torch.profiler import ProfilerActivity, profile

from kvviz.runtime import cache as kv
from kvviz.runtime.decode import prefill
from kvviz.runtime.models import load_model
from kvviz.studies.speed import _prompt_ids
from research.lean_step import GrowingKV, LeanStepper
from research.speed_prototype import copy_state

name, B = sys.argv[1], int(sys.argv[2])
loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
base = kv.KVState(); first, _ = prefill(loaded, base, _prompt_ids(loaded, 32)); token = first.greedy_token()
st = LeanStepper(loaded)
states = [copy_state(base) for _ in range(B)]; bufs = [GrowingKV(s.cache) for s in states]
for _ in range(3): st.step(states, [token] * B, bufs)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(10): st.step(states, [token] * B, bufs)
ka = prof.key_averages()
total = sum(e.self_cpu_time_total for e in ka)
lin = sum(e.self_cpu_time_total for e in ka if "linear_pointwise" in e.key)
print(f"{name} B={B}: per step total self CPU {total/10/1000:.1f} ms, linear {lin/10/1000:.1f} ms, other {(total-lin)/10/1000:.1f} ms, ops per step {sum(e.count for e in ka)/10:.0f}")
print(ka.table(sort_by="self_cpu_time_total", row_limit=14))
