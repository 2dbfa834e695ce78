"""The prototype step on the tiny test models (tests/tiny_models.py: Llama-like with GQA, Gemma-3-like
with a sliding window of 8 so decode steps need masks): lean step vs HF forward, and batched vs alone
bitwise on every handoff's decode state."""
import torch
torch.set_num_threads(1)
from tests.conftest import tiny_pair
from research.speed_prototype import capture_states, copy_state, decode_together, teacher_forced_bits
from research.lean_step import LeanStepper, GrowingKV, check
from research.speed_prototype import Stepper
from kvviz.handoffs.registry import build_request
for kind in ("llama", "gemma"):
    pair = tiny_pair(kind)
    check(pair.receiver, steps=20)
    request = build_request("Mira keeps her red bicycle where? Answer briefly.", "Context: Mira keeps her red bicycle in the garden shed behind the old library in Lisbon.", max_new_tokens=20)
    rows = capture_states(pair, request, ["receiver", "text", "kvcomm", "skyline", "ac", "cipher", "sharer"])
    stepper = Stepper(pair.receiver, bucket=6)
    count, differ, largest = teacher_forced_bits(stepper, rows)
    together, _ = decode_together(stepper, [(copy_state(r[2]), r[3], r[5], r[6]) for r in rows])
    same = sum(t[: r[5]] == decode_together(stepper, [(copy_state(r[2]), r[3], r[5], r[6])])[0][0][: r[5]] for t, r in zip(together, rows))
    today = sum(t[: r[5]] == r[4] for t, r in zip(together, rows))
    print(f"tiny {kind}: {len(rows)} decodes {[r[0] for r in rows]}; steps {count}, not bitwise equal {differ} (max {largest:.1e}); "
          f"tokens batched == alone {same}/{len(rows)}, == today {today}/{len(rows)}; window {pair.receiver.facts.sliding_window}, "
          f"cache lengths {[r[2].next_position for r in rows]}")
