"""How often the page's verdict agrees with a careful reader: ``kvviz.data.metrics.verdict`` on the
hand-labelled answers of tests/data/verdict_labels.jsonl.

    python scripts/verdict_agreement.py                 # agreement, confusion counts, every disagreement
    python scripts/verdict_agreement.py --labels FILE   # another labels file of the same shape

Each line of the labels file is one answer: ``answer``, ``gold`` (the accepted answers), ``label``
(what a careful teacher marks it: "right", "wrong", or "none" for an empty answer), ``source``
(where the answer comes from: "preset KEY COLUMN", "bench DATASET SAMPLE VARIANT", or "written" for
the edge cases written by hand) and an optional ``note`` (the reasoning behind a label that is not
obvious). The real answers are every applicable answer of assets/precomputed/presets.json (each
preset's results and its stored runs, against the preset's expected answers) and the rows of
``python -m kvviz bench --pair embedded --dataset D --handoffs receiver,skyline,text,kvcomm --limit 30
--seed 0 --threads 1`` for D = countries, hotpotqa and tipsheets (a Tip Sheets gold is the company's
name; answers that are a bare letter are left out: they answer the lettered prompt the bench adds,
which the page never shows). Each distinct (answer, gold) pair is one line, with the first place it
came from. tests/unit/test_verdict.py requires the agreement this script prints to stay >= 0.97.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvviz.data.metrics import verdict  # noqa: E402

LABELS = ROOT / "tests" / "data" / "verdict_labels.jsonl"
LABEL_KINDS = ("right", "wrong", "none")


def load_labels(path: Path = LABELS) -> list[dict]:
    """The labelled answers, each checked for its fields."""
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not (isinstance(row.get("answer"), str) and isinstance(row.get("gold"), list) and row.get("gold")
                and row.get("label") in LABEL_KINDS and isinstance(row.get("source"), str)):
            raise ValueError(f"{path}:{number}: needs answer, gold (a list), label ({'/'.join(LABEL_KINDS)}) and source")
        rows.append(row)
    return rows


def source_kind(source: str) -> str:
    """"preset", "bench DATASET" or "written": the part of a source the report groups by."""
    words = source.split()
    return " ".join(words[:2]) if words and words[0] == "bench" else (words[0] if words else "")


def measure(rows: list[dict], rule=verdict) -> dict:
    """The rule's marks against the labels: agreement overall and per source kind, the confusion
    counts (label, mark) and the disagreements (each row with its ``mark``)."""
    kinds: dict[str, list[int]] = {}
    confusion: Counter = Counter()
    disagreements = []
    for row in rows:
        mark = rule(row["answer"], row["gold"])
        confusion[(row["label"], mark)] += 1
        tally = kinds.setdefault(source_kind(row["source"]), [0, 0])
        tally[0] += int(mark == row["label"])
        tally[1] += 1
        if mark != row["label"]:
            disagreements.append({**row, "mark": mark})
    agree = sum(tally[0] for tally in kinds.values())
    return {"n": len(rows), "agree": agree, "agreement": agree / len(rows) if rows else float("nan"),
            "by_kind": {kind: tuple(tally) for kind, tally in kinds.items()},
            "confusion": confusion, "disagreements": disagreements}


def disagreement_line(row: dict) -> str:
    note = f"  ({row['note']})" if row.get("note") else ""
    return (f"- [{row['source']}] {row['answer']!r} against {row['gold']!r}: "
            f"labelled {row['label']}, marked {row['mark']}{note}")


def report(measured: dict) -> str:
    """The agreement, per source kind, the confusion counts and every disagreement, as text."""
    lines = [f"agreement: {measured['agree']}/{measured['n']} = {measured['agreement']:.3f}", "", "by source:"]
    real = [tally for kind, tally in measured["by_kind"].items() if kind != "written"]
    if real:
        agree, n = sum(t[0] for t in real), sum(t[1] for t in real)
        lines.append(f"  real outputs      {agree:>3}/{n:<3} = {agree / n:.3f}")
    for kind, (agree, n) in sorted(measured["by_kind"].items()):
        lines.append(f"  {kind:<17} {agree:>3}/{n:<3} = {agree / n:.3f}")
    marks = sorted({mark for _, mark in measured["confusion"]}, key=lambda m: (m is None, str(m)))
    lines += ["", "confusion (rows: label, columns: the rule's mark):",
              "  " + " " * 8 + "".join(f"{str(mark):>8}" for mark in marks)]
    for label in LABEL_KINDS:
        lines.append(f"  {label:<8}" + "".join(f"{measured['confusion'][(label, mark)]:>8}" for mark in marks))
    lines += ["", f"disagreements ({len(measured['disagreements'])}):"]
    lines += [disagreement_line(row) for row in measured["disagreements"]] or ["  none"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--labels", type=Path, default=LABELS, help="a labels file (JSON lines)")
    args = parser.parse_args(argv)
    print(report(measure(load_labels(args.labels))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
