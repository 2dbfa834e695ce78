"""Batch invariance of the embedded pair in one numeric mode, in a process of its own (as a server runs
one mode): ``KVVIZ_NUMERICS=MODE python -m tests.real_model.invariance_in_mode`` prints a JSON report.

Run by ``tests/real_model/test_numerics.py``. In a process of its own because a server runs one mode, and
because some handoffs keep per-model caches by model name (KVComm's calibration, KV steering's vectors):
two modes in one process would share them.

* ``handoffs``: every handoff of the registry on every preset, alone, then all of a preset's handoffs at
  once (each model's decode steps shared): the answer's tokens of each, and the largest batch seen;
* ``slots``: for each model, the presets' prompts read into states, then twelve decode steps of every
  state alone and of all of them at once in reversed slots: whether every hidden state is bit for bit
  the same.
"""

from __future__ import annotations

import json
import sys

import torch


def main() -> int:
    torch.set_num_threads(1)
    from kvviz.app.presets import PRESETS
    from kvviz.core.prompts import build_segments
    from kvviz.engine.runner import load_pair, run_handoff
    from kvviz.handoffs import registry
    from kvviz.runtime import cache as kv
    from kvviz.runtime.batching import decode_path
    from kvviz.runtime.decode import prefill
    from kvviz.runtime.step import DecodeStep
    from tests.unit.test_batching import copied, run_together

    pair = load_pair("embedded", "cpu", progress=lambda *a: None)
    report = {"numerics": {m.name: m.numerics for m in (pair.sharer, pair.receiver)},
              "decode_path": {m.name: decode_path(m) for m in (pair.sharer, pair.receiver)}, "handoffs": [], "slots": {}}
    names = [handoff.name for handoff in registry.all_handoffs()]
    for preset in PRESETS:
        request = registry.build_request(preset.query, preset.context, 16)
        alone = {name: run_handoff(name, pair, request) for name in names}
        together = run_together(pair, request, names)
        for name in names:
            largest = max([0] + [b["max_size"] for b in together[name].details.get("decode_batches", []) if b["batched"]])
            report["handoffs"].append({"preset": preset.key, "handoff": name, "applicable": alone[name].applicable,
                                       "alone": alone[name].answer_ids, "together": together[name].answer_ids,
                                       "largest_batch": largest})
    for loaded in (pair.sharer, pair.receiver):
        step = DecodeStep(loaded)
        states = []
        for preset in PRESETS:
            state = kv.KVState()
            prefill(loaded, state, build_segments(loaded.tokenizer, preset.query, preset.context).input_ids, need_logits=False)
            states.append(state)
        alone, together = [copied(s) for s in states], [copied(s) for s in reversed(states)]
        equal, steps = True, 0
        for round_ in range(12):
            tokens = [100 + 7 * round_ + b for b in range(len(states))]
            batched = step.step(together, tokens[::-1])
            for b, state in enumerate(alone):
                equal &= torch.equal(batched[len(states) - 1 - b], step.step([state], [tokens[b]])[0])
                steps += 1
        report["slots"][loaded.name] = {"equal": bool(equal), "steps": steps, "products": step.products}
    json.dump(report, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
