"""What ``eval-translator`` reports of one held-out set, from each row's answers (``translator_rows``).

Per set: each row's answer rate (contained, 95% Wilson) and mean gold NLL; **matched / deranged**, one
cell per reader of the note: the answer with the record's own note beside the answer with another
record's note (the translator and its control; Skyline and Skyline reading the other note); the share
of the receiver-to-Skyline NLL gap the translator closes and its answer rate against Skyline's; the
communication gain NLL(control) - NLL(translator) with a bootstrap interval and the sign test of
which note scores the gold lower; **harm**, each reader against the receiver alone on the same
records (the difference in answer rate with a bootstrap interval and McNemar's test: on the
``unneeded`` set the translator itself, whose note does not hold the answer; on every set the
control, which reads another record's note); how often the control answers with the other note's
answer; follow rates on swapped facts; on who-is-where the binding breakdown. The statistics are
``kvviz.data.stats``'s.
"""

from __future__ import annotations

from kvviz.data import contains_answer, whereabouts, wilson_interval
from kvviz.data.stats import bootstrap_ratio, mcnemar_exact, paired_comparison
from kvviz.data.swaps import swap_outcome

SWAP_ROWS = ("skyline", "translator")  # the rows that also read the swapped note
FOLLOW_ROWS = ("receiver", "control", "skyline", "translator")  # follow rates reported (the first two: the floor)
MATCHED = {"translator": "control", "skyline": "skyline_control"}  # a reader of the note -> it with another record's note
HARM_ROWS = ("translator", "control", "skyline_control")  # compared with the receiver alone, record by record


def rate(hits: int, n: int) -> dict:
    """A count with its share and 95% Wilson interval."""
    low, high = wilson_interval(hits, n)
    return {"contains": hits, "n": n, "rate": hits / n if n else None, "ci95": [low, high]}


def right(results, records) -> list[int]:
    """0/1 per record: the answer contains a gold answer."""
    return [int(contains_answer(text, record.answers)) for (text, _, _), record in zip(results, records)]


def matched_deranged(table: dict) -> dict:
    """Per reader of the note, its answer rate with the record's own note and with another record's."""
    return {row: {"matched": table[row], "deranged": table[other]} for row, other in MATCHED.items()
            if row in table and other in table}


def harm(rows: dict, records, seed: int) -> dict:
    """Each of ``HARM_ROWS`` against the receiver alone on the same records: answer rate difference
    (row - receiver) with its bootstrap 95% interval and McNemar's exact test; ``no_worse``: the
    interval reaches 0 or lies above it."""
    if "receiver" not in rows:
        return {}
    alone = right(rows["receiver"], records)
    out = {}
    for row in HARM_ROWS:
        if row in rows:
            compared = paired_comparison(right(rows[row], records), alone, seed)
            out[row] = {**compared, "no_worse": compared["ci95"][1] >= 0}
    return out


def summarise(rows: dict, records, seed: int) -> dict:
    """The set's rows, matched / deranged, gap, gain, harm and the control against the receiver."""
    table = {}
    for name, results in rows.items():
        tokens = sum(n for _, _, n in results)
        table[name] = {**rate(sum(right(results, records)), len(results)), "nll": sum(s for _, s, _ in results) / tokens}
    out = {"rows": table, "matched_deranged": matched_deranged(table), "harm": harm(rows, records, seed)}
    if {"translator", "receiver", "skyline"} <= set(rows):
        receiver, skyline, translated = (table[n]["nll"] for n in ("receiver", "skyline", "translator"))
        gap = receiver - skyline
        out["nll_gap_closed"] = (receiver - translated) / gap if gap > 0 else None
        out["answer_rate_vs_skyline"] = table["translator"]["rate"] / table["skyline"]["rate"] if table["skyline"]["rate"] else None
        rate_gap = table["skyline"]["rate"] - table["receiver"]["rate"]
        out["answer_gap_closed"] = (table["translator"]["rate"] - table["receiver"]["rate"]) / rate_gap if rate_gap > 0 else None
    if "control" in rows and "translator" in rows:
        diffs = [c[1] - t[1] for c, t in zip(rows["control"], rows["translator"])]
        tokens = [t[2] for t in rows["translator"]]
        wins, losses = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
        out["communication"] = {
            "gain": sum(diffs) / sum(tokens), "ci95": bootstrap_ratio(diffs, tokens, seed),
            "right_context_lower_nll": wins, "of": len(diffs), "sign_test_p": mcnemar_exact(wins, losses),
        }
    if "control" in rows and "receiver" in rows:
        tokens = [r[2] for r in rows["receiver"]]
        control_rate, (low, high) = table["control"]["rate"], table["receiver"]["ci95"]
        out["control_within_receiver_interval"] = low <= control_rate <= high
        control_vs_receiver = [c[1] - r[1] for c, r in zip(rows["control"], rows["receiver"])]
        out["control_minus_receiver_nll"] = {"value": sum(control_vs_receiver) / sum(tokens),
                                              "ci95": bootstrap_ratio(control_vs_receiver, tokens, seed)}
    return out


def swap_summary(rows: dict, swapped: dict, records, swaps: dict) -> dict:
    """Follow rates on the swapped notes: per row, how often its answer is the swapped answer and not
    the original. Skyline and the translator read the swapped note (``swapped``); the receiver alone
    and the control never do, so their answers (``rows``) follow only by chance."""
    held = [i for i, record in enumerate(records) if record.id in swaps]
    if not held:
        return {}
    out = {"records": len(held), "rows": {}}
    for row in FOLLOW_ROWS:
        source = swapped.get(row) if row in SWAP_ROWS else rows.get(row)
        if not source:
            continue
        outcomes = [swap_outcome(source[i][0], records[i].answers, swaps[records[i].id].answers) for i in held]
        entry = rate(sum(o == "followed" for o in outcomes), len(held))
        entry["kept"] = sum(o == "kept" for o in outcomes)
        if row in SWAP_ROWS:
            entry["nll"] = sum(source[i][1] for i in held) / sum(source[i][2] for i in held)
        out["rows"][row] = {"followed": entry.pop("contains"), **entry}
    rows_out = out["rows"]
    if "translator" in rows_out and "skyline" in rows_out and rows_out["skyline"]["rate"]:
        out["follow_vs_skyline"] = rows_out["translator"]["rate"] / rows_out["skyline"]["rate"]
    return out


def people_summary(rows: dict, records) -> dict:
    """Who-is-where by the number of people in the note (two or three: the binding test): each row's
    answer rate, and how often it names another person's country instead, or the landmark itself."""
    out = {}
    groups = sorted({record.meta.get("people") for record in records if record.meta.get("people")})
    for people in groups + ["2-3"]:
        index = [i for i, r in enumerate(records) if (r.meta.get("people", 0) > 1 if people == "2-3" else r.meta.get("people") == people)]
        if not index:
            continue
        entry = {}
        for row, results in rows.items():
            hits = sum(contains_answer(results[i][0], records[i].answers) for i in index)
            other = sum(not contains_answer(results[i][0], records[i].answers) and any(
                contains_answer(results[i][0], whereabouts.answers_for(o["country"])) for o in records[i].meta.get("others", []))
                for i in index)
            place = sum(contains_answer(results[i][0], [records[i].meta["landmark"].removeprefix("the ")]) for i in index)
            entry[row] = {**rate(hits, len(index)), "other_persons_country": other, "names_the_place": place}
        out[str(people)] = entry
    return out


def control_follows_other(rows: dict, records, partner: list[int]) -> dict | None:
    """How often the control (the translator fed another record's note) answers with *that* record's
    answer and not its own: a control below the receiver alone is then the other note crossing, as
    Skyline reading the wrong note would (``skyline_control``), not the channel breaking the receiver."""
    out = {}
    for row in ("control", "skyline_control"):
        if row in rows:
            out[row] = sum(contains_answer(text, records[partner[i]].answers) and not contains_answer(text, records[i].answers)
                           for i, (text, _, _) in enumerate(rows[row]))
    if "control" not in out:
        return None
    return {"names_the_other_notes_answer": out["control"], "of": len(records),
            **({"skyline_names_the_other_notes_answer": out["skyline_control"]} if "skyline_control" in out else {})}


def measured_summary(report: dict) -> dict:
    """The numbers kept beside a shipped translator (``measured.json``; the handoff's note reads
    ``communication_gain`` and each set's rows and swap): per set the rows' answer rates and NLL,
    matched / deranged, the gap closed, the gain, harm, the follow rates and the who-is-where
    breakdown; the presets' answers; which draw it was."""
    keys = ("nll_gap_closed", "answer_rate_vs_skyline", "answer_gap_closed", "communication", "control_within_receiver_interval",
            "control_minus_receiver_nll", "control_other_note", "checks", "swap", "by_people", "harm")
    sets = {}
    for name, summary in report.items():
        if not isinstance(summary, dict) or "rows" not in summary:
            continue
        rows = {row: {k: v[k] for k in ("contains", "n", "ci95", "nll")} for row, v in summary["rows"].items()}
        sets[name] = {"rows": rows, "matched_deranged": {row: {side: rows[cell_row] for side, cell_row in
                                                               (("matched", row), ("deranged", MATCHED[row]))}
                                                         for row in summary.get("matched_deranged", {})},
                      **{k: summary[k] for k in keys if k in summary}}
    first = next((n for n in ("recall", "countries", "whereabouts") if "communication" in sets.get(n, {})), None)
    out = {"command": report.get("command"), "draw": report.get("draw"), "sets": sets}
    if report.get("presets"):
        out["presets"] = report["presets"]
    if first:
        c = sets[first]["communication"]
        out["set"] = first
        out["communication_gain"] = {"value": c["gain"], "ci95": c["ci95"], "n": c["of"]}
    return out
