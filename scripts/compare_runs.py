"""Compare two runs sample by sample: two benchmark folders, or two precomputed preset files.

Benchmark folders (e.g. two precisions or head paths, or the code before and after a change):

    KVVIZ_FAST_HEAD=1 python -m kvviz bench --pair embedded --dataset countries --handoffs receiver,skyline \\
        --limit 100 --seed 0 --threads 1 --out runs/head-fast
    KVVIZ_FAST_HEAD=0 python -m kvviz bench ... --out runs/head-full
    python scripts/compare_runs.py runs/head-fast runs/head-full

prints, per variant, how many answers are identical and the accuracy of each run, then the samples
whose answers differ. ``--measurements`` also compares what each row measured beside its answer
(bytes sent, FLOPs per model, the layers sent, the tokens generated, the message, applicability):
a refactoring that claims to change nothing must leave all of them equal.

Preset files (``assets/precomputed/presets.json`` as committed against a regenerated one):

    python scripts/compare_runs.py --presets old.json assets/precomputed/presets.json

compares every preset's and every stored variation's results, handoff by handoff: the answer, the
bytes, the FLOPs, the layer records and the tokens (never the timings). Exits 1 when anything differs.
``--tolerance 1e-5`` lets numbers of the per-layer records differ by that much, relatively (two
processes' floating-point reductions may differ in the last bits), and says how many did.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvviz.studies.bench.rows import read_rows  # noqa: E402

# what a bench row measured beside its answer (rows.csv columns); timings are left out on purpose
MEASURED_COLUMNS = ("applicable", "reason", "bytes", "communication", "flops_sharer", "flops_receiver", "flops_total",
                    "generated_tokens", "message", "selected_layers")
# what a preset result measured beside its answer
PRESET_FIELDS = ("applicable", "reason", "bytes_communicated", "communication", "flops", "flops_to_first_token", "tokens",
                 "layers", "answer_ids")


def compare_bench(first: str, second: str, measurements: bool) -> int:
    rows_1, rows_2 = read_rows(Path(first)), read_rows(Path(second))
    merged = rows_1.merge(rows_2, on=["dataset", "sample_index", "variant"], suffixes=("_1", "_2"))
    if merged.empty:
        print("no sample and variant in common")
        return 1
    columns = ("answer",) + (MEASURED_COLUMNS if measurements else ())
    merged["same"] = True
    for column in columns:
        equal = merged[f"{column}_1"].fillna("").astype(str) == merged[f"{column}_2"].fillna("").astype(str)
        merged[f"same_{column}"] = equal
        merged["same"] &= equal
    print(f"| variant | samples | identical {'rows' if measurements else 'answers'} | accuracy {first} | accuracy {second} |")
    print("|---|---|---|---|---|")
    for (dataset, variant), group in merged.groupby(["dataset", "variant"]):
        accuracy = [pandas.to_numeric(group[f"correct_{side}"], errors="coerce").mean() for side in (1, 2)]
        print(f"| {dataset} {variant} | {len(group)} | {int(group['same'].sum())} | {accuracy[0]:.3f} | {accuracy[1]:.3f} |")
    for _, row in merged[~merged["same"]].iterrows():
        differ = [column for column in columns if not row[f"same_{column}"]]
        print(f"  {row['dataset']} #{row['sample_index']} {row['variant']}: "
              + "; ".join(f"{column} {row[f'{column}_1']!r} vs {row[f'{column}_2']!r}" for column in differ))
    print(f"{len(merged)} rows compared ({', '.join(columns)}): {int((~merged['same']).sum())} differ")
    return 0 if merged["same"].all() else 1


def preset_results(path: str) -> dict:
    """(preset, run, handoff) -> result, for every preset's results and its stored variations."""
    data = json.loads(Path(path).read_text())
    out = {}
    for key, entry in data["presets"].items():
        runs = {"": entry, **(entry.get("runs") or {})}
        for run_name, run in runs.items():
            for result in run.get("results", []):
                out[(key, run_name, result["handoff"])] = result
    return out


def differs(a, b, tolerance: float) -> bool:
    """Whether two JSON values differ: numbers by more than ``tolerance`` relative, the rest exactly."""
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() != b.keys() or any(differs(a[k], b[k], tolerance) for k in a)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) != len(b) or any(differs(x, y, tolerance) for x, y in zip(a, b))
        return a != b
    return abs(a - b) > tolerance * max(1.0, abs(a), abs(b))


def compare_presets(first: str, second: str, tolerance: float) -> int:
    results_1, results_2 = preset_results(first), preset_results(second)
    missing = sorted(set(results_1) ^ set(results_2))
    differ, close = [], 0
    for key in sorted(set(results_1) & set(results_2)):
        a, b = results_1[key], results_2[key]
        fields = [name for name in ("answer", *PRESET_FIELDS) if differs(a.get(name), b.get(name), tolerance)]
        if fields:
            differ.append((key, fields, a.get("answer"), b.get("answer")))
        elif any(a.get(name) != b.get(name) for name in ("answer", *PRESET_FIELDS)):
            close += 1
    for (preset, run, handoff), fields, answer_1, answer_2 in differ:
        where = f"{preset}{f' [{run}]' if run else ''} {handoff}"
        print(f"  {where}: {', '.join(fields)} differ ({answer_1!r} vs {answer_2!r})")
    for key in missing:
        print(f"  only in one file: {key}")
    compared = len(set(results_1) & set(results_2))
    within = f"; {close} equal only within a relative {tolerance:g} (floating-point noise)" if tolerance else ""
    print(f"{compared} preset results compared (answer, {', '.join(PRESET_FIELDS)}): {len(differ)} differ, "
          f"{len(missing)} in one file only{within}")
    return 0 if not differ and not missing else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--measurements", action="store_true", help="bench folders: compare every measured column, not only the answers")
    parser.add_argument("--presets", action="store_true", help="the two paths are precomputed preset files")
    parser.add_argument("--tolerance", type=float, default=0.0,
                        help="--presets: numbers within this relative difference count as equal (default 0: exact)")
    args = parser.parse_args(argv)
    if args.presets:
        return compare_presets(args.first, args.second, args.tolerance)
    return compare_bench(args.first, args.second, args.measurements)


if __name__ == "__main__":
    raise SystemExit(main())
