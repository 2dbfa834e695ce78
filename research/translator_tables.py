"""docs/C2C.md "Translation" (issue 31): tables from ``eval-translator --out`` reports, old beside new.

    python research/translator_tables.py --report old=runs/eval/old.json --report new=runs/eval/new.json \\
        [--legs runs/translator/legs-B/legs.jsonl]

The first report must have every row; a later one run with ``--rows translator,control`` on the same
records borrows its receiver and Skyline rows. Prints, as Markdown: per held-out set every row's answers (95% Wilson interval) and NLL for each
report (the receiver alone and Skyline once: they do not depend on the translator); the follow
rates on the swapped fact; who-is-where by people per note (the binding test); the presets; the
issue's targets read from the last report (met or missed); and, with ``--legs``, each training
leg's time and held-out validation numbers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def cell(row: dict) -> str:
    low, high = row["ci95"]
    return f"{row['contains']}/{row['n']} [{low:.2f}, {high:.2f}]"


def follow_cell(row: dict) -> str:
    low, high = row["ci95"]
    return f"{row['followed']}/{row['n']} [{low:.2f}, {high:.2f}]"


def answers_table(reports: dict) -> list[str]:
    first = next(iter(reports.values()))
    sets = [name for name, summary in first.items() if isinstance(summary, dict) and "rows" in summary
            and all(name in report for report in reports.values())]  # the sets every report measured
    lines = ["| row | " + " | ".join(f"{name}: contained | {name} NLL" for name in sets) + " |",
             "|---|" + "---|---|" * len(sets)]
    for label, report in reports.items():
        for row in ("receiver", "skyline", "translator", "control"):
            if row in ("receiver", "skyline") and label != next(iter(reports)):
                continue
            if row not in report[sets[0]]["rows"]:
                continue
            name = row if row in ("receiver", "skyline") else f"{row} ({label})"
            cells = [f"{cell(report[s]['rows'][row])} | {report[s]['rows'][row]['nll']:.3f}" for s in sets]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| measure | " + " | ".join(f"{s} ({label})" for label in reports for s in sets) + " |")
    lines.append("|---|" + "---|" * (len(sets) * len(reports)))
    measures = {
        "answer rate, share of Skyline's": lambda s: f"{s['answer_rate_vs_skyline']:.1%}" if s.get("answer_rate_vs_skyline") is not None else "",
        "NLL gap closed": lambda s: f"{s['nll_gap_closed']:.1%}" if s.get("nll_gap_closed") is not None else "",
        "communication gain [95%]": lambda s: (f"{s['communication']['gain']:+.3f} [{s['communication']['ci95'][0]:+.3f}, "
                                               f"{s['communication']['ci95'][1]:+.3f}]") if s.get("communication") else "",
        "control within the receiver's interval": lambda s: str(s.get("control_within_receiver_interval", "")),
    }
    for measure, read in measures.items():
        lines.append(f"| {measure} | " + " | ".join(read(report[s]) for report in reports.values() for s in sets) + " |")
    return lines


def swap_table(reports: dict) -> list[str]:
    lines = ["| set | receiver (chance) | control | Skyline | " + " | ".join(f"translator ({label})" for label in reports)
             + " | " + " | ".join(f"share of Skyline's ({label})" for label in reports) + " |",
             "|---|---|---|---|" + "---|" * (2 * len(reports))]
    first = next(iter(reports.values()))
    for name, summary in first.items():
        if not isinstance(summary, dict) or not summary.get("swap"):
            continue
        base = summary["swap"]["rows"]
        swaps = [(r.get(name) or {}).get("swap") or {} for r in reports.values()]
        translators = [follow_cell(sw["rows"]["translator"]) if "translator" in sw.get("rows", {}) else "" for sw in swaps]
        shares = [f"{sw['follow_vs_skyline']:.1%}" if sw.get("follow_vs_skyline") is not None else "" for sw in swaps]
        lines.append(f"| {name} | {follow_cell(base['receiver'])} | {follow_cell(base['control'])} | {follow_cell(base['skyline'])} | "
                     + " | ".join(translators) + " | " + " | ".join(shares) + " |")
    return lines


def people_table(reports: dict) -> list[str]:
    lines = ["| people per note | receiver | Skyline | " + " | ".join(f"translator ({label})" for label in reports)
             + " | " + " | ".join(f"another person's country ({label})" for label in reports) + " |",
             "|---|---|---|" + "---|" * (2 * len(reports))]
    first = next(iter(reports.values())).get("whereabouts", {}).get("by_people", {})
    for people, entry in first.items():
        theirs = [((r.get("whereabouts") or {}).get("by_people") or {}).get(people, {}).get("translator") for r in reports.values()]
        translators = [cell(t) if t else "" for t in theirs]
        others = [str(t["other_persons_country"]) if t else "" for t in theirs]
        lines.append(f"| {people} | {cell(entry['receiver'])} | {cell(entry['skyline'])} | " + " | ".join(translators)
                     + " | " + " | ".join(others) + " |")
    return lines


def presets_table(reports: dict) -> list[str]:
    lines = ["| preset | report | receiver | Skyline | translator | translator, another preset's note | translator on the swap |",
             "|---|---|---|---|---|---|---|"]
    for label, report in reports.items():
        for entry in report.get("presets") or []:
            swap = entry.get("translator_swap") or {}
            mark = lambda row: f"{entry[row]['answer']!r}" + (" ✓" if entry[row]["right"] else "")  # noqa: E731
            lines.append(f"| {entry['preset']} | {label} | {mark('receiver')} | {mark('skyline')} | {mark('translator')} | "
                         f"{mark('control')} | {swap.get('answer', '')!r} ({swap.get('outcome')}) |")
    return lines


def targets(report: dict) -> list[str]:
    where, recall = report.get("whereabouts", {}), report.get("recall", {})
    locker = next((e for e in report.get("presets") or [] if e["preset"] == "locker"), None)
    rows = [
        ("who is where: answer rate >= 50% of Skyline's", where.get("answer_rate_vs_skyline"), 0.5),
        ("who is where: follow rate >= 50% of Skyline's", (where.get("swap") or {}).get("follow_vs_skyline"), 0.5),
        ("recall: answer rate >= 75% of Skyline's", recall.get("answer_rate_vs_skyline"), 0.75),
    ]
    lines = ["| target | measured | met? |", "|---|---|---|"]
    for name, value, bound in rows:
        lines.append(f"| {name} | {value:.1%} | {'**met**' if value is not None and value >= bound else '**missed**'} |"
                     if value is not None else f"| {name} | not measured | |")
    if locker:
        met = locker["translator"]["right"] and not locker["control"]["right"]
        lines.append(f"| locker preset: 4471, not with another preset's note | {locker['translator']['answer']!r} / "
                     f"{locker['control']['answer']!r} | {'**met**' if met else '**missed**'} |")
    for name in ("recall", "countries", "whereabouts"):
        if name in report and "control_within_receiver_interval" in report[name]:
            met = report[name]["control_within_receiver_interval"]
            other = report[name].get("control_other_note")
            why = (f"; the control gives the other note's answer on {other['names_the_other_notes_answer']}/{other['of']}"
                   if other else "")
            lines.append(f"| {name}: control within the receiver alone's interval | "
                         f"{cell(report[name]['rows']['control'])} vs {cell(report[name]['rows']['receiver'])}{why} | "
                         f"{'**met**' if met else '**missed**'} |")
    return lines


def legs_table(path: Path) -> list[str]:
    lines = ["| leg | steps (total) | minutes | train KL / CE | who is where: translator rate (NLL), control rate (NLL), "
             "follow | recall: translator rate (NLL), control rate (NLL), follow |", "|---|---|---|---|---|---|"]

    def numbers(entry: dict) -> str:
        t, c = entry.get("translator", {}), entry.get("control", {})
        return (f"{t.get('rate', 0):.2f} ({t.get('nll', 0):.2f}), {c.get('rate', 0):.2f} ({c.get('nll', 0):.2f}), "
                f"{(entry.get('follow') or {}).get('translator', 0):.2f}")

    for line in path.read_text().splitlines():
        leg = json.loads(line)
        v = leg.get("validation") or {}
        lines.append(f"| {leg['leg']} | {leg.get('steps', 0)} ({leg['step']}) | {leg.get('seconds', 0) / 60:.0f} | "
                     f"{leg.get('train_kd', 0):.3f} / {leg.get('train_ce', 0):.3f} | "
                     f"{numbers(v.get('whereabouts', {}))} | {numbers(v.get('recall', {}))} |")
    return lines


def same_records(summary: dict, full: dict) -> bool:
    """Whether two reports' summaries of a set ran on the same records: as many, and the same first
    records (each report keeps its first few as ``examples``)."""
    def first(entry):
        return [(e.get("context"), e.get("question"), e.get("gold")) for e in entry.get("examples") or []]
    return (full["rows"]["receiver"]["n"] == summary["rows"]["translator"]["n"]
            and first(summary)[:len(first(full))] == first(full)[:len(first(summary))])


def complete(report: dict, base: dict) -> dict:
    """A report run with ``--rows translator,control`` (the receiver and Skyline do not depend on the
    translator) completed from ``base``, a full report on the same records: their rows, Skyline's
    swap and by-people entries, and the shares of Skyline's and the receiver's interval recomputed."""
    for name, summary in report.items():
        if not isinstance(summary, dict) or "rows" not in summary or "skyline" in summary["rows"]:
            continue
        full = base.get(name) or {}
        if not {"receiver", "skyline"} <= set(full.get("rows") or {}):
            raise SystemExit(f"{name}: the first report has no receiver and Skyline rows to borrow; put a full report first")
        if not {"translator", "control"} <= set(summary["rows"]):
            raise SystemExit(f"{name}: a partial report needs the translator and control rows")
        if not same_records(summary, full):
            raise SystemExit(f"{name}: the first report ran on other records; run both with the same sizes and --seed")
        rows = summary["rows"] = {**{r: full["rows"][r] for r in ("receiver", "skyline")}, **summary["rows"]}
        gap = rows["receiver"]["nll"] - rows["skyline"]["nll"]
        summary["nll_gap_closed"] = (rows["receiver"]["nll"] - rows["translator"]["nll"]) / gap if gap > 0 else None
        summary["answer_rate_vs_skyline"] = rows["translator"]["rate"] / rows["skyline"]["rate"] if rows["skyline"]["rate"] else None
        low, high = rows["receiver"]["ci95"]
        summary["control_within_receiver_interval"] = low <= rows["control"]["rate"] <= high
        if summary.get("swap") and full.get("swap"):
            summary["swap"]["rows"] = {**{r: full["swap"]["rows"][r] for r in ("receiver", "skyline")}, **summary["swap"]["rows"]}
            skyline = full["swap"]["rows"]["skyline"]["rate"]
            summary["swap"]["follow_vs_skyline"] = summary["swap"]["rows"]["translator"]["rate"] / skyline if skyline else None
        for people, entry in (summary.get("by_people") or {}).items():
            borrowed = (full.get("by_people") or {}).get(people) or {}
            summary["by_people"][people] = {**{r: borrowed[r] for r in ("receiver", "skyline") if r in borrowed}, **entry}
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--report", action="append", required=True, help="LABEL=PATH of an eval-translator --out report")
    parser.add_argument("--legs", action="append", default=[], help="a run's legs.jsonl")
    args = parser.parse_args()
    reports = {}
    for item in args.report:
        label, _, path = item.partition("=")
        reports[label] = json.loads(Path(path).read_text())
    base = next(iter(reports.values()))
    reports = {label: complete(report, base) for label, report in reports.items()}
    blocks = [("Answers", answers_table(reports)), ("Swapped fact: follow rate", swap_table(reports)),
              ("Who is where by people per note", people_table(reports)), ("Presets", presets_table(reports)),
              (f"Targets ({list(reports)[-1]})", targets(reports[list(reports)[-1]]))]
    blocks += [(f"Legs of {path}", legs_table(Path(path))) for path in args.legs]
    for title, lines in blocks:
        print(f"### {title}\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
