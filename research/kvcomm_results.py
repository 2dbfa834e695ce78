"""The KVComm comparison section of docs/RESULTS.md, from research/kvcomm_table.py runs.

    python research/kvcomm_results.py --table Countries=runs/table-countries --table HotpotQA=runs/table-hotpotqa
    python research/kvcomm_results.py ... --write docs/RESULTS.md   # replace the section in the file

A FOLDER may be "A+B": the rows of a run split over two processes (kvcomm_table.py --skip).

Per dataset: the calibration sample (the task's first, not scored), accuracy with 95% Wilson
intervals on the samples every variant answered (paired), McNemar's exact test for KVComm against
Skyline and against random and contiguous layers, and each target of issue 12 met or missed, with
the measured facts that explain it (KVComm with every layer against Skyline, answer for answer; the
rank correlation between the calibration profile and each query's own importance).

The section sits between ``<!-- kvcomm-table:start -->`` and ``<!-- kvcomm-table:end -->``; the
RESULTS.md writer (kvviz.studies.bench.report, KEPT) keeps it when the rest is regenerated.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvviz.data import format_p, paired_mcnemar, wilson_interval  # noqa: E402
from kvviz.studies.bench.report import section_command, section_marks  # noqa: E402

START, END = section_marks("kvcomm-table")
ORDER = ("receiver", "skyline", "text", "kvcomm@0.3", "kvcomm@0.5", "kvcomm@0.7", "kvcomm-random@0.3",
         "kvcomm-contiguous@0.3")
CONTROLS = ("kvcomm-all", "kvcomm-query@0.3", "kvcomm-builtin@0.3")
NAMES = {
    "receiver": "receiver alone", "skyline": "Skyline", "text": "text message",
    "kvcomm@0.3": "KVComm r = 0.3", "kvcomm@0.5": "KVComm r = 0.5", "kvcomm@0.7": "KVComm r = 0.7",
    "kvcomm-random@0.3": "random layers, r = 0.3", "kvcomm-contiguous@0.3": "contiguous layers, r = 0.3",
    "kvcomm-all": "KVComm, every layer (control)", "kvcomm-query@0.3": "KVComm r = 0.3 calibrated on each query (control)",
    "kvcomm-builtin@0.3": "KVComm r = 0.3 calibrated on the built-in sentence (control)",
}


def read_rows(folder: Path) -> list[dict]:
    """Applicable rows of FOLDER/rows.csv; "A+B" reads both (a run split with kvcomm_table.py --skip)."""
    rows = []
    for part in str(folder).split("+"):
        with (Path(part) / "rows.csv").open(newline="", encoding="utf-8") as handle:
            rows += [row for row in csv.DictReader(handle) if row.get("applicable", "1") in ("1", "True")]
    return rows


def paired(rows: list[dict], variants: list[str]) -> tuple[dict[str, dict[str, dict]], list[str]]:
    """variant -> sample -> row, and the samples every one of ``variants`` answered (in run order)."""
    table: dict[str, dict[str, dict]] = {}
    order: list[str] = []
    for row in rows:
        table.setdefault(row["variant"], {})[row["sample_id"]] = row
        if row["sample_id"] not in order:
            order.append(row["sample_id"])
    present = [v for v in variants if v in table]
    shared = [s for s in order if all(s in table[v] for v in present)]
    return table, shared


def correct_table(table: dict, samples: list[str]) -> dict[str, dict[str, int]]:
    return {v: {s: int(float(rows[s]["correct"] or 0)) for s in samples if s in rows} for v, rows in table.items()}


def accuracy(correct: dict[str, int]) -> tuple[int, int]:
    return sum(correct.values()), len(correct)


def dataset_section(name: str, folder: Path, command: str) -> str:
    rows = read_rows(folder)
    calibration = (Path(str(folder).split("+")[0]) / "calibration.txt").read_text(encoding="utf-8").splitlines()
    cal_id = calibration[0].split(":", 1)[1].strip()
    cal_question = next((line.split(":", 1)[1].strip() for line in calibration if line.startswith("question:")), "")
    table, shared = paired(rows, list(ORDER))
    correct = correct_table(table, shared)
    n = len(shared)
    lines = [f"### {name}", ""]
    lines.append(f"Calibration sample (the task's first, not scored): `{cal_id}`, \"{cal_question}\". "
                 f"n = {n} scored samples that every variant below answered (greedy, 24 new tokens; correct = token "
                 "F1 > 0.5 with a gold answer).")
    lines += ["", f"`{command}`", ""]
    lines += ["| variant | correct | accuracy | 95% Wilson interval | share of Skyline's accuracy |", "|---|---|---|---|---|"]
    sky_right, _ = accuracy(correct.get("skyline", {}))
    for variant in ORDER:
        if variant not in correct:
            lines.append(f"| {NAMES[variant]} (`{variant}`) | not run | | | |")
            continue
        right, total = accuracy(correct[variant])
        low, high = wilson_interval(right, total)
        share = f"{100 * right / sky_right:.0f}%" if sky_right else "n/a"
        lines.append(f"| {NAMES[variant]} (`{variant}`) | {right}/{total} | {right / total:.2f} | {low:.2f} to {high:.2f} | {share} |")
    comparisons = [("kvcomm@0.3", "skyline"), ("kvcomm@0.5", "skyline"), ("kvcomm@0.7", "skyline"),
                   ("kvcomm@0.3", "kvcomm-random@0.3"), ("kvcomm@0.3", "kvcomm-contiguous@0.3"),
                   ("kvcomm@0.3", "receiver")]
    lines += ["", "| A | B | n | acc A | acc B | A - B | only A right | only B right | McNemar exact p |",
              "|---|---|---|---|---|---|---|---|---|"]
    results = {}
    for first, second in comparisons:
        if first in correct and second in correct:
            r = paired_mcnemar(correct, first, second)
            results[(first, second)] = r
            lines.append(f"| {first} | {second} | {r['n']} | {r['acc_first']:.2f} | {r['acc_second']:.2f} | "
                         f"{r['acc_first'] - r['acc_second']:+.2f} | {r['only_first']} | {r['only_second']} | {format_p(r['p'])} |")

    # controls, on the samples they ran (a subset may have run)
    facts = []
    if "kvcomm-all" in table and "skyline" in table:
        both = [s for s in table["kvcomm-all"] if s in table["skyline"]]
        same = sum(table["kvcomm-all"][s]["answer"] == table["skyline"][s]["answer"] for s in both)
        facts.append(f"KVComm with every layer sent (`kvcomm-all`) gave Skyline's answer, word for word, on {same} of "
                     f"{len(both)} samples")
    rhos = [float(r["importance_spearman"]) for r in table.get("kvcomm@0.3", {}).values()
            if r.get("importance_spearman") not in ("", "None", None)]
    if rhos:
        facts.append(f"the calibration sample's per-layer importance ranks each query's own importance with Spearman "
                     f"{statistics.median(rhos):+.2f} (median over {len(rhos)} queries; "
                     f"{sum(r < 0.5 for r in rhos)} below 0.5)")
    for control in ("kvcomm-query@0.3", "kvcomm-builtin@0.3"):
        if control in table and "kvcomm@0.3" in table:
            both = [s for s in table[control] if s in table["kvcomm@0.3"]]
            c = {v: {s: int(float(table[v][s]["correct"] or 0)) for s in both} for v in (control, "kvcomm@0.3")}
            r = paired_mcnemar(c, control, "kvcomm@0.3")
            facts.append(f"`{control}` scored {r['acc_first']:.2f} against `kvcomm@0.3`'s {r['acc_second']:.2f} on the "
                         f"same {r['n']} samples (McNemar p = {format_p(r['p'])})")

    lines += ["", "Targets (issue 12):", "", "| target | measured | verdict | why |", "|---|---|---|---|"]

    def share_target(variant: str, goal: float) -> None:
        if variant not in correct or "skyline" not in correct or not sky_right:
            lines.append(f"| {variant} >= {goal:.0%} of Skyline | not measured | not measured | |")
            return
        right, _ = accuracy(correct[variant])
        share = right / sky_right
        r = results[(variant, "skyline")]
        verdict = "met" if share >= goal else "missed"
        why = (f"{r['only_second']} samples only Skyline got right, {r['only_first']} only KVComm "
               f"(McNemar p = {format_p(r['p'])}{'' if r['p'] < 0.05 else ': the gap is not significant at 0.05'})")
        lines.append(f"| {NAMES[variant]} >= {goal:.0%} of Skyline | {right}/{sky_right} = {share:.0%} | {verdict} | {why} |")

    def beats_target(control: str) -> None:
        key = ("kvcomm@0.3", control)
        if key not in results:
            lines.append(f"| KVComm r = 0.3 beats {control} by >= 10 points | not measured | not measured | |")
            return
        r = results[key]
        gap = 100 * (r["acc_first"] - r["acc_second"])
        verdict = "met" if gap >= 10 else "missed"
        lines.append(f"| KVComm r = 0.3 beats {NAMES[control]} by >= 10 points | {gap:+.0f} points | {verdict} | "
                     f"McNemar p = {format_p(r['p'])} ({r['only_first']} vs {r['only_second']} discordant samples"
                     f"{'' if r['p'] < 0.05 else '; not significant at 0.05'}) |")

    share_target("kvcomm@0.3", 0.8)
    share_target("kvcomm@0.5", 0.95)
    beats_target("kvcomm-random@0.3")
    beats_target("kvcomm-contiguous@0.3")
    complete = all(v in correct for v in ("receiver", "skyline", "text", "kvcomm@0.3", "kvcomm@0.5", "kvcomm@0.7"))
    lines.append(f"| the paper's table on this pair (receiver, Skyline, text, KVComm r = 0.3 / 0.5 / 0.7, calibration "
                 f"sample named) | n = {n} | {'done' if complete and n >= 100 else f'done at n = {n}' if complete else 'incomplete'} "
                 f"| {'' if n >= 100 else 'the run was stopped before 100 samples (time)'} |")
    if facts:
        lines += ["", "Measured facts behind the verdicts: " + "; ".join(facts) + "."]
    # what those facts rule out, said only when they were measured and say so
    ruled_out = []
    if "kvcomm-all" in table and "skyline" in table:
        both = [s for s in table["kvcomm-all"] if s in table["skyline"]]
        if both and all(table["kvcomm-all"][s]["answer"] == table["skyline"][s]["answer"] for s in both):
            ruled_out.append("the splice (every layer sent answers exactly as Skyline)")
    if "kvcomm-query@0.3" in table and "kvcomm@0.3" in table:
        both = [s for s in table["kvcomm-query@0.3"] if s in table["kvcomm@0.3"]]
        c = {v: {s: int(float(table[v][s]["correct"] or 0)) for s in both} for v in ("kvcomm-query@0.3", "kvcomm@0.3")}
        r = paired_mcnemar(c, "kvcomm-query@0.3", "kvcomm@0.3")
        if r["p"] >= 0.05:
            ruled_out.append("the one-sample calibration (choosing the layers on each query's own attention does "
                             "not score significantly differently)")
    if ruled_out:
        lines += ["", "So a gap to Skyline at a small ratio is not explained by " + " nor by ".join(ruled_out)
                  + ": what is left is how many layers get the context."]
    return "\n".join(lines) + "\n"


def section(tables: list[tuple[str, Path, str]]) -> str:
    parts = [START, "## KVComm against the paper's table (issue 12)", "",
             "The embedded pair's KVComm: Gemma-3-270M sends to a second Gemma-3-270M, alpha = 1.0 (the reference "
             "code's default), layer 0 always among the sent layers, every other layer keeping a one-token sink. "
             "Every variant answers the same samples, so they are compared pair by pair (McNemar's exact test), "
             "not only by their intervals. Rerun with `bash research/kvcomm_tables.sh` (it resumes, and it reads a "
             "run split over processes with `kvcomm_table.py --skip` together); it ends with "
             "`python research/kvcomm_results.py ... --write docs/RESULTS.md`, which wrote this section from the runs "
             "named under each table. The section is kept when the rest of this file is regenerated. Where the "
             "tables at the top of this file (from `bash scripts/make_results.sh`) are older than this section, "
             "their KVComm rows were measured with earlier defaults (see the date and commit at the top); "
             "this section is measured with the defaults named here.", ""]
    for name, folder, command in tables:
        parts.append(dataset_section(name, folder, command))
    parts.append(END)
    return "\n".join(parts) + "\n"


def table_of(item: str) -> tuple[str, Path, str]:
    """NAME=FOLDER[=COMMAND]: a dataset's table, and how it was made (default: its usual command)."""
    name, folder, *command = item.split("=", 2)
    default = (f"python research/kvcomm_table.py --dataset {name.lower()} --limit 100 --threads 1 --only "
               f"{','.join(ORDER)} --out {folder}")
    return name, Path(folder), command[0] if command else default


def main() -> int:
    return section_command(__doc__, section, "kvcomm-table", "KVComm", metavar="NAME=FOLDER[=COMMAND]", parse=table_of,
                           table_help="a dataset's kvcomm_table.py run; COMMAND: how it was made (default: its usual command)")


if __name__ == "__main__":
    raise SystemExit(main())
