"""The "content or prompt?" section of docs/RESULTS.md (issue 30), from ``bench --swap`` runs.

    python research/content_results.py --table countries=runs/content-countries \
        --table countries=runs/content-gemma-countries ...
    python research/content_results.py ... --write docs/RESULTS.md   # replace the section in the file

The runs are ``bash research/content_tables.sh``'s. Each sample ran on its note and on its swapped
note (``kvviz.data.swaps``: the answer-bearing fact changed); per handoff the table gives its
accuracy, follow rate, keep rate and content share with 95% Wilson intervals, and its follow rate
paired against Skyline's and the receiver alone's (``kvviz.studies.bench.content``). Below each
dataset: the issue's targets on it, met or missed, read from the same rows (Skyline follows at least
0.8 of its accuracy; the receiver alone, which never reads the note, answers the same on both).

The section sits between ``<!-- content-table:start -->`` and ``<!-- content-table:end -->``; the
RESULTS.md writer (kvviz.studies.bench.report, KEPT) keeps it when the rest is regenerated.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvviz.data.metrics import normalize_answer  # noqa: E402
from kvviz.studies.bench.content import content_markdown  # noqa: E402
from kvviz.studies.bench.report import section_command, section_marks  # noqa: E402

START, END = section_marks("content-table")
COMMAND = "bash research/content_tables.sh"
DATASET_NAMES = {"countries": "Countries", "recall": "recall (held out)", "hotpotqa": "HotpotQA (dev, distractor)"}


def read_run(folder: Path) -> tuple[dict, list[dict], list[dict]]:
    """(config, content entries, rows) of one bench --swap folder."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    entries = json.loads((folder / "content.json").read_text(encoding="utf-8"))
    with open(folder / "rows.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return config, entries, rows


def receiver_changed(rows: list[dict]) -> tuple[int, int]:
    """(answers the swap changed, answers judged) for the receiver alone: it never reads the note,
    so its prompt is the same on both and every answer should be too."""
    judged = [r for r in rows if r["variant"] == "receiver" and r.get("swap_outcome")]
    changed = sum(normalize_answer(r["answer"]) != normalize_answer(r["swap_answer"]) for r in judged)
    return changed, len(judged)


def targets(entries: list[dict], rows: list[dict]) -> list[str]:
    by = {entry["variant"]: entry for entry in entries}
    out = []
    if "skyline" in by:
        accuracy, follow = by["skyline"]["accuracy"]["rate"], by["skyline"]["follow"]["rate"]
        ratio = follow / accuracy if accuracy else float("nan")
        out.append(f"- Skyline follows the swap at {follow:.2f} against {accuracy:.2f} right on the notes: {ratio:.2f} of its "
                   f"accuracy (target >= 0.8: **{'met' if ratio >= 0.8 else 'missed'}**; a swap set the reader of the "
                   "note cannot answer would say little).")
    if "receiver" in by:
        changed, judged = receiver_changed(rows)
        follow = by["receiver"]["follow"]["rate"]
        out.append(f"- The receiver alone's answer changed on {changed} of {judged} swapped notes (target 0: "
                   f"**{'met' if changed == 0 else 'missed'}**): its follow rate, {follow:.2f}, is how often its one "
                   "answer happens to be the swapped one, chance by construction.")
    return out


def dataset_section(name: str, folders: list[Path]) -> str:
    parts = [f"### {DATASET_NAMES.get(name, name)}", ""]
    for folder in folders:
        config, entries, rows = read_run(folder)
        swap = config.get("swap") or {}
        parts.append(f"Pair `{config['pair']}`, {swap.get('samples', '?')} samples with a swapped note "
                     f"(`--limit {config.get('limit')}`, seed {config.get('seed')}; {swap.get('rule', '')}).")
        parts.append("")
        parts.append(content_markdown(entries).split("\n", 2)[2])  # the table, without its intro line
        parts += targets(entries, rows)
        parts.append("")
    return "\n".join(parts)


def section(tables: list[tuple[str, Path]]) -> str:
    parts = [START, "## Content or prompt? Swapped notes (issue 30)", "",
             "A right answer is evidence that the note's content crossed only when the answer changes with the note. "
             "Every sample also ran on its swapped note, the same note with its answer-bearing fact changed "
             "(`kvviz.data.swaps`, seeded: on Countries the person's landmark becomes another record's, in another "
             "country; on recall the asked value becomes another of its kind; on HotpotQA the gold answer, where a "
             "supporting sentence holds it word for word, becomes another question's gold of the same type). "
             "*Followed*: on the swapped note it gives the swapped answer and not the old one; *kept*: the old one "
             "and not the swapped one; *content share*: of its right answers on the notes, the share that followed. "
             "Verdicts are the page's (`kvviz.data.metrics.verdict`). Intervals are 95% Wilson; the paired columns "
             "compare follow rates on the same samples (McNemar's exact test). Greedy, 24 new tokens, one torch "
             f"thread. Rerun with `{COMMAND}`; the section is kept when the rest of this file is regenerated.", ""]
    grouped: dict[str, list[Path]] = {}
    for name, folder in tables:
        grouped.setdefault(name, []).append(folder)
    for name, folders in grouped.items():
        parts.append(dataset_section(name, folders))
    parts.append(END)
    return "\n".join(parts) + "\n"


def main() -> int:
    return section_command(__doc__, section, "content-table", "content-or-prompt", metavar="DATASET=FOLDER",
                           table_help="a bench --swap folder (several per dataset: one table each, under one heading)")


if __name__ == "__main__":
    raise SystemExit(main())
