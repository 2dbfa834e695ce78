"""Which precision should kvviz use on this machine? Answers and speed per precision, side by side.

    python research/precision_check.py [--pair embedded] [--dtypes float32,bfloat16] [--threads 1]

For each precision (``--dtypes``) and each output-head path (the fast greedy head and the full
head, ``KVVIZ_FAST_HEAD``), in one process: every preset through every handoff of the page,
greedy, and the time of a decode step and of a prefill of each model. It prints

* how many preset answers equal the reference (float32 with the full head), handoff by handoff,
  and the answers that differ;
* decode ms per token and prefill ms per token of each model, and their ratio to float32.

A precision is worth being the default when it keeps the answers and is faster here. Accuracy on
whole datasets is measured with the benchmark (``python -m kvviz bench ... --dtype ...``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def decode_and_prefill_ms(loaded, steps: int = 12) -> tuple[float, float]:
    from kvviz.runtime import cache as kv
    from kvviz.runtime.decode import prefill
    from kvviz.studies.model_speed import prompt_ids

    prompt = prompt_ids(loaded, 64)
    state = kv.KVState()
    started = time.perf_counter()
    first, _ = prefill(loaded, state, prompt)
    prefill_ms = 1000 * (time.perf_counter() - started) / len(prompt)
    token, times = first.greedy_token(), []
    for _ in range(steps):
        started = time.perf_counter()
        step, _ = prefill(loaded, state, [token])
        token = step.greedy_token()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times), prefill_ms


def run_presets(pair, names):
    """Every preset through every handoff (kvviz's one evaluation loop), greedy: the answers."""
    from kvviz.app.presets import PRESETS
    from kvviz.core.results import GenerationSettings, HandoffRequest
    from kvviz.engine.evaluation import Variant, evaluate

    def request_for(preset, variant):
        return HandoffRequest(query=preset.query, context=preset.context, generation=GenerationSettings(max_new_tokens=32))

    variants = [Variant(name, name) for name in names]
    runs = evaluate(pair, enumerate(PRESETS), variants, request_for, record_id=lambda preset: preset.key)
    return {f"{item.record.key}/{item.variant.label}": item.result.answer if item.result.applicable else None for item in runs}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--handoffs", default="receiver,text,c2c,kvcomm,skyline")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)

    import torch

    from kvviz.engine.runner import load_pair
    from kvviz.runtime import models

    if args.threads:
        torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.handoffs.split(",") if n.strip()]
    rows = []
    for dtype in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
        for fast in ("0", "1"):
            os.environ["KVVIZ_FAST_HEAD"] = fast
            models.forget_loaded()  # a fresh load: the head path is chosen when a model loads
            pair = load_pair(args.pair, "cpu", dtype, progress=lambda message: print(message, file=sys.stderr))
            print(f"{dtype}, {'fast' if fast == '1' else 'full'} head ...", file=sys.stderr)
            speed = {}
            for loaded in {m.name: m for m in (pair.sharer, pair.receiver, pair.same_shape_sender)}.values():
                decode_and_prefill_ms(loaded, steps=2)  # warm-up
                speed[loaded.name] = decode_and_prefill_ms(loaded)
            rows.append({"dtype": dtype, "head": "fast" if fast == "1" else "full", "speed": speed,
                         "answers": run_presets(pair, names)})
    reference = next(r for r in rows if r["dtype"] == "float32" and r["head"] == "full") if any(
        r["dtype"] == "float32" and r["head"] == "full" for r in rows) else rows[0]
    print(f"\nReference: {reference['dtype']} with the {reference['head']} head; threads {torch.get_num_threads()}\n")
    print("| precision | head | preset answers equal to the reference | " + " | ".join(
        f"{model} decode ms (x ref) | {model} prefill ms/token (x ref)" for model in reference["speed"]) + " |")
    print("|---|---|---|" + "---|---|" * len(reference["speed"]))
    for row in rows:
        same = sum(row["answers"][key] == reference["answers"][key] for key in reference["answers"])
        cells = []
        for model, (decode, prefill) in row["speed"].items():
            ref_decode, ref_prefill = reference["speed"][model]
            cells.append(f"{decode:.1f} ({decode / ref_decode:.2f}x) | {prefill:.2f} ({prefill / ref_prefill:.2f}x)")
        print(f"| {row['dtype']} | {row['head']} | {same} / {len(reference['answers'])} | " + " | ".join(cells) + " |")
    for row in rows:
        for key, answer in row["answers"].items():
            if answer != reference["answers"][key]:
                print(f"  {row['dtype']}/{row['head']} {key}: {answer!r} (reference {reference['answers'][key]!r})")
    if args.out:
        Path(args.out).write_text(json.dumps({"reference": [reference["dtype"], reference["head"]], "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
