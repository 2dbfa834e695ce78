"""How much can a private-context C2C channel carry at best? An oracle without training.

The receiver reads the question alone; the sharer (here: the same model, so no translation is
needed) reads context and question. The oracle replaces the receiver's KV at the fused tokens
(the question, optionally the template tail) by the sharer's KV at the aligned tokens, keys moved
to the receiver's positions (RoPE undone at the sharer's positions, applied at the receiver's),
in every layer or only in some. Then the receiver answers. If even this perfect "fuser" cannot
make the receiver answer, no trained fuser on this channel can: the limit is the method (what the
fused tokens hold), not the fuser's training. It is the control that isolates the cause of a
zero communication gain: the fuser, or the channel.

Modes (``--modes``): ``receiver`` (question only), ``oracle`` (the sharer's KV copied in),
``zero`` (zeros copied in: the oracle's own control), ``skyline`` (the receiver reads the context).
Reports, per mode, held-out recall answers containing the gold answer (greedy) and the answer's
NLL per token (teacher-forced). docs/C2C.md quotes:

    python research/c2c_oracle.py --model gemma3-270m --n 40 --out runs/oracle_gemma_all.json
    (options: --values-only, --layers 9-17, --no-template, --modes receiver,oracle)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvviz.core.results import GenerationSettings  # noqa: E402
from kvviz.data import contains_answer, recall  # noqa: E402
from kvviz.handoffs.c2c.align import align_prompt  # noqa: E402
from kvviz.handoffs.c2c.fusion import receiver_prefix, sharer_kv  # noqa: E402
from kvviz.runtime import cache as kv  # noqa: E402
from kvviz.runtime.decode import generate, prefill  # noqa: E402
from kvviz.runtime.rope import RopeTables, apply_rotation, undo_rotation  # noqa: E402

# receiver: the receiver alone (question only); oracle: the sharer's KV copied in at the fused
# tokens; zero: zeros copied in (the oracle's own control); skyline: the receiver reads the context
MODES = ("receiver", "oracle", "zero", "skyline")


def parse_layers(text: str, count: int) -> list[int]:
    if not text:
        return list(range(count))
    start, _, end = text.partition("-")
    return list(range(int(start), int(end or start) + 1))


def answer_nll(pair, state, last_ids, answer: str) -> tuple[float, int]:
    """Summed NLL of the bare answer (" shed") after the prompt, teacher-forced."""
    from kvviz.studies.c2c.examples import response_ids

    targets = response_ids(pair.receiver.tokenizer, answer, 16)
    tokens = last_ids + targets[:-1]
    hidden = pair.receiver.model.model(
        input_ids=torch.tensor([tokens]), cache=kv.copy_cache(state.cache),
        position_ids=state.positions(len(tokens), pair.receiver.device), use_cache=True,
    ).last_hidden_state[0]
    logits = pair.receiver.head.logits(hidden)
    return float(torch.nn.functional.cross_entropy(logits, torch.tensor(targets), reduction="sum")), len(targets)


@torch.no_grad()
def oracle_answer(pair, record, layers, values_only, fuse_template, mode, max_new_tokens=24):
    if mode == "skyline":  # the receiver reads context and question itself
        from kvviz.core.prompts import build_segments

        ids = build_segments(pair.receiver.tokenizer, record.question, record.context).input_ids
        state = kv.KVState()
        prefill(pair.receiver, state, ids[:-1], need_logits=False)
        nll = answer_nll(pair, state, ids[-1:], record.answers[0])
        next_token, _ = prefill(pair.receiver, state, ids[-1:])
        return generate(pair.receiver, state, next_token, GenerationSettings(max_new_tokens=max_new_tokens)).text, nll
    alignment = align_prompt(
        pair.receiver.tokenizer, pair.sharer.tokenizer, record.question, record.context, receiver_sees_context=False,
        token_alignment="natural", fuse_template=fuse_template,
    )
    state = receiver_prefix(pair, alignment)
    if mode != "receiver":
        shared = sharer_kv(pair, alignment)
        rope = RopeTables(pair.receiver, pair.sharer, alignment.receiver_positions, shared.rope_positions)
        r_index = torch.tensor(alignment.receiver_positions)
        s_index = torch.tensor(shared.positions)
        fused = []
        for layer in range(kv.num_layers(state.cache)):
            keys, values = kv.layer_kv(state.cache, layer)
            if layer in layers:
                s_keys, s_values = shared.layers[layer]
                s_keys, s_values = s_keys.index_select(2, s_index), s_values.index_select(2, s_index)
                if mode == "zero":
                    s_keys, s_values = torch.zeros_like(s_keys), torch.zeros_like(s_values)
                if not values_only:
                    moved = apply_rotation(undo_rotation(s_keys.float(), *rope.sharer(layer)), *rope.receiver(layer))
                    keys = keys.index_copy(2, r_index, moved.to(keys.dtype))
                values = values.index_copy(2, r_index, s_values.to(values.dtype))
            fused.append((keys, values))
        state = kv.KVState(cache=kv.from_tensors(fused), next_position=state.next_position)
    nll = answer_nll(pair, state, alignment.receiver_ids[-1:], record.answers[0])
    next_token, _ = prefill(pair.receiver, state, alignment.receiver_ids[-1:])
    return generate(pair.receiver, state, next_token, GenerationSettings(max_new_tokens=max_new_tokens)).text, nll


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m", help="sharer and receiver (the same model)")
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--layers", default="", help="receiver layers to replace, e.g. 9-17 (default: all)")
    parser.add_argument("--values-only", action="store_true")
    parser.add_argument("--no-template", action="store_true", help="fuse the question only")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--modes", default="receiver,oracle,zero,skyline", help="any of: " + ", ".join(MODES))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from kvviz.engine.runner import load_pair

    pair = load_pair(f"{args.model}+{args.model}", "cpu", None, progress=lambda *a: None)
    layers = parse_layers(args.layers, pair.receiver.facts.num_layers)
    records = recall.generate("heldout", args.n, seed=7)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    rows = {mode: 0 for mode in modes}
    nlls = {mode: [0.0, 0] for mode in rows}
    examples = []
    for record in records:
        answers = {}
        for mode in rows:
            answers[mode], (nll, count) = oracle_answer(pair, record, layers, args.values_only, not args.no_template, mode)
            rows[mode] += contains_answer(answers[mode], record.answers)
            nlls[mode][0] += nll
            nlls[mode][1] += count
        if len(examples) < 8:
            examples.append({"question": record.question, "gold": record.answers[0], **answers})
    report = {
        "model": args.model, "n": len(records), "layers": layers, "values_only": args.values_only,
        "fuse_template": not args.no_template,
        "accuracy": {mode: count / len(records) for mode, count in rows.items()},
        "answer_nll": {mode: total / max(count, 1) for mode, (total, count) in nlls.items()},
        "examples": examples,
    }
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
