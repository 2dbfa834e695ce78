"""Compare prompt layouts for a base receiver (no chat template) on a context dataset.

For each layout, the receiver answers every sample twice, alone (question only) and as Skyline
(context and question in one prompt), greedy, with the decode loop every handoff uses; scored by
the KVComm paper's metric (token F1 > 0.5). Used to choose ``kvviz/core/prompts.py``'s base layout.

    python research/prompt_layouts.py --dataset countries --limit 100 --threads 1

Samples: the ones ``python -m kvviz bench --limit N --seed S`` runs (seeded shuffle), or with
``--held-out`` the dataset's other samples (to choose a layout away from the benchmark's items).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (context part, query part) per layout; {C} context, {Q} question. The context part is empty for
# the receiver alone. The query part ends where the model starts its answer.
LAYOUTS = {
    "instructed": ("Context: {C}\n\n", "Question: {Q}\nAnswer briefly.\nAnswer:"),
    "plain": ("Context: {C}\n", "Question: {Q}\nAnswer:"),
    "plain-blank": ("Context: {C}\n\n", "Question: {Q}\nAnswer:"),
    "bare": ("{C}\n", "Question: {Q}\nAnswer:"),
    "qa": ("{C}\n", "Q: {Q}\nA:"),
    "short-answer": ("Context: {C}\n", "Question: {Q}\nShort answer:"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="countries")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--seed", type=int, default=0, help="the bench's sample shuffle")
    parser.add_argument("--held-out", action="store_true", help="the samples the bench with --limit leaves out")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--show", type=int, default=0, help="print this many answers per layout")
    args = parser.parse_args()

    import torch

    from kvviz.core.prompts import encode
    from kvviz.core.results import GenerationSettings
    from kvviz.data import f1_match, load_dataset
    from kvviz.runtime.cache import KVState
    from kvviz.runtime.decode import generate, prefill
    from kvviz.runtime.models import load_model

    torch.set_num_threads(args.threads)
    model = load_model(args.model, device="cpu")
    records = load_dataset(args.dataset, limit=args.limit, seed=args.seed)
    if args.held_out:
        benched = {record.id for record in records}
        records = [record for record in load_dataset(args.dataset) if record.id not in benched][: args.limit]
    settings = GenerationSettings(max_new_tokens=32)
    bos = model.tokenizer.bos_token or ""

    def answer(text: str) -> str:
        state = KVState()
        logits, _ = prefill(model, state, encode(model.tokenizer, text))
        return generate(model, state, logits, settings).text

    which = "held-out" if args.held_out else f"bench (seed {args.seed})"
    print(f"{args.dataset}, {len(records)} {which} samples, {args.model}, greedy; accuracy = token F1 > 0.5")
    for name in args.layouts.split(","):
        context_part, query_part = LAYOUTS[name]
        started = time.perf_counter()
        scores = {"receiver": 0, "skyline": 0}
        for index, record in enumerate(records):
            query = query_part.format(Q=record.question.strip())
            alone = answer(bos + query)
            skyline = answer(bos + context_part.format(C=record.context.strip()) + query)
            scores["receiver"] += f1_match(alone, record.answers)
            scores["skyline"] += f1_match(skyline, record.answers)
            if index < args.show:
                print(f"  [{name}] gold {record.answers[0]!r}: alone {alone!r} | skyline {skyline!r}")
        n = len(records)
        print(
            f"{name:<14} receiver {scores['receiver'] / n:.2f}  skyline {scores['skyline'] / n:.2f}  "
            f"({time.perf_counter() - started:.0f} s)   layout {context_part + query_part!r}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
