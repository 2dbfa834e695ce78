"""kvviz/runtime/step.py's DecodeStep on real decode states of every handoff: batched vs alone bitwise
(teacher-forced), and its greedy tokens vs today's generate(); tiny test models and (with --embedded)
the embedded pair on the presets."""
import sys

import torch

torch.set_num_threads(1)
from kvviz.handoffs.registry import build_request
from kvviz.runtime.step import DecodeStep
from research.speed_prototype import capture_states, copy_state, decode_together, teacher_forced_bits


class WithHead:
    """DecodeStep plus the per-row exact greedy head (the prototype loop's interface)."""

    def __init__(self, loaded):
        self.loaded, self.step_ = loaded, DecodeStep(loaded)
        assert self.step_.supported, self.step_.reason

    def step(self, states, tokens):
        return self.step_.step(states, tokens)

    def greedy_tokens(self, hidden):
        return [self.loaded.head.greedy_token(hidden[b : b + 1]) for b in range(hidden.shape[0])]


def check(pair, requests, names):
    total = {"decodes": 0, "steps": 0, "bit_differences": 0, "tokens_differ_alone": 0, "tokens_differ_today": 0}
    steppers = {}
    for request in requests:
        rows = capture_states(pair, request, names)
        by_model = {}
        for row in rows:
            by_model.setdefault(row[1].name, []).append(row)
        for group in by_model.values():
            loaded = group[0][1]
            stepper = steppers.setdefault(loaded.name, WithHead(loaded))
            count, differ, _ = teacher_forced_bits(stepper, group)
            together, _ = decode_together(stepper, [(copy_state(r[2]), r[3], r[5], r[6]) for r in group])
            for tokens, row in zip(together, group):
                alone, _ = decode_together(stepper, [(copy_state(row[2]), row[3], row[5], row[6])])
                total["tokens_differ_alone"] += tokens[: row[5]] != alone[0][: row[5]]
                total["tokens_differ_today"] += tokens[: row[5]] != row[4]
                if tokens[: row[5]] != row[4]:
                    print("  differs from today:", row[0], tokens[: row[5]][:16], row[4][:16])
            total["decodes"] += len(group); total["steps"] += count; total["bit_differences"] += differ
    return total


if __name__ == "__main__":
    from tests.conftest import tiny_pair
    names = ["receiver", "text", "c2c", "c2c_control", "kvcomm", "skyline", "ac", "cipher", "sharer"]
    if "--embedded" in sys.argv:
        from kvviz.app.presets import PRESETS
        from kvviz.engine.runner import load_pair
        pair = load_pair("embedded", "cpu", "float32", progress=lambda *a: None)
        print("embedded presets:", check(pair, [build_request(p.query, p.context, max_new_tokens=32) for p in PRESETS], names))
    else:
        for kind in ("llama", "gemma"):
            requests = [build_request("Mira keeps her red bicycle where? Answer briefly.",
                                      "Context: Mira keeps her red bicycle in the garden shed behind the old library in Lisbon.", max_new_tokens=24),
                        build_request("What is the secret code word?", "The secret code word is pineapple. " * 3, max_new_tokens=24)]
            print(f"tiny {kind}:", check(tiny_pair(kind), requests, names))
