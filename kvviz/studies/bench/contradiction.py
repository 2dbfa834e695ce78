"""The benchmark's second counterfactual (``bench --swap --contradict``): each sample also runs on its
note with one contradicting sentence inserted after the sentence that states the answer
(``kvviz.data.contradictions``, the swap's other value), and per variant:

* **which answer** it gives on the contradicted note: the value stated first (*gold*), the inserted
  one (*counter*), both, or neither (the page's verdict rule), each with its 95% Wilson interval;
* **P(gold)** and **P(counter)**: the mean probability of each answer's first content token where
  the receiver chooses the answer's first token (``kvviz.engine.contradiction``), on the original
  note and on the contradicted one, each mean with a seeded bootstrap 95% interval; samples whose
  two answers start with the same token are left out of these means (they cannot tell them apart);
* its counter rate paired against Skyline's and the receiver alone's (McNemar's exact test): a
  handoff that reads the note's text as Skyline does takes up the inserted sentence as often;
* beside it, in one cell, its accuracy on the original note and its control's (``content``'s cell).
"""

from __future__ import annotations

import pandas as pd

from kvviz.data import verdict
from kvviz.data.contradictions import OUTCOMES
from kvviz.data.stats import bootstrap_ratio
from kvviz.engine.contradiction import contradiction_record
from kvviz.studies.bench.content import (
    control_variants, matched_cell, paired_cell, paired_with_references, rate_cell, rate_entry, with_controls,
)

PROBABILITIES = ("p_gold_clean", "p_gold", "p_counter_clean", "p_counter")


def contradiction_columns(record, result, contradicted, contradiction) -> dict:
    """A row's contradiction columns ("" where not measured)."""
    judged = contradiction_record(result, contradicted, contradiction, record.answers)

    def number(value):
        return "" if value is None else round(float(value), 6)

    return {
        "contra_sentence": contradiction.sentence,
        "contra_gold": " | ".join(contradiction.answers),
        "contra_answer": judged["answer"],
        "contra_outcome": judged["outcome"] or "",
        **{f"contra_{name}": number(judged[name]) for name in PROBABILITIES},
        "contra_same_first_token": int(judged["same_first_token"]),
    }


def _mean(values: list[float], seed: int = 0) -> dict:
    if not values:
        return {"mean": None, "low": None, "high": None, "n": 0}
    low, high = bootstrap_ratio(values, [1] * len(values), seed)
    return {"mean": sum(values) / len(values), "low": low, "high": high, "n": len(values)}


def contradiction_summary(rows: pd.DataFrame, order: list[str] | None = None, seed: int = 0) -> list[dict]:
    """One entry per variant with a contradiction arm: each outcome's rate, the mean probabilities,
    and the counter rate paired against each reference that ran."""
    rows = rows.fillna("")
    if "contra_outcome" not in rows or not (rows["contra_outcome"].astype(str) != "").any():
        return []
    groups = {name: group[group["contra_outcome"].astype(str) != ""] for name, group in rows.groupby("variant", sort=False)}
    groups = {name: group for name, group in groups.items() if not group.empty}
    counters = {name: dict(zip(group["sample_id"].astype(str), (group["contra_outcome"] == "counter").astype(int)))
                for name, group in groups.items()}
    by_handoff = {rows.loc[rows["variant"] == name, "handoff"].iloc[0]: name for name in groups}
    names = [name for name in (order or []) if name in groups] + sorted(name for name in groups if name not in (order or []))
    entries = []
    for name in names:
        group = groups[name]
        distinct = group[group["contra_same_first_token"].astype(str) != "1"]
        right = sum(verdict(answer, gold.split(" | ")) == "right" for answer, gold in zip(group["answer"], group["gold"]))
        entry = {"variant": name, "n": len(group), "distinct_first_tokens": len(distinct), "accuracy": rate_entry(right, len(group)),
                 **{outcome: rate_entry(int((group["contra_outcome"] == outcome).sum()), len(group)) for outcome in OUTCOMES},
                 "paired": paired_with_references(counters, name, by_handoff)}
        for column in PROBABILITIES:
            values = pd.to_numeric(distinct[f"contra_{column}"], errors="coerce").dropna().tolist()
            entry[column] = _mean(values, seed)
        entries.append(entry)
    return with_controls(entries, control_variants(rows), "accuracy")


def _shift(before: dict, after: dict) -> str:
    if before["mean"] is None or after["mean"] is None:
        return "n/a"
    return f"{before['mean']:.3f} → {after['mean']:.3f} [{after['low']:.3f}, {after['high']:.3f}]"


def contradiction_markdown(entries: list[dict], title: str = "") -> str:
    """The contradiction table: one row per variant."""
    if not entries:
        return ""
    header = ["handoff", "n", "right on the original note: it / its control", "gives the gold (stated first)", "gives the counter (inserted)", "both", "neither",
              "P(gold): original → contradicted", "P(counter): original → contradicted", "counter vs Skyline",
              "counter vs receiver alone"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for entry in entries:
        cells = [entry["variant"], str(entry["n"]), matched_cell(entry, "accuracy"), *(rate_cell(entry[o]) for o in OUTCOMES),
                 _shift(entry["p_gold_clean"], entry["p_gold"]), _shift(entry["p_counter_clean"], entry["p_counter"]),
                 paired_cell(entry, "skyline"), paired_cell(entry, "receiver")]
        lines.append("| " + " | ".join(cells) + " |")
    distinct = min((entry["distinct_first_tokens"] for entry in entries), default=0)
    intro = ("Inserted contradiction: each sample also ran on its note with one sentence stating the swap's other value "
             "inserted after the sentence that states the answer. Outcomes by the page's verdict rule (95% Wilson); "
             "P(·): the mean probability of that answer's first content token where the receiver chooses its answer's "
             f"first token (seeded bootstrap 95% interval of the contradicted mean; over the {distinct} or more samples whose "
             "two answers start with different tokens); the paired columns compare counter rates (McNemar's exact test).")
    return "\n".join(([title, ""] if title else []) + [intro, ""] + lines) + "\n"
