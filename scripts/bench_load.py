"""Benchmark: how long an embedded model takes to load from the kvviz conversion cache.

Target (issue 2): under 5 s per model on a 2-core CPU. Each measurement runs in a fresh Python
process, so nothing is shared with an earlier load; the time covers load_model() only (weights,
tokenizer, facts), not the Python, torch and transformers imports.

    python scripts/bench_load.py [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

TARGET_SECONDS = 5.0
CHILD = """
import time, torch
torch.set_num_threads(2)
# Importing the libraries is process start-up (the app pays it once), not loading the model.
from transformers import AutoModelForCausalLM, AutoTokenizer, AttentionInterface, DynamicCache
from kvviz.models import load_model
started = time.perf_counter()
load_model({name!r}, device="cpu")
print(time.perf_counter() - started)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from kvviz.models import EMBEDDED_MODELS, prepare_embedded

    rows = []
    for name in EMBEDDED_MODELS:
        prepare_embedded(name, progress=lambda message: print(message, file=sys.stderr))
        times = []
        for _ in range(args.repeats):
            done = subprocess.run([sys.executable, "-c", CHILD.format(name=name)], capture_output=True, text=True, check=True)
            times.append(float(done.stdout.strip().splitlines()[-1]))
        median = statistics.median(times)
        rows.append({"model": name, "median_s": median, "min_s": min(times), "max_s": max(times),
                     "repeats": args.repeats, "target_s": TARGET_SECONDS, "meets_target": median < TARGET_SECONDS})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'model':<16} {'median s':>9} {'min s':>7} {'max s':>7}  target < {TARGET_SECONDS:.0f} s")
        for row in rows:
            verdict = "met" if row["meets_target"] else "MISSED"
            print(f"{row['model']:<16} {row['median_s']:>9.2f} {row['min_s']:>7.2f} {row['max_s']:>7.2f}  {verdict}")
    return 0 if all(row["meets_target"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
