"""Content or prompt? The benchmark's swap arm (``bench --swap``): each sample also runs on its
swapped note (the answer-bearing fact changed, ``kvviz.data.swaps``), and per variant:

* **accuracy**: right on the original note (the page's verdict rule);
* **follow rate**: on the swapped note it gives the swapped answer (and not the old one);
* **keep rate**: on the swapped note it still gives the old answer;
* **content share**: of its right answers, the share that also followed the swap: how much of what
  it got right the note's content carried (a right answer that did not follow was a guess, the
  prompt's layout, or the question);

each with its 95% Wilson interval, and the follow rate paired against Skyline's and the receiver
alone's on the same samples (McNemar's exact test): a handoff whose follow rate is the receiver
alone's carried no content; one that matches Skyline's carried what reading the note carries. Beside
its accuracy, in one cell, its control's (``Handoff.control``: the same method without this note's
content; the receiver alone for text, Skyline and the one-vector methods), as the field reports
matched against deranged.
"""

from __future__ import annotations

import pandas as pd

from kvviz.data import format_p, paired_mcnemar, wilson_interval
from kvviz.data.swaps import Swap, swap_record
from kvviz.handoffs import registry

REFERENCES = ("skyline", "receiver")  # what each variant's follow rate is paired against


def swap_columns(record, result, swapped, swap: Swap) -> dict:
    """A row's swap columns: what changed, the swapped gold, the answer on the swapped note, the
    outcome, and 0/1 for right (on the original note), followed and kept ("" where not judged)."""
    judged = swap_record(result.to_dict(), swapped.to_dict(), swap, record.answers)
    outcome = judged["outcome"]
    return {
        "swap_changed": swap.changed,
        "swap_gold": " | ".join(swap.answers),
        "swap_answer": judged["answer"],
        "swap_outcome": outcome or "",
        "right": "" if judged["right"] is None else int(judged["right"]),
        "followed": "" if outcome is None else int(outcome == "followed"),
        "kept": "" if outcome is None else int(outcome == "kept"),
    }


def paired_with_references(outcomes: dict[str, dict[str, int]], name: str, by_handoff: dict[str, str]) -> dict:
    """One variant's 0/1 outcomes (per sample) paired with each of ``REFERENCES`` that ran (McNemar)."""
    return {reference: paired_mcnemar(outcomes, name, other) for reference in REFERENCES
            if (other := by_handoff.get(reference)) is not None and other != name}


def rate_entry(hits: int, n: int) -> dict:
    """A count with its share and 95% Wilson interval (None where n is 0)."""
    low, high = wilson_interval(hits, n) if n else (None, None)
    return {"rate": hits / n if n else None, "low": low, "high": high, "hits": hits, "n": n}


def _judged(group: pd.DataFrame) -> pd.DataFrame:
    judged = group[group["swap_outcome"].astype(str) != ""]
    return judged.assign(**{column: pd.to_numeric(judged[column], errors="coerce").fillna(0).astype(int)
                            for column in ("right", "followed", "kept")})


def control_variants(rows: pd.DataFrame) -> dict[str, str]:
    """variant -> the variant of its handoff's control that ran in the same table (its first one)."""
    by_handoff: dict[str, str] = {}
    for variant, handoff in zip(rows["variant"], rows["handoff"]):
        by_handoff.setdefault(handoff, variant)
    out = {}
    for variant, handoff in zip(rows["variant"], rows["handoff"]):
        control = by_handoff.get(registry.control_of(handoff))
        if control and control != variant:
            out[variant] = control
    return out


def with_controls(entries: list[dict], controls: dict[str, str], key: str) -> list[dict]:
    """Each entry with its control's ``key`` rate beside its own (``entry["control"]``)."""
    by_variant = {entry["variant"]: entry for entry in entries}
    for entry in entries:
        other = by_variant.get(controls.get(entry["variant"], ""))
        entry["control"] = None if other is None else {"variant": other["variant"], key: other[key]}
    return entries


def content_summary(rows: pd.DataFrame, order: list[str] | None = None) -> list[dict]:
    """One entry per variant with a swap arm: accuracy, follow rate, keep rate, content share (each
    a ``_rate``), and the follow rate paired against each reference that ran (``paired_mcnemar``)."""
    rows = rows.fillna("")
    if "swap_outcome" not in rows or not (rows["swap_outcome"].astype(str) != "").any():
        return []
    groups = {name: _judged(group) for name, group in rows.groupby("variant", sort=False)}
    groups = {name: group for name, group in groups.items() if not group.empty}
    follows = {name: dict(zip(group["sample_id"].astype(str), group["followed"])) for name, group in groups.items()}
    by_handoff = {rows.loc[rows["variant"] == name, "handoff"].iloc[0]: name for name in groups}
    names = [name for name in (order or []) if name in groups] + sorted(name for name in groups if name not in (order or []))
    entries = []
    for name in names:
        group = groups[name]
        right = group[group["right"] == 1]
        entry = {
            "variant": name, "n": len(group),
            "accuracy": rate_entry(int(group["right"].sum()), len(group)),
            "follow": rate_entry(int(group["followed"].sum()), len(group)),
            "keep": rate_entry(int(group["kept"].sum()), len(group)),
            "content_share": rate_entry(int(right["followed"].sum()), len(right)),
            "paired": paired_with_references(follows, name, by_handoff),
        }
        entries.append(entry)
    return with_controls(entries, control_variants(rows), "accuracy")


def rate_cell(rate: dict) -> str:
    """"0.31 [0.23, 0.41] (31/100)"."""
    if rate["rate"] is None:
        return "n/a"
    return f"{rate['rate']:.2f} [{rate['low']:.2f}, {rate['high']:.2f}] ({rate['hits']}/{rate['n']})"


def matched_cell(entry: dict, key: str) -> str:
    """"its rate / its control's" (the control's name), or its rate alone when no control ran."""
    own, control = entry[key], entry.get("control")
    if own["rate"] is None:
        return "n/a"
    if not control or control[key]["rate"] is None:
        return f"{own['rate']:.2f} / —"
    return f"{own['rate']:.2f} / {control[key]['rate']:.2f} ({control['variant']})"


def paired_cell(entry: dict, reference: str) -> str:
    """A paired comparison against ``reference`` (its two rates and McNemar's p), or a dash."""
    paired = entry["paired"].get(reference)
    if paired is None:
        return "—"
    return f"{paired['acc_first']:.2f} vs {paired['acc_second']:.2f}, p = {format_p(paired['p'])}"


def content_markdown(entries: list[dict], title: str = "") -> str:
    """The content table: one row per variant, each rate with its interval and counts, the follow
    rate against Skyline's and the receiver alone's (McNemar p)."""
    if not entries:
        return ""
    header = ["handoff", "n", "right: it / its control", "right (original note)", "followed the swap", "kept the old answer",
              "content share (followed, of the right)", "follow vs Skyline", "follow vs receiver alone"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for entry in entries:
        cells = [entry["variant"], str(entry["n"]), matched_cell(entry, "accuracy"), rate_cell(entry["accuracy"]),
                 rate_cell(entry["follow"]), rate_cell(entry["keep"]),
                 rate_cell(entry["content_share"]), paired_cell(entry, "skyline"), paired_cell(entry, "receiver")]
        lines.append("| " + " | ".join(cells) + " |")
    intro = ("Content or prompt? Each sample also ran on its swapped note (the answer-bearing fact changed); "
             "intervals are 95% Wilson, the paired columns compare follow rates on the same samples (McNemar's exact test).")
    return "\n".join(([title, ""] if title else []) + [intro, ""] + lines) + "\n"
