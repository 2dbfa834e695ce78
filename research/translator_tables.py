"""docs/C2C.md "Translation" (issues 31 and 43): tables from ``eval-translator --out`` reports, old beside new.

    python research/translator_tables.py --report old=runs/eval/old.json --report new=runs/eval/new.json \\
        [--legs runs/translator/legs-B/legs.jsonl]

The first report must have every row; a later one run with ``--rows translator,control`` on the same
records borrows its receiver and Skyline rows. Prints, as Markdown: per held-out set each reader of
the note as one *matched / deranged* cell (its answers with the record's own note / with another
record's note, 95% Wilson intervals) and its NLL, for each report (the receiver alone and Skyline
once: they do not depend on the translator); harm against the receiver alone (paired interval); the
follow rates on the swapped fact; who-is-where by people per note (the binding test); the presets;
issue 43's targets read from the last report (met or missed); and, with ``--legs``, each training
leg's time and held-out validation numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvviz.data import contains_answer  # noqa: E402
from kvviz.data.record import Record  # noqa: E402
from kvviz.data.stats import paired_comparison  # noqa: E402
from kvviz.data.swaps import swap_outcome  # noqa: E402


def cell(row: dict) -> str:
    low, high = row["ci95"]
    return f"{row['contains']}/{row['n']} [{low:.2f}, {high:.2f}]"


def follow_cell(row: dict) -> str:
    low, high = row["ci95"]
    return f"{row['followed']}/{row['n']} [{low:.2f}, {high:.2f}]"


DERANGED = {"skyline": "skyline_control", "translator": "control"}  # a reader of the note -> it on another record's note


def matched_cell(rows: dict, row: str) -> str:
    """"matched / deranged": the row with the record's own note / with another record's (the receiver
    alone reads no note: its one cell)."""
    other = DERANGED.get(row)
    if other in rows:
        return f"{cell(rows[row])} / {cell(rows[other])}"
    return cell(rows[row])


def answers_table(reports: dict) -> list[str]:
    first = next(iter(reports.values()))
    sets = [name for name, summary in first.items() if isinstance(summary, dict) and "rows" in summary
            and all(name in report for report in reports.values())]  # the sets every report measured
    lines = ["| row | " + " | ".join(f"{name}: contained, matched / deranged | {name} NLL" for name in sets) + " |",
             "|---|" + "---|---|" * len(sets)]
    for label, report in reports.items():
        for row in ("receiver", "skyline", "translator"):
            if row in ("receiver", "skyline") and label != next(iter(reports)):
                continue
            if row not in report[sets[0]]["rows"]:
                continue
            name = row if row in ("receiver", "skyline") else f"{row} ({label})"
            cells = [f"{matched_cell(report[s]['rows'], row)} | {report[s]['rows'][row]['nll']:.3f}" for s in sets]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| measure | " + " | ".join(f"{s} ({label})" for label in reports for s in sets) + " |")
    lines.append("|---|" + "---|" * (len(sets) * len(reports)))
    measures = {
        "answer rate, share of Skyline's": lambda s: f"{s['answer_rate_vs_skyline']:.1%}" if s.get("answer_rate_vs_skyline") is not None else "",
        "answer-rate gap closed": lambda s: f"{s['answer_gap_closed']:.1%}" if s.get("answer_gap_closed") is not None else "",
        "NLL gap closed": lambda s: f"{s['nll_gap_closed']:.1%}" if s.get("nll_gap_closed") is not None else "",
        "communication gain [95%]": lambda s: (f"{s['communication']['gain']:+.3f} [{s['communication']['ci95'][0]:+.3f}, "
                                               f"{s['communication']['ci95'][1]:+.3f}]") if s.get("communication") else "",
        "control within the receiver's interval": lambda s: str(s.get("control_within_receiver_interval", "")),
        "translator - receiver, answer rate [95%]": lambda s: harm_cell(s, "translator"),
        "control - receiver, answer rate [95%]": lambda s: harm_cell(s, "control"),
    }
    for measure, read in measures.items():
        lines.append(f"| {measure} | " + " | ".join(read(report[s]) for report in reports.values() for s in sets) + " |")
    return lines


def harm_cell(summary: dict, row: str) -> str:
    """A reader against the receiver alone on the same records: the answer-rate difference, its paired
    bootstrap interval and McNemar's p."""
    compared = (summary.get("harm") or {}).get(row)
    if not compared:
        return ""
    low, high = compared["ci95"]
    return f"{compared['difference']:+.2f} [{low:+.2f}, {high:+.2f}] (p = {compared.get('mcnemar_p', 1.0):.2g})"


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


def verdict(met: bool | None) -> str:
    return "" if met is None else ("**met**" if met else "**missed**")


def targets(report: dict) -> list[str]:
    """Issue 43's targets, read from one report (which draw it was is the report's ``draw``)."""
    where, recall, paragraphs, unneeded = (report.get(n, {}) for n in ("whereabouts", "recall", "paragraphs", "unneeded"))
    share = lambda value: f"{value:.1%}" if value is not None else "not measured"  # noqa: E731
    follow = (where.get("swap") or {}).get("follow_vs_skyline")
    rows = [
        ("who is where: follow rate >= 60% of Skyline's", share(follow), None if follow is None else follow >= 0.6),
        ("who is where: answer rate >= 80% of Skyline's", share(where.get("answer_rate_vs_skyline")),
         None if where.get("answer_rate_vs_skyline") is None else where["answer_rate_vs_skyline"] >= 0.8),
        ("recall: answer rate >= 75% of Skyline's", share(recall.get("answer_rate_vs_skyline")),
         None if recall.get("answer_rate_vs_skyline") is None else recall["answer_rate_vs_skyline"] >= 0.75),
        ("paragraphs: >= 50% of the receiver-to-Skyline answer-rate gap closed", share(paragraphs.get("answer_gap_closed")),
         None if paragraphs.get("answer_gap_closed") is None else paragraphs["answer_gap_closed"] >= 0.5),
    ]
    for name, summary in (("who is where", where), ("paragraphs", paragraphs)):
        if "control_within_receiver_interval" in summary:
            rows.append((f"{name}: control within the receiver alone's interval",
                         f"{cell(summary['rows']['control'])} vs {cell(summary['rows']['receiver'])}",
                         summary["control_within_receiver_interval"]))
    harm = (unneeded.get("harm") or {}).get("translator")
    if harm:
        rows.append(("harm: on notes without the answer, no worse than the receiver alone (paired interval reaches 0 or above)",
                     harm_cell(unneeded, "translator"), harm["no_worse"]))
    return ["| target | measured | met? |", "|---|---|---|"] + [f"| {name} | {value} | {verdict(met)} |" for name, value, met in rows]


def legs_table(path: Path) -> list[str]:
    lines = ["| leg | steps (total) | minutes | train KL / CE / follow / harm | who is where: translator rate (NLL), control rate "
             "(NLL), follow | recall: translator rate (NLL), control rate (NLL), follow | passages: translator rate (NLL), "
             "control rate (NLL) |", "|---|---|---|---|---|---|---|"]

    def numbers(entry: dict) -> str:
        t, c = entry.get("translator", {}), entry.get("control", {})
        return (f"{t.get('rate', 0):.2f} ({t.get('nll', 0):.2f}), {c.get('rate', 0):.2f} ({c.get('nll', 0):.2f}), "
                f"{(entry.get('follow') or {}).get('translator', 0):.2f}")

    for line in path.read_text().splitlines():
        leg = json.loads(line)
        v = leg.get("validation") or {}
        lines.append(f"| {leg['leg']} | {leg.get('steps', 0)} ({leg['step']}) | {leg.get('seconds', 0) / 60:.0f} | "
                     f"{leg.get('train_kd', 0):.3f} / {leg.get('train_ce', 0):.3f} / {leg.get('train_follow', 0):.3f} / "
                     f"{leg.get('train_harm', 0):.3f} | {numbers(v.get('whereabouts', {}))} | {numbers(v.get('recall', {}))} | "
                     f"{numbers(v.get('passages', {})) if v.get('passages') else ''} |")
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
        if not isinstance(summary, dict) or "rows" not in summary or {"skyline", "receiver"} & set(summary["rows"]):
            continue  # a full report (the harm set runs no Skyline: its receiver row is its own)
        full = base.get(name) or {}
        if not {"receiver", "skyline"} <= set(full.get("rows") or {}):
            raise SystemExit(f"{name}: the first report has no receiver and Skyline rows to borrow; put a full report first")
        if not {"translator", "control"} <= set(summary["rows"]):
            raise SystemExit(f"{name}: a partial report needs the translator and control rows")
        if not same_records(summary, full):
            raise SystemExit(f"{name}: the first report ran on other records; run both with the same sizes and --seed")
        rows = summary["rows"] = {**{r: full["rows"][r] for r in ("receiver", "skyline", "skyline_control") if r in full["rows"]},
                                  **summary["rows"]}
        gap = rows["receiver"]["nll"] - rows["skyline"]["nll"]
        summary["nll_gap_closed"] = (rows["receiver"]["nll"] - rows["translator"]["nll"]) / gap if gap > 0 else None
        summary["answer_rate_vs_skyline"] = rows["translator"]["rate"] / rows["skyline"]["rate"] if rows["skyline"]["rate"] else None
        rate_gap = rows["skyline"]["rate"] - rows["receiver"]["rate"]
        summary["answer_gap_closed"] = (rows["translator"]["rate"] - rows["receiver"]["rate"]) / rate_gap if rate_gap > 0 else None
        low, high = rows["receiver"]["ci95"]
        summary["control_within_receiver_interval"] = low <= rows["control"]["rate"] <= high
        if summary.get("swap") and full.get("swap"):
            summary["swap"]["rows"] = {**{r: full["swap"]["rows"][r] for r in ("receiver", "skyline")}, **summary["swap"]["rows"]}
            skyline = full["swap"]["rows"]["skyline"]["rate"]
            summary["swap"]["follow_vs_skyline"] = summary["swap"]["rows"]["translator"]["rate"] / skyline if skyline else None
        paired_harm(summary, full, name)
        for people, entry in (summary.get("by_people") or {}).items():
            borrowed = (full.get("by_people") or {}).get(people) or {}
            summary["by_people"][people] = {**{r: borrowed[r] for r in ("receiver", "skyline") if r in borrowed}, **entry}
    return report


def paired_harm(summary: dict, full: dict, name: str) -> None:
    """Harm against the receiver alone for a partial report: its answers paired, record by record, with
    the full report's receiver answers on the same records (both reports keep every answer)."""
    mine, theirs = summary.get("answers") or {}, full.get("answers") or {}
    if mine.get("ids") != theirs.get("ids") or "receiver" not in theirs:
        return
    records = [Record(id=i, question="", context="", answers=a, choices=None, answer_index=None, source=name)
               for i, a in zip(theirs["ids"], theirs.get("golds") or [])]
    if len(records) != len(theirs["ids"]):
        return
    alone = [int(contains_answer(text, r.answers)) for text, r in zip(theirs["receiver"], records)]
    summary["harm"] = {}
    for row in ("translator", "control"):
        if row in mine:
            compared = paired_comparison([int(contains_answer(t, r.answers)) for t, r in zip(mine[row], records)], alone)
            summary["harm"][row] = {**compared, "no_worse": compared["ci95"][1] >= 0}


def outcomes(summary: dict, row: str) -> dict[str, list[int]]:
    """0/1 per record of one report's row: ``answers`` (a gold answer contained) and, where the report
    kept each record's answer on its swapped note, ``follows`` (the swapped answer and not the original)."""
    answers = summary.get("answers") or {}
    golds = answers.get("golds") or []
    out = {}
    if row in answers and len(golds) == len(answers[row]):
        out["answers"] = [int(contains_answer(text, gold)) for text, gold in zip(answers[row], golds)]
    twins = answers.get("swap_golds")
    if f"{row}_swap" in answers and twins:
        out["follows"] = [int(swap_outcome(text, gold, twin) == "followed")
                          for text, gold, twin in zip(answers[f"{row}_swap"], golds, twins) if twin is not None]
    return out


def paired_table(reports: dict) -> list[str]:
    """Each later report's translator against the first report's, record by record on the same draw:
    the difference in answer rate and in follow rate (later - first), its paired bootstrap interval
    and McNemar's exact p."""
    lines = ["| set | translator | answer rate: difference [95%] (p) | follow rate: difference [95%] (p) |", "|---|---|---|---|"]
    (first_label, first), *later = reports.items()
    for label, report in later:
        for name, summary in report.items():
            if not isinstance(summary, dict) or "answers" not in summary or name not in first:
                continue
            if (first[name].get("answers") or {}).get("ids") != summary["answers"].get("ids"):
                continue
            mine, theirs = outcomes(summary, "translator"), outcomes(first[name], "translator")
            cells = []
            for key in ("answers", "follows"):
                if key in mine and key in theirs and len(mine[key]) == len(theirs[key]):
                    c = paired_comparison(mine[key], theirs[key])
                    cells.append(f"{c['difference']:+.2f} [{c['ci95'][0]:+.2f}, {c['ci95'][1]:+.2f}] (p = {c['mcnemar_p']:.2g}, "
                                 f"n = {c['n']})")
                else:
                    cells.append("not kept")
            lines.append(f"| {name} | {label} vs {first_label} | " + " | ".join(cells) + " |")
    return lines


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
              ("Who is where by people per note", people_table(reports)),
              (f"Paired against {list(reports)[0]}", paired_table(reports)), ("Presets", presets_table(reports)),
              (f"Targets ({list(reports)[-1]})", targets(reports[list(reports)[-1]]))]
    blocks += [(f"Legs of {path}", legs_table(Path(path))) for path in args.legs]
    for title, lines in blocks:
        if len(lines) <= 2:  # a table with no row (the sets these reports measured have none of it)
            continue
        print(f"### {title}\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
