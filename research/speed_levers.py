"""The levers for CPU decoding speed, measured side by side (a benchmark, not a test).

    python research/speed_levers.py [--pair embedded] [--repeats 3] [--skip-runs]

1. **The output head** of each model: the product hidden x vocabulary at each precision the CPU
   offers (float32, bfloat16, float16, int8 and int4 weight-only), and kvviz's greedy head (a
   4-bit scan plus exact rescoring, ``kvviz.runtime.head``), on one thread.
2. **The decoder stack's matrix-vector products** of each model, once per weight matrix as a decode
   step does them, at each precision, on one thread (the stack's other work is not included).
3. **Threads and side by side**: the page's default handoffs on the locker preset, warm, each
   configuration in a fresh process: one torch thread one handoff at a time; two threads one at a
   time; two threads with ``OMP_WAIT_POLICY=PASSIVE``; one thread per handoff, two side by side.

Every row is the best (1, 2) or median (3) of ``--repeats`` runs, wall clock. Compare within a
table: absolute values move with whatever else the machine runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def best_ms(function, repeats: int) -> float:
    function()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return 1000 * best


def precisions(weight):
    """(name, function of a [1, in] float32 input) per precision, for one weight matrix."""
    import torch
    import torch.nn.functional as F

    from kvviz.runtime.head import GROUP_SIZE, quantize_int4

    weight = weight.detach().float()
    half, brain = weight.half(), weight.bfloat16()
    scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)
    int8 = torch.round(weight / scales[:, None]).to(torch.int8)
    scales_bf16 = scales.bfloat16()
    rows = {
        "float32": lambda x: F.linear(x, weight),
        "bfloat16": lambda x: F.linear(x.bfloat16(), brain),
        "float16": lambda x: F.linear(x.half(), half),
        "int8 weights": lambda x: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), int8, scales_bf16),
    }
    if weight.shape[1] % GROUP_SIZE == 0:
        packed, scales_and_zeros = quantize_int4(weight)
        rows["int4 weights"] = lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.bfloat16(), packed, GROUP_SIZE, scales_and_zeros
        )
    return rows


def head_table(pair, repeats: int) -> dict:
    import torch

    table = {}
    for loaded in {m.name: m for m in (pair.sharer, pair.receiver)}.values():
        weight = loaded.model.get_output_embeddings().weight
        hidden = torch.randn(1, weight.shape[1])
        row = {name: best_ms(lambda f=f: f(hidden), repeats) for name, f in precisions(weight).items()}
        loaded.head.scan_index()
        row["kvviz greedy head"] = best_ms(lambda: loaded.head.greedy_token(hidden), repeats)
        table[f"{loaded.name} head {tuple(weight.shape)}"] = row
    return table


def stack_table(pair, repeats: int) -> dict:
    import torch

    table = {}
    for loaded in {m.name: m for m in (pair.sharer, pair.receiver)}.values():
        layers = loaded.model.model.layers
        matrices = [m.weight for layer in layers for m in layer.modules() if isinstance(m, torch.nn.Linear)]
        per_matrix = [precisions(w) for w in matrices]
        inputs = [torch.randn(1, w.shape[1]) for w in matrices]
        row = {}
        for name in per_matrix[0]:
            if all(name in rows for rows in per_matrix):
                row[name] = best_ms(lambda n=name: [rows[n](x) for rows, x in zip(per_matrix, inputs)], repeats)
        table[f"{loaded.name} stack ({len(matrices)} matrices)"] = row
    return table


FULL_RUN_CHILD = """
import json, sys, time, torch
sys.path.insert(0, {root!r})
threads, workers, repeats = {threads}, {workers}, {repeats}
torch.set_num_threads(threads)
from kvviz.engine.runner import load_pair
from kvviz.engine.stream import run
from kvviz.studies.run_speed import FULL_RUN_QUERY, FULL_RUN_CONTEXT, FULL_RUN_TOKENS
from kvviz.handoffs.registry import default_handoffs
from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine import runner
pair = load_pair({pair!r}, progress=lambda *a: None)
runner.load_pair = lambda name, progress=None: pair
request = HandoffRequest(query=FULL_RUN_QUERY, context=FULL_RUN_CONTEXT, generation=GenerationSettings(max_new_tokens=FULL_RUN_TOKENS))
walls = []
for repeat in range(repeats + 1):
    started = time.perf_counter()
    list(run({pair!r}, request, default_handoffs(), workers))
    if repeat:
        walls.append(time.perf_counter() - started)
print(json.dumps(walls))
"""


def full_runs(pair_name: str, repeats: int) -> dict:
    configurations = {
        "1 thread, one handoff at a time": (1, 1, {}),
        "2 threads, one handoff at a time": (2, 1, {}),
        "2 threads (OMP_WAIT_POLICY=PASSIVE), one at a time": (2, 1, {"OMP_WAIT_POLICY": "PASSIVE"}),
        "1 thread per handoff, 2 side by side": (1, 2, {}),
    }
    results = {}
    for label, (threads, workers, extra) in configurations.items():
        code = FULL_RUN_CHILD.format(root=str(ROOT), threads=threads, workers=workers, repeats=repeats, pair=pair_name)
        output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **extra})
        if output.returncode:
            results[label] = {"error": output.stderr.strip().splitlines()[-1:]}
            continue
        walls = json.loads(output.stdout.strip().splitlines()[-1])
        results[label] = {"median_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls)}
    return results


def print_table(title: str, table: dict) -> None:
    columns = list(dict.fromkeys(key for row in table.values() for key in row))
    print(f"\n**{title}** (ms, best of the repeats; x float32)\n")
    print("| | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for label, row in table.items():
        base = row.get("float32")
        cells = [f"{row[c]:.1f}" + (f" ({row[c] / base:.2f}x)" if base else "") if c in row else "" for c in columns]
        print(f"| {label} | " + " | ".join(cells) + " |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-runs", action="store_true", help="only the head and stack tables")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)

    import torch

    from kvviz.engine.runner import load_pair

    pair = load_pair(args.pair, "cpu", "float32", progress=lambda message: print(message, file=sys.stderr))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    report = {"head": head_table(pair, args.repeats), "stack": stack_table(pair, args.repeats)}
    torch.set_num_threads(threads)
    print_table("Output head, one thread", report["head"])
    print_table("Decoder stack's matrix-vector products, one thread", report["stack"])
    if not args.skip_runs:
        report["full_runs"] = full_runs(args.pair, args.repeats)
        print("\n**The page's default handoffs on the locker preset, warm** (wall s, median [min, max])\n")
        print("| configuration | wall s |\n|---|---|")
        for label, row in report["full_runs"].items():
            cell = f"{row['median_s']:.2f} [{row['min_s']:.2f}, {row['max_s']:.2f}]" if "median_s" in row else f"error: {row['error']}"
            print(f"| {label} | {cell} |")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
