"""C2C in the paper's own setting: the multiple-choice table of docs/C2C.md, from two eval-fuser reports.

    python -m kvviz eval-fuser --pair embedded --fuser RUNS/shared_c2c/c2c --mc-scoring likelihood \\
        --datasets arc_challenge,openbookqa,mmlu_redux --mc-limit 200 --heldout 0 --out RUNS/eval_c2c.json ...
    python -m kvviz eval-fuser --pair embedded-gemma --fuser RUNS/shared_self/c2c --mc-scoring likelihood \\
        --handoffs receiver,c2c --datasets ... --mc-limit 200 --heldout 0 --out RUNS/eval_self.json ...
    python research/c2c_paper_table.py --c2c RUNS/eval_c2c.json --self-fusion RUNS/eval_self.json

Each side may be several reports (e.g. run side by side, one per dataset or per handoff). The C2C reports give
receiver, sharer, text, C2C, C2C with another question in the sharer and the control; the
self-fusion ones (a Gemma -> Gemma fuser) give the self-fusion rows. Both score the same
seeded questions with the same receiver, so the receiver rows must agree (checked) and every
comparison is paired per question: the difference of accuracies with a bootstrap 95% interval
and McNemar's exact p. "all" pools the three datasets' questions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvviz.data import wilson_interval  # noqa: E402
from kvviz.data.stats import paired_comparison  # noqa: E402
from kvviz.studies.c2c.evaluate import OTHER_QUESTION  # noqa: E402

# the C2C paper's Table (receiver Qwen3-0.6B, sharer Qwen2.5-0.5B; REFERENCE.md section 1)
PAPER = {"mmlu_redux": (35.5, 41.0, 42.9), "openbookqa": (39.2, 44.0, 52.6), "arc_challenge": (41.0, 49.5, 54.5)}
TITLES = {"arc_challenge": "ARC-Challenge", "openbookqa": "OpenBookQA", "mmlu_redux": "MMLU-Redux", "all": "all three"}
SELF, SELF_OTHER = "self-fusion", "self-fusion, other question"
COLUMNS = ("receiver", "sharer", "text", "c2c", OTHER_QUESTION, "c2c_control", SELF, SELF_OTHER)
LABELS = {
    "receiver": "receiver", "sharer": "sharer", "text": "text", "c2c": "C2C", OTHER_QUESTION: "C2C, other question",
    "c2c_control": "control", SELF: "self-fusion", SELF_OTHER: "self-fusion, other question",
}
COMPARISONS = (
    ("c2c", "receiver", "C2C − receiver"),
    ("c2c", OTHER_QUESTION, "communication gain: C2C − C2C with another question"),
    (OTHER_QUESTION, "receiver", "C2C with another question − receiver"),
    ("c2c", SELF, "C2C − self-fusion"),
    (SELF, "receiver", "self-fusion − receiver"),
    (SELF, SELF_OTHER, "self-fusion − self-fusion with another question"),
    ("c2c", "c2c_control", "C2C − control"),
    ("text", "receiver", "text − receiver"),
    ("c2c", "text", "C2C − text"),
)


def per_question(c2c_report: dict, self_report: dict | None) -> dict[str, dict[str, dict]]:
    """dataset -> row name -> {"ids", "correct", "gold"}, both reports merged (self rows renamed)."""
    table: dict[str, dict[str, dict]] = {}
    for report, rename in ((c2c_report, {}), (self_report, {"c2c": SELF, OTHER_QUESTION: SELF_OTHER})):
        if report is None:
            continue
        for dataset, measured in report["mc_likelihood"].items():
            for name, row in measured["rows"].items():
                if report is self_report and name not in rename:
                    if name == "receiver":
                        check_same_receiver(dataset, table[dataset]["receiver"], measured["ids"], row)
                    continue
                table.setdefault(dataset, {})[rename.get(name, name)] = {
                    "ids": measured["ids"], "correct": row["per_question"], "gold": row["gold_score"],
                }
    pooled: dict[str, dict] = {}
    for dataset, rows in table.items():
        for name, row in rows.items():
            into = pooled.setdefault(name, {"ids": [], "correct": [], "gold": []})
            for key in into:
                into[key] = into[key] + [f"{dataset}:{x}" if key == "ids" else x for x in row[key]]
    if len(table) > 1:
        # only rows measured on every dataset are pooled
        table["all"] = {name: row for name, row in pooled.items() if all(name in rows for rows in table.values())}
    return table


def check_same_receiver(dataset: str, ours: dict, ids: list, row: dict) -> None:
    if ours["ids"] != ids or ours["correct"] != row["per_question"]:
        raise SystemExit(f"{dataset}: the two reports' receiver rows differ (other questions, seed or receiver?)")


def cell(correct: list[int]) -> str:
    low, high = wilson_interval(sum(correct), len(correct))
    return f"{100 * sum(correct) / len(correct):.1f} [{100 * low:.1f}, {100 * high:.1f}]"


def comparison_cell(first: dict, second: dict, seed: int) -> str:
    if first["ids"] != second["ids"]:
        raise SystemExit("rows compared on different questions")
    r = paired_comparison(first["correct"], second["correct"], seed)
    low, high = r["ci95"]
    return f"{100 * r['difference']:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}], {r['only_first']}/{r['only_second']}, p {r['mcnemar_p']:.2g}"


def gold_cell(first: dict, second: dict, seed: int) -> str:
    r = paired_comparison(first["gold"], second["gold"], seed)
    low, high = r["ci95"]
    return f"{r['difference']:+.4f} [{low:+.4f}, {high:+.4f}]"


def markdown(table: dict, seed: int = 0) -> str:
    shown = [c for c in COLUMNS if any(c in rows for rows in table.values())]
    lines = [
        "| dataset | n | " + " | ".join(LABELS[c] for c in shown) + " | paper: receiver / text / C2C |",
        "|---|---|" + "---|" * len(shown) + "---|",
    ]
    for dataset, rows in table.items():
        n = len(next(iter(rows.values()))["correct"])
        paper = PAPER.get(dataset)
        cells = [cell(rows[c]["correct"]) if c in rows else "n/a" for c in shown]
        lines.append(f"| {TITLES.get(dataset, dataset)} | {n} | " + " | ".join(cells) + f" | {' / '.join(map(str, paper)) if paper else ''} |")
    lines += ["", "Paired differences in accuracy points [bootstrap 95% interval], questions only the first / only the second got right, McNemar's exact p:", ""]
    compared = [(a, b, label) for a, b, label in COMPARISONS if any(a in rows and b in rows for rows in table.values())]
    lines.append("| comparison | " + " | ".join(TITLES.get(d, d) for d in table) + " |")
    lines.append("|---|" + "---|" * len(table))
    for first, second, label in compared:
        cells = [comparison_cell(rows[first], rows[second], seed) if first in rows and second in rows else "n/a" for rows in table.values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "The same differences in the gold choice's log-likelihood (nats per byte, as scored) [bootstrap 95% interval]:", ""]
    lines.append("| comparison | " + " | ".join(TITLES.get(d, d) for d in table) + " |")
    lines.append("|---|" + "---|" * len(table))
    for first, second, label in compared:
        cells = [gold_cell(rows[first], rows[second], seed) if first in rows and second in rows else "n/a" for rows in table.values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--c2c", type=Path, nargs="+", required=True,
                        help="eval-fuser --mc-scoring likelihood report(s) of the C2C fuser (one per dataset or one for all)")
    parser.add_argument("--self-fusion", type=Path, nargs="*", default=[], help="the same report(s) of the self-fusion fuser")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = parser.parse_args(argv)
    self_report = merged_reports(args.self_fusion) if args.self_fusion else None
    print(markdown(per_question(merged_reports(args.c2c), self_report), args.seed))
    return 0


def merged_reports(paths: list[Path]) -> dict:
    """The multiple-choice results of several reports of one fuser pair: a dataset in several
    reports must hold the same questions, and a row in several (the receiver) the same results."""
    merged: dict = {"mc_likelihood": {}}
    for path in paths:
        for dataset, measured in json.loads(path.read_text()).get("mc_likelihood", {}).items():
            into = merged["mc_likelihood"].setdefault(dataset, {"ids": measured["ids"], "rows": {}})
            if into["ids"] != measured["ids"]:
                raise SystemExit(f"{dataset}: {path} scored other questions than the reports before it")
            for name, row in measured["rows"].items():
                if name in into["rows"] and into["rows"][name]["per_question"] != row["per_question"]:
                    raise SystemExit(f"{dataset}: the row {name} differs between {path} and a report before it")
                into["rows"][name] = row
    return merged


if __name__ == "__main__":
    raise SystemExit(main())
