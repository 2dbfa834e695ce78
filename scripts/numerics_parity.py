"""Accuracy parity of a numeric mode against fp32 (issue 42, gate 2): every default handoff of the page
on Countries, recall and HotpotQA, with the swap arm, in fp32 and in the mode, paired per sample.

    nice -n 10 python scripts/numerics_parity.py                      # runs what is missing, then the table
    nice -n 10 python scripts/numerics_parity.py --mode bf16 --out runs/parity --write docs/RESULTS.md
    python scripts/numerics_parity.py --table-only --write docs/RESULTS.md

For each mode (``fp32`` and ``--mode``, default ``auto``: the mode this CPU picks,
``kvviz.runtime.numerics``) and each dataset it runs, one process each, on one torch thread:

    KVVIZ_NUMERICS=MODE python -m kvviz bench --pair embedded --dataset D --swap --limit N --threads 1 --quiet
        --handoffs receiver,skyline,text,c2c,c2c_control,kvcomm --ratios 0.5 --out OUT/MODE-D

(``bench`` resumes where a folder stopped, so the command can be run again after an interruption; a
folder made in another mode is refused.) N is 100 (HotpotQA: 102, every question of the shared file
but KVComm's calibration sample; ``--swap`` keeps the 90 whose note has a swapped fact). Hours of CPU
on a shared 2-core machine: about 2.5 h per mode at one thread there.

The table pairs the two modes' rows per sample: per dataset and handoff, fp32's and the mode's
accuracy (the bench's verdict on the original note) and follow rate (the answer follows the swapped
fact), each with its Wilson 95% interval, the paired difference (mode - fp32) with Newcombe's 95%
interval for paired proportions (his method 10), the discordant counts and McNemar's exact p. The
gate: every paired interval contains 0 (the mode's rate is within the paired interval of fp32's)
on at least ``NEEDED`` paired samples per dataset. With fewer (runs still going, or stopped), the
table says so and the gate is *not established*, whatever the intervals say: a small n proves little.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvviz.data import format_p, paired_mcnemar, wilson_interval  # noqa: E402
from kvviz.handoffs.registry import default_handoffs  # noqa: E402

DATASETS = {"countries": 100, "recall": 100, "hotpotqa": 102}
# The paired samples the gate needs per dataset: the 100; HotpotQA's shared file has 102
# questions besides KVComm's calibration sample and 90 of them a swapped fact (the bench says "12 of 102
# sample(s) have no swapped fact"), so there it is all 90: below the issue's 100, the most the file holds.
NEEDED = {"countries": 100, "recall": 100, "hotpotqa": 90}
SECTION = "numerics-parity"
MEASURES = (("correct", "accuracy"), ("followed", "follows the swap"))


def resolved(mode: str) -> str:
    """The mode a process with ``KVVIZ_NUMERICS=mode`` runs on this machine."""
    import torch

    from kvviz.runtime.numerics import mode_for

    return mode_for("cpu", torch.float32, mode)


def bench_command(dataset: str, limit: int, out: Path) -> list[str]:
    return [sys.executable, "-m", "kvviz", "bench", "--pair", "embedded", "--dataset", dataset, "--swap",
            "--limit", str(limit), "--threads", "1", "--quiet", "--handoffs", ",".join(default_handoffs()),
            "--ratios", "0.5", "--out", str(out)]


def run_mode(mode: str, out: Path, datasets: dict[str, int]) -> None:
    """Every dataset's bench in ``mode``, each in its own process (resumed where it stopped)."""
    for dataset, limit in datasets.items():
        folder = out / f"{mode}-{dataset}"
        folder.mkdir(parents=True, exist_ok=True)
        marker = folder / "numerics.json"
        if marker.exists() and json.loads(marker.read_text())["mode"] != mode:
            raise SystemExit(f"{folder} was made in another numeric mode ({marker.read_text()}); give another --out")
        marker.write_text(json.dumps({"mode": mode, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}))
        if list(folder.glob(".done-*")) and (folder / "summary.csv").exists():
            continue
        env = dict(os.environ, KVVIZ_NUMERICS=mode, OMP_NUM_THREADS="1")
        print(f"{mode} {dataset}: {' '.join(bench_command(dataset, limit, folder))}", file=sys.stderr, flush=True)
        subprocess.run(bench_command(dataset, limit, folder), cwd=ROOT, env=env, check=True)


def read_rows(folder: Path) -> dict[str, dict[str, dict]]:
    """{handoff: {measure: {sample id: 0 or 1}, "answer": {sample id: text}}} of the applicable rows of
    a bench folder."""
    found: dict[str, dict[str, dict]] = {}
    for path in sorted(folder.glob("rows*.csv")):
        with path.open(encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if row.get("applicable") != "1":
                    continue
                entry = found.setdefault(row["handoff"], {**{measure: {} for measure, _ in MEASURES}, "answer": {}})
                entry["answer"][row["sample_id"]] = row.get("answer", "")
                for measure, _ in MEASURES:
                    if row.get(measure, "") != "":
                        entry[measure][row["sample_id"]] = int(float(row[measure]))
    return found


def same_answers(fp32: dict[str, str], mode: dict[str, str]) -> tuple[int, int]:
    """(samples whose answer text is the same in both modes, samples both answered)."""
    shared = set(fp32) & set(mode)
    return sum(fp32[s] == mode[s] for s in shared), len(shared)


def paired_difference_interval(both: int, only_first: int, only_second: int, neither: int, confidence: float = 0.95) -> tuple[float, float, float]:
    """(second - first, low, high): Newcombe's interval for a difference of paired proportions
    (method 10: the Wilson intervals of each, joined through the pairs' correlation)."""
    n = both + only_first + only_second + neither
    if n == 0:
        return float("nan"), -1.0, 1.0
    first, second = (both + only_first) / n, (both + only_second) / n
    l1, u1 = wilson_interval(both + only_first, n, confidence)
    l2, u2 = wilson_interval(both + only_second, n, confidence)
    margins = (both + only_first) * (only_second + neither) * (both + only_second) * (only_first + neither)
    phi = (both * neither - only_first * only_second) / math.sqrt(margins) if margins else 0.0
    delta = second - first
    low = delta - math.sqrt(max(0.0, (second - l2) ** 2 - 2 * phi * (second - l2) * (u1 - first) + (u1 - first) ** 2))
    high = delta + math.sqrt(max(0.0, (u2 - second) ** 2 - 2 * phi * (u2 - second) * (first - l1) + (first - l1) ** 2))
    return delta, max(-1.0, low), min(1.0, high)


def compare(fp32: dict[str, int], mode: dict[str, int]) -> dict:
    paired = paired_mcnemar({"fp32": fp32, "mode": mode}, "fp32", "mode")
    shared = sorted(set(fp32) & set(mode))
    both = sum(1 for s in shared if fp32[s] and mode[s])
    neither = sum(1 for s in shared if not fp32[s] and not mode[s])
    delta, low, high = paired_difference_interval(both, paired["only_first"], paired["only_second"], neither)
    hits = (sum(fp32[s] for s in shared), sum(mode[s] for s in shared))
    return {**paired, "hits": hits, "delta": delta, "low": low, "high": high, "within": low <= 0 <= high}


def rate(hits: int, n: int) -> str:
    low, high = wilson_interval(hits, n)
    return f"{hits / n:.2f} [{low:.2f}, {high:.2f}]" if n else "n/a"


def gate_verdict(every_within: bool, short: list[str]) -> str:
    """The gate's word: missed when an interval leaves 0, not established while a dataset has fewer
    paired samples than it needs (``short``: one phrase each), met otherwise."""
    if not every_within:
        return "missed"
    if short:
        return f"not established (too few paired samples: {'; '.join(short)})"
    return "met"


def table(out: Path, mode: str, datasets: dict[str, int], command: str,
          needed: dict[str, int] | None = None) -> tuple[str, str]:
    """The parity section (markdown) and the gate's verdict (``gate_verdict``)."""
    needed = NEEDED if needed is None else needed
    lines = [f"<!-- {SECTION}:start -->", f"## Numeric mode {mode} against fp32: accuracy parity (issue 42, gate 2)", "",
             f"`{command}` ({time.strftime('%Y-%m-%d %H:%M %Z')}; both modes' bench runs on one torch thread, the "
             "machine shared with other jobs, which changes no answer). Per handoff, paired per sample: fp32's and "
             f"{mode}'s rate with its Wilson 95% interval, the difference ({mode} - fp32) with Newcombe's 95% interval "
             "for paired proportions, the samples only fp32 / only the mode got (discordant pairs) and McNemar's "
             "exact p. *within*: the interval of the difference contains 0.", ""]
    every, short = True, []
    for dataset in datasets:
        fp32_rows, mode_rows = read_rows(out / f"fp32-{dataset}"), read_rows(out / f"{mode}-{dataset}")
        lines += [f"### {dataset}", "", f"| handoff | measure | n | fp32 | {mode} | {mode} - fp32 [95%] | only fp32 / only {mode} | McNemar p | verdict |",
                  "|---|---|---|---|---|---|---|---|---|"]
        same, smallest = [], None
        for handoff in fp32_rows:
            if handoff not in mode_rows:
                continue
            equal, both = same_answers(fp32_rows[handoff]["answer"], mode_rows[handoff]["answer"])
            same.append(f"{handoff} {equal}/{both}")
            for measure, label in MEASURES:
                result = compare(fp32_rows[handoff][measure], mode_rows[handoff][measure])
                if not result["n"]:
                    continue
                every &= result["within"]
                smallest = result["n"] if smallest is None else min(smallest, result["n"])
                lines.append(
                    f"| {handoff} | {label} | {result['n']} | {rate(result['hits'][0], result['n'])} | "
                    f"{rate(result['hits'][1], result['n'])} | {result['delta']:+.2f} [{result['low']:+.2f}, {result['high']:+.2f}] | "
                    f"{result['only_first']} / {result['only_second']} | {format_p(result['p'])} | "
                    f"{'within' if result['within'] else '**outside**'} |")
        if (smallest or 0) < needed.get(dataset, 0):
            short.append(f"{dataset} n = {smallest or 0} of {needed[dataset]}")
        every_one = ": every question of the file with a swapped fact" if needed.get(dataset, 0) < 100 else ""
        lines += ["", f"Paired samples: at least {smallest or 0} per row (the gate needs {needed.get(dataset, 0)}{every_one}). "
                  f"Answers word for word the same in both modes (on the original note): {', '.join(same)}.", ""]
    verdict = gate_verdict(every, short)
    lines.append(f"Gate 2 (every handoff's accuracy and follow rate within the paired interval, at the n it needs): "
                 f"**{verdict}**.")
    lines.append(f"<!-- {SECTION}:end -->")
    return "\n".join(lines) + "\n", verdict


def write_section(path: Path, section: str) -> None:
    text = path.read_text(encoding="utf-8")
    start, end = f"<!-- {SECTION}:start -->", f"<!-- {SECTION}:end -->"
    if start in text and end in text:
        text = text[: text.index(start)] + section.strip("\n") + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="auto", help="the numeric mode set against fp32 (auto: this CPU's)")
    parser.add_argument("--out", default=str(ROOT / "runs" / "parity"), help="the bench folders (one per mode and dataset)")
    parser.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated, of " + ", ".join(DATASETS))
    parser.add_argument("--table-only", action="store_true", help="only the table, from the folders as they are")
    parser.add_argument("--write", default=None, help="put the table into this markdown file (its numerics-parity section)")
    args = parser.parse_args()
    mode = resolved(args.mode)
    if mode == "fp32":
        print(f"--mode {args.mode} is fp32 on this CPU: nothing to compare", file=sys.stderr)
        return 1
    datasets = {name: DATASETS[name] for name in args.datasets.split(",")}
    out = Path(args.out)
    if not args.table_only:
        for each in ("fp32", mode):
            run_mode(each, out, datasets)
    command = "python scripts/numerics_parity.py" + (f" --mode {args.mode}" if args.mode != "auto" else "")
    section, verdict = table(out, mode, datasets, command)
    print(section)
    if args.write:
        write_section(Path(args.write), section)
    return 0 if verdict == "met" else 2


if __name__ == "__main__":
    raise SystemExit(main())
