"""Precompute the presets' results (and the sweep) so the page paints at once.

    python scripts/precompute_presets.py            # presets + sweep on the embedded pair
    python scripts/precompute_presets.py --no-sweep # presets only (about a minute on a CPU)
    python scripts/precompute_presets.py --no-sweep --only c2c_translate,c2c_translate_control
                                                    # re-run these columns only; the others keep theirs
    python scripts/precompute_presets.py --no-sweep --preset handbook
                                                    # re-run these presets only (comma-separated); the others keep theirs

    KVVIZ_NUMERICS=fp32 python scripts/precompute_presets.py
                                                    # the stored runs of the fp32 mode (any CPU)

A preset that names its own pair (``pair`` in assets/presets.toml, e.g. the knower pair) runs on it;
the others on ``--pair``.

Writes the files of the numeric mode this process computes in (``kvviz.runtime.numerics``; the page
shows the ones of its own mode, ``kvviz.app.presets.stored_in``): assets/precomputed/presets.json and
sweep.json in bf16, presets-fp32.json and sweep-fp32.json in fp32. Each holds every page column of the
registry, shown or not at first, and each preset's extra ``runs`` (assets/presets.toml). Then it says
whether every preset's lesson still holds in the new results (``kvviz.app.lessons``; the tests check
the same). The app marks every result from these files as precomputed on
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

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvviz.app.lessons import failures  # noqa: E402
from kvviz.app.methods.registry import column_names  # noqa: E402
from kvviz.app.presets import PRECOMPUTED_PATH, PRECOMPUTED_SWEEP_PATH, PRESETS, live_mode, stored_in  # noqa: E402
from kvviz.app.sweep import default_handoff, run_sweep  # noqa: E402
from kvviz.engine import stream  # noqa: E402
from kvviz.engine.runner import load_pair  # noqa: E402
from kvviz.handoffs.registry import build_request  # noqa: E402


def precomputed_run(pair, key: str, query: str, context: str | None, max_new_tokens: int, names: list[str],
                    options: dict | None = None, inspect: dict | None = None, swap=None, gold=None) -> dict:
    """One run of ``names`` on a preset's question, as the page shows it: the request and the results
    (with what crossed, ``kvviz.runtime.crossed``, when ``inspect`` is given: the page's token view and lens;
    with ``swap``, each result's answer on the swapped note too)."""
    request = build_request(query, context, max_new_tokens=max_new_tokens, options=options, inspect=inspect)
    results = []
    # one run, as the page's: each answer is also scored against its control where both ran (token_change),
    # one handoff after another, so each one's times are its own (solo) on this machine
    for handoff in stream.results(pair, request, names, swap=swap, gold=gold):
        result = {**handoff.to_dict(), "precomputed": True}
        results.append(result)
        swapped = f"  swap: {handoff.swap['outcome']} {handoff.swap['answer']!r}" if handoff.swap else ""
        print(f"{key:<10} {handoff.handoff:<11} {handoff.total_seconds:6.2f} s  {result['answer'] or result['reason']!r}{swapped}",
              flush=True)
    return {"request": request.to_dict(), "results": results, "swap": None if swap is None else swap.to_dict()}


def warm_up(pair, names: list[str], first=None) -> None:
    """One throwaway run of every column first, so that no preset's times include a cold start (the
    output head's index, the first decode step's allocations): the cards compare warm, solo runs."""
    first = first or PRESETS[0]
    stream.results(pair, build_request(first.query, first.context, max_new_tokens=4), names)


class Pairs:
    """The pairs the presets run on, each loaded (and warmed up) once: ``--pair`` for a preset that
    names none, else its own."""

    def __init__(self, default: str, names: list[str]):
        self.default, self.names, self.loaded = default, names, {}

    def __call__(self, preset):
        name = preset.pair or self.default
        if name not in self.loaded:
            self.loaded[name] = load_pair(name, progress=lambda message: print(message, file=sys.stderr))
            warm_up(self.loaded[name], self.names, preset)
        return self.loaded[name]

    def entry(self, preset, max_new_tokens: int) -> dict:
        """A preset's stored run and its extra ``runs``, on its pair (named in the entry when it is not ``--pair``)."""
        pair = self(preset)
        entry = preset_run(pair, preset, self.names, max_new_tokens)
        entry["runs"] = {run.label: stored_run(pair, preset, run, max_new_tokens) for run in preset.runs}
        return {**entry, "pair": pair.name} if preset.pair else entry


def compact_dumps(data: dict) -> str:
    """JSON with one item a line, but each result's attention arrays (``token_attention``'s
    ``attention`` and ``other``, thousands of numbers) on one line each."""
    arrays: dict[str, str] = {}

    def hold(value):
        marker = f"@@array{len(arrays)}@@"
        arrays[marker] = json.dumps(value, separators=(",", ":"))
        return marker

    def walk(value):
        if isinstance(value, dict):
            return {key: (hold(item) if key in ("attention", "other") and isinstance(item, list) else walk(item))
                    for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    text = json.dumps(walk(data), indent=1, ensure_ascii=False)
    for marker, array in arrays.items():
        text = text.replace(f'"{marker}"', array)
    return text


def preset_run(pair, preset, names: list[str], max_new_tokens: int) -> dict:
    """``names`` on a preset's question as the page opens it: what crossed, the gold, its swap."""
    return precomputed_run(pair, preset.key, preset.query, preset.context, max_new_tokens, names,
                           inspect={"gold": preset.answers[0] if preset.answers else None},
                           swap=preset.swap, gold=list(preset.answers))


def stored_run(pair, preset, run, max_new_tokens: int) -> dict:
    """One of a preset's extra ``runs`` (another setting of some columns)."""
    return precomputed_run(pair, f"{preset.key}+", preset.query, preset.context, max_new_tokens,
                           list(run.handoffs), run.options)


def write_and_check(out: dict, said: str) -> None:
    """Writes the presets file of ``out``'s numeric mode, then says whether every preset's lesson still
    holds in it."""
    path = stored_in(PRECOMPUTED_PATH, out["numerics"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(compact_dumps(out) + "\n", encoding="utf-8")
    print(f"{said} {path.relative_to(ROOT)}")
    broken = [failure for preset in PRESETS for failure in failures(preset, out["presets"][preset.key])]
    print("every preset's lesson holds in these results" if not broken else
          "LESSONS THAT NO LONGER HOLD (fix the preset in assets/presets.toml or its lesson):\n  " + "\n  ".join(broken))


def machine_of(pair) -> str:
    """Where the stored runs were computed, with the numeric mode (the page's status line shows it)."""
    # the CPU's kernel family too (AVX2, AVX512): fp32 products of two families can differ in the last bits
    device = (f"{platform.machine()} CPU ({torch.backends.cpu.get_cpu_capability()})" if str(pair.receiver.device) == "cpu"
              else str(pair.receiver.device))
    return f"{device}, {pair.receiver.numerics}"


def stored_file() -> dict:
    """The presets file of the numeric mode this process computes in, read (a partial update starts
    from it); refused with what to run when there is none yet."""
    mode = live_mode()
    path = stored_in(PRECOMPUTED_PATH, mode)
    if not path.is_file():
        raise SystemExit(f"{path.relative_to(ROOT)} does not exist yet: compute every preset in this mode first "
                         f"(KVVIZ_NUMERICS={mode} python scripts/precompute_presets.py --no-sweep).")
    return json.loads(path.read_text(encoding="utf-8"))


def same_numerics(out: dict, pair) -> None:
    """A partial update keeps the file in one numeric mode (``kvviz.runtime.numerics``): refused when
    a pair computes in another mode than the file was written in (a pair on a GPU)."""
    stored, now = out.get("numerics", "fp32"), pair.receiver.numerics
    if stored != now:
        raise SystemExit(f"{stored_in(PRECOMPUTED_PATH, stored).relative_to(ROOT)} holds the {stored} numeric mode and "
                         f"the pair {pair.name} computes in {now}: regenerate every preset in that mode "
                         f"(KVVIZ_NUMERICS={now} python scripts/precompute_presets.py).")


def update_presets(pairs: Pairs, keys: list[str], max_new_tokens: int) -> int:
    """Re-run the presets ``keys`` (every column, their stored runs) and replace their entries in
    this mode's presets file, the other presets' kept as they are."""
    out = stored_file()
    by_key = {preset.key: preset for preset in PRESETS}
    unknown = [key for key in keys if key not in by_key]
    if unknown:
        raise SystemExit(f"unknown preset(s) {', '.join(unknown)}; the presets: {', '.join(by_key)}")
    for key in keys:
        pair = pairs(by_key[key])
        same_numerics(out, pair)
        entry = pairs.entry(by_key[key], max_new_tokens)
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        out["presets"][key] = {**entry, "generated": f"{stamp}, {machine_of(pair)}, warm, one handoff at a time"}
    out["presets"] = {preset.key: out["presets"][preset.key] for preset in PRESETS if preset.key in out["presets"]}
    out["updated"] = f"presets {', '.join(keys)} re-run {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}"
    write_and_check(out, f"updated {', '.join(keys)} in")
    return 0


def update_columns(pairs: Pairs, names: list[str], max_new_tokens: int) -> int:
    """Re-run ``names`` on every preset (and each stored run that holds one of them) and replace their
    results in this mode's presets file, the other columns' results kept as they are."""
    out = stored_file()
    for preset in PRESETS:
        pair = pairs(preset)
        same_numerics(out, pair)
        entry = out["presets"][preset.key]
        fresh = preset_run(pair, preset, names, max_new_tokens)
        replaced = {result["handoff"]: result for result in fresh["results"]}
        entry["results"] = [replaced.get(result["handoff"], result) for result in entry["results"]]
        entry["results"] += [result for name, result in replaced.items() if name not in {r["handoff"] for r in entry["results"]}]
        for run in preset.runs:
            if set(run.handoffs) & set(names):
                entry["runs"][run.label] = stored_run(pair, preset, run, max_new_tokens)
    out["updated"] = f"{', '.join(names)} re-run {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}"
    write_and_check(out, f"updated {', '.join(names)} in")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--sweep-only", action="store_true")
    parser.add_argument("--sweep-tokens", type=int, default=12)
    parser.add_argument("--only", default=None,
                        help="re-run only these columns (comma-separated) on every preset and put their results into the "
                             "existing file; the other columns keep theirs (e.g. after a handoff's checkpoint changes)")
    parser.add_argument("--preset", default=None,
                        help="re-run only these presets (comma-separated keys) and put them into the existing file; "
                             "the other presets keep theirs (e.g. after a preset is added)")
    parser.add_argument("--sweep-series", default=None,
                        help="values of the sweep's series option, comma-separated (default: all it offers)")
    args = parser.parse_args(argv)

    listed = lambda text: [part.strip() for part in text.split(",") if part.strip()]  # noqa: E731
    if args.preset and not args.sweep_only:
        return update_presets(Pairs(args.pair, column_names()), listed(args.preset), args.max_new_tokens)
    if args.only and not args.sweep_only:
        return update_columns(Pairs(args.pair, listed(args.only)), listed(args.only), args.max_new_tokens)
    pair = load_pair(args.pair, progress=lambda message: print(message, file=sys.stderr))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = machine_of(pair)
    if not args.sweep_only:
        # "timed": each handoff ran by itself on a warm process, so its time is its own cost (the
        # page says "alone"; a live run's columns share the CPU, kvviz.app.present.time_text)
        # "numerics": the mode the models computed in (the page's live runs match these in that mode)
        out = {"pair": pair.name, "generated": f"{stamp}, {machine}, warm, one handoff at a time", "timed": "alone",
               "numerics": pair.receiver.numerics, "max_new_tokens": args.max_new_tokens, "presets": {}}
        pairs = Pairs(args.pair, column_names())
        pairs.loaded[pair.name] = pair
        warm_up(pair, column_names())
        for preset in PRESETS:
            out["presets"][preset.key] = pairs.entry(preset, args.max_new_tokens)
        write_and_check(out, "wrote")
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
        sweep["numerics"] = pair.receiver.numerics
        sweep["precomputed"] = True
        sweep_path = stored_in(PRECOMPUTED_SWEEP_PATH, sweep["numerics"])
        sweep_path.write_text(json.dumps(sweep, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {sweep_path.relative_to(ROOT)} in {sweep['seconds']:.0f} s; baselines {sweep['baselines']}")
        for point in sweep["points"]:
            print("  " + " ".join(f"{key}={value}" for key, value in point.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
