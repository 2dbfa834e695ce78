"""Precompute the presets' results (and the sweep) so the page paints at once.

    python scripts/precompute_presets.py            # presets + sweep on the embedded pair
    python scripts/precompute_presets.py --no-sweep # presets only (about a minute on a CPU)

Writes assets/precomputed/presets.json (every page column of the registry, shown or not at first)
and assets/precomputed/sweep.json. The app marks every result from these files as precomputed on
screen. Rerun after a handoff changes or a new one is registered, so that its column is
precomputed too.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvviz.engine import load_pair, run_handoff  # noqa: E402
from kvviz.handoffs.registry import build_request, page_handoffs  # noqa: E402
from kvviz.presets import PRECOMPUTED_PATH, PRECOMPUTED_SWEEP_PATH, PRESETS  # noqa: E402
from kvviz.sweep import default_handoff, run_sweep  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--sweep-only", action="store_true")
    parser.add_argument("--sweep-tokens", type=int, default=12)
    parser.add_argument("--sweep-series", default=None,
                        help="values of the sweep's series option, comma-separated (default: all it offers)")
    args = parser.parse_args(argv)

    pair = load_pair(args.pair, progress=lambda message: print(message, file=sys.stderr))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.machine()} CPU" if str(pair.receiver.device) == "cpu" else str(pair.receiver.device)
    if not args.sweep_only:
        out = {"pair": pair.name, "generated": f"{stamp}, {machine}", "max_new_tokens": args.max_new_tokens, "presets": {}}
        for preset in PRESETS:
            request = build_request(preset.query, preset.context, max_new_tokens=args.max_new_tokens)
            results = []
            for name in [handoff.name for handoff in page_handoffs()]:
                started = time.perf_counter()
                result = run_handoff(name, pair, request).to_dict()
                result["precomputed"] = True
                results.append(result)
                print(f"{preset.key:<10} {name:<9} {time.perf_counter() - started:6.2f} s  {result['answer'] or result['reason']!r}")
            out["presets"][preset.key] = {"request": request.to_dict(), "results": results}
        PRECOMPUTED_PATH.parent.mkdir(parents=True, exist_ok=True)
        PRECOMPUTED_PATH.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {PRECOMPUTED_PATH.relative_to(ROOT)}")
    if not args.no_sweep:
        swept = default_handoff().sweep
        series = [s.strip() for s in args.sweep_series.split(",") if s.strip()] if args.sweep_series else list(swept.series_values)
        last = [0.0]

        def progress(fraction, desc=""):
            if time.perf_counter() - last[0] > 5:
                last[0] = time.perf_counter()
                print(f"sweep {100 * fraction:5.1f}%  {desc}", file=sys.stderr)

        sweep = run_sweep(pair, series, args.sweep_tokens, progress=progress)
        sweep["generated"] = f"{stamp}, {machine}"
        sweep["precomputed"] = True
        PRECOMPUTED_SWEEP_PATH.write_text(json.dumps(sweep, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {PRECOMPUTED_SWEEP_PATH.relative_to(ROOT)} in {sweep['seconds']:.0f} s; baselines {sweep['baselines']}")
        for point in sweep["points"]:
            print("  " + " ".join(f"{key}={value}" for key, value in point.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
