"""The "inserted contradiction" section of docs/RESULTS.md (issue 43), from ``bench --contradict`` runs,
beside the swap's section (issue 30, ``content_results.py``).

    python research/contradiction_results.py --table countries=runs/contra-countries \\
        --table countries=runs/contra-gemma-countries --table hotpotqa=runs/contra-hotpotqa ...
    python research/contradiction_results.py ... --write docs/RESULTS.md   # replace the section in the file

Each sample ran on its note and on the note with one sentence stating the swap's other value
inserted right after the sentence that states the answer (``kvviz.data.contradictions``); per
handoff the table gives its accuracy beside its control's, which answer it gives on the
contradicted note (95% Wilson), the mean probability of the gold and of the counter answer's first
content token on the original and the contradicted note, and its counter rate paired against
Skyline's and the receiver alone's (``kvviz.studies.bench.contradiction``). Below each dataset: what
the receiver alone (which never reads the note) and Skyline did, read from the same rows.

The section sits between ``<!-- contradiction-table:start -->`` and ``<!-- contradiction-table:end -->``;
the RESULTS.md writer (kvviz.studies.bench.report, KEPT) keeps it when the rest is regenerated.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvviz.studies.bench.contradiction import contradiction_markdown, contradiction_summary  # noqa: E402
from kvviz.studies.bench.report import section_command, section_marks  # noqa: E402
from kvviz.studies.bench.rows import read_rows  # noqa: E402

START, END = section_marks("contradiction-table")
COMMAND = "bash research/contradiction_tables.sh"
DATASET_NAMES = {"countries": "Countries", "hotpotqa": "HotpotQA (dev, distractor)"}


def read_runs(folders: list[Path]) -> tuple[list[dict], list[dict]]:
    """(configs, contradiction entries) of one dataset's bench --contradict folders, their rows read as
    one table: the same samples (dataset, seed, limit) on pairs with the same receiver, so a handoff that
    only runs on another pair (CIPHER on embedded-gemma) is paired with the embedded pair's Skyline and
    receiver alone, sample by sample."""
    configs = [json.loads((folder / "config.json").read_text(encoding="utf-8")) for folder in folders]
    if len({(c["dataset"], c["seed"]) for c in configs}) > 1:  # a smaller --limit takes the first samples of a larger one
        raise SystemExit(f"{[str(f) for f in folders]}: one table needs one dataset and seed")
    tables = [read_rows(folder) for folder in folders]
    for config, table in zip(configs, tables):  # a stopped (or smaller) run: the samples it has rows for
        config["measured"] = int(table["sample_id"].nunique()) if len(table) else 0
    rows = pd.concat(tables, ignore_index=True)
    order = [variant for config in configs for variant in config.get("variants", [])]
    return configs, contradiction_summary(rows, list(dict.fromkeys(order)))


def facts(entries: list[dict]) -> list[str]:
    by = {entry["variant"]: entry for entry in entries}
    out = []
    if "receiver" in by:
        receiver = by["receiver"]
        out.append(f"- The receiver alone never reads the note: it gives the inserted value on {receiver['counter']['hits']} "
                   f"of {receiver['n']} (chance, as with the swap).")
    if "skyline" in by:
        sky = by["skyline"]
        out.append(f"- Skyline, reading the contradicted note, gives the inserted value on {sky['counter']['hits']}/{sky['n']}, "
                   f"the first-stated one on {sky['gold']['hits']}/{sky['n']}, both on {sky['both']['hits']}.")
    return out


def dataset_section(name: str, folders: list[Path]) -> str:
    configs, entries = read_runs(folders)
    first = configs[0]
    made = first.get("contradict") or {}
    pairs = ", ".join(f"`{c['pair']}` ({', '.join(c.get('variants', []))}; `--limit {c.get('limit')}`, rows for "
                      f"{c['measured']} samples; numeric mode {c.get('numerics', 'not recorded')})" for c in configs)
    parts = [f"### {DATASET_NAMES.get(name, name)}", "",
             f"{made.get('samples', '?')} samples with a contradiction in the first {first.get('limit')} (seed {first.get('seed')}, "
             f"{first.get('max_new_tokens')} new tokens; {made.get('rule', '')}); runs {pairs}. A run stopped before its "
             "last sample has rows for fewer: each row's n says how many it measured.", "",
             contradiction_markdown(entries).split("\n", 2)[2]]  # the table, without its intro line
    return "\n".join(parts + facts(entries) + [""])


def section(tables: list[tuple[str, Path]]) -> str:
    parts = [START, "## Content or prompt? An inserted contradiction (issue 43)", "",
             "The second counterfactual, beside the swap above: the note keeps its fact and gets one more sentence, "
             "stating the swap's other value for the same fact, right after the sentence that states it "
             "(`kvviz.data.contradictions`; on Countries \"Peggy is at the Gevangenpoort. Peggy is at the Picote Dam.\"). "
             "*Gold*: the answer gives the value stated first; *counter*: the inserted one (by the page's verdict rule). "
             "P(gold) and P(counter): the mean probability of each answer's first content token where the receiver chooses "
             "its answer's first token (the last layer of the run's logit lens, `kvviz.engine.contradiction`), on the "
             "original note and on the contradicted one, over the samples whose two answers start with different tokens; "
             "intervals are 95% Wilson (outcomes) and a seeded bootstrap (means); the paired columns compare counter rates "
             "(McNemar's exact test). *it / its control*: accuracy on the original note beside the handoff's control's. "
             f"Greedy, 12 new tokens, one torch thread, on a shared machine. Rerun with `{COMMAND}`; the section is kept "
             "when the rest of this file is regenerated.", ""]
    grouped: dict[str, list[Path]] = {}
    for name, folder in tables:
        grouped.setdefault(name, []).append(folder)
    for name, folders in grouped.items():
        parts.append(dataset_section(name, folders))
    parts.append(END)
    return "\n".join(parts) + "\n"


def main() -> int:
    return section_command(__doc__, section, "contradiction-table", "inserted-contradiction", metavar="DATASET=FOLDER",
                           table_help="a bench --contradict folder (several per dataset: one table each, under one heading)")


if __name__ == "__main__":
    raise SystemExit(main())
