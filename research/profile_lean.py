import sys

import torch

torch.set_num_threads(1)
from torch.profiler import ProfilerActivity, profile

from kvviz.runtime import cache as kv
from kvviz.runtime.decode import prefill
from kvviz.runtime.models import load_model
from kvviz.studies.speed import _prompt_ids
from research.speed_prototype import Stepper, copy_state

name, B = sys.argv[1], int(sys.argv[2])
loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
base = kv.KVState(); first, _ = prefill(loaded, base, _prompt_ids(loaded, 32)); token = first.greedy_token()
st = Stepper(loaded, kind="mkldnn", fuse=True, bucket=6)
states = [copy_state(base) for _ in range(B)]
for _ in range(3): st.step(states, [token] * B)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(5): st.step(states, [token] * B)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22))
