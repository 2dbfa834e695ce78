"""Evaluate a KV translator on held-out private contexts, with its controls as measured rows.

    python -m kvviz eval-translator --pair embedded --recall 100 --countries 100 --whereabouts 120 [--translator DIR] [--json]

Held-out sets (context private to the sharer; names, values and landmarks never in training):
``recall`` (``kvviz.data.recall``'s held-out entities, seed 1, as eval-fuser draws them),
``countries`` (the evaluators' first 100 of KVComm's Countries) and ``whereabouts``
(``kvviz.data.whereabouts``: one to three people per note at held-out well-known landmarks; the
answer is the country, which the note does not say: the receiver's own knowledge must be reached
through the translated KV). For each record every row answers greedily and scores the gold
answer's NLL (nats per token, teacher-forced after the question):

* ``receiver``: the receiver alone on the question;
* ``skyline``: the receiver reads the context itself;
* ``oracle``: the receiver's own KV of the context in the translated slots (equals Skyline: a
  check of the splice);
* ``translator``: the sharer reads the context, the translator's KV is the receiver's prefix;
* ``control``: the translator fed another record's context (a seeded derangement);
* ``closed``: the translator with every gate closed (equals the receiver alone: a check);
* the **swapped fact** (``kvviz.data.swaps``, seeded; ``--no-swap`` leaves it out): Skyline and the
  translator also read the record's note with its answer-bearing fact changed (on who-is-where
  another held-out landmark in a country no one in the note is in), and each row's *follow rate*
  is how often its answer is the swapped one and not the original (the receiver alone and the
  control, which never read the swapped note, follow only by chance: they are the floor).

Reported per set: answer contained (95% Wilson interval), mean gold NLL, the share of the
receiver-to-Skyline NLL gap the translator closes, the communication gain NLL(control) -
NLL(translator) with a seeded bootstrap 95% interval, how often the right context lowers the NLL
against the control (with a two-sided sign test), how often the control answers with the other
record's answer (its note crossing: why a control can fall below the receiver alone), follow rates with Wilson intervals, and on
who-is-where the answer rate by the number of people in the note (two or three: the *binding*
test) with how often an answer names another person's country or the landmark itself. The page's
private presets (``assets/presets.toml``) run too: each preset's note, another preset's note (the
control) and its stored swap.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import tomllib
from pathlib import Path

import torch

from kvviz.core.paths import ASSETS
from kvviz.core.prompts import build_segments
from kvviz.core.results import GenerationSettings
from kvviz.data import contains_answer, load_dataset, recall, whereabouts, wilson_interval
from kvviz.data.stats import bootstrap_ratio, mcnemar_exact
from kvviz.data.record import Record
from kvviz.data.swaps import SWAPPERS, replace_fact, swap_outcome, swaps_for
from kvviz.engine.runner import load_pair
from kvviz.handoffs.translate import align as tr_align
from kvviz.handoffs.translate import prefix as tr_prefix
from kvviz.handoffs.translate import side
from kvviz.handoffs.translate import translator as tr
from kvviz.handoffs.translate.locate import shipped_translator
from kvviz.runtime import cache as kv
from kvviz.runtime.cache import KVState
from kvviz.runtime.decode import generate, prefill
from kvviz.studies.c2c.communication import derangement
from kvviz.studies.c2c.examples import response_ids

ROWS = ("receiver", "skyline", "oracle", "translator", "control", "closed")
CHECKS = {"oracle": "skyline", "closed": "receiver"}  # rows that must equal another: run on the first records only
SWAP_ROWS = ("skyline", "translator")  # the rows that also read the swapped note
FOLLOW_ROWS = ("receiver", "control", "skyline", "translator")  # follow rates reported (the first two: the floor)
PRESETS_FILE = ASSETS / "presets.toml"


def heldout_sets(recall_n: int, countries_n: int, seed: int = 0, whereabouts_n: int = 0) -> dict:
    """The held-out records: recall's held-out entities (seed + 1, as eval-fuser draws them), the
    first ``countries_n`` of Countries shuffled with ``seed`` (eval-fuser's sample) and
    ``whereabouts_n`` who-is-where records of the held-out landmarks and people (seed + 1)."""

    sets = {}
    if recall_n:
        sets["recall"] = recall.generate("heldout", recall_n, seed=seed + 1)
    if countries_n:
        sets["countries"] = load_dataset("countries", limit=countries_n, seed=seed)
    if whereabouts_n:
        sets["whereabouts"] = whereabouts.generate("heldout", whereabouts_n, seed=seed + 1)
    return sets


def countries_split(heldout: int = 100, seed: int = 0) -> tuple[list, list]:
    """Countries as the evaluators split it, as (records a trainer may read, held-out records): the
    held-out ones are the first ``heldout`` of Countries shuffled with ``seed`` (``heldout_sets``'
    sample, eval-fuser's too); the others, less any record whose landmark a held-out record names
    (its country would be a held-out answer), are the training side."""
    records = load_dataset("countries", seed=seed)
    held, rest = records[:heldout], records[heldout:]
    held_landmarks = {record.meta.get("landmark") for record in held}
    return [record for record in rest if record.meta.get("landmark") not in held_landmarks], held


def preset_records(path: Path = PRESETS_FILE) -> list[tuple[Record, dict | None]]:
    """The page's presets with a private note, as (record, its stored swap or None)."""
    with path.open("rb") as handle:
        raw = tomllib.load(handle)["preset"]
    out = []
    for preset in raw:
        if preset.get("scenario") != "private" or not preset.get("context"):
            continue
        record = Record(id=f"preset-{preset['key']}", question=preset["query"], context=preset["context"],
                        answers=list(preset["answers"]), choices=None, answer_index=None, source="presets",
                        response=preset["answers"][0], meta={"preset": preset["key"]})
        out.append((record, preset.get("swap")))
    return out


class Runner:
    """Builds each row's receiver state for a record and answers / scores from it."""

    def __init__(self, pair, translator, max_new_tokens: int = 12):

        self.pair, self.translator = pair, translator
        self.settings = GenerationSettings(max_new_tokens=max_new_tokens)

    def state(self, row: str, record, other=None):
        """(the receiver's state before the question, the question's tokens, a side memory or None)."""
        receiver, sharer = self.pair.receiver, self.pair.sharer
        alone = build_segments(receiver.tokenizer, record.question)
        with_context = build_segments(receiver.tokenizer, record.question, record.context)
        if row in ("receiver", "skyline"):
            segments = alone if row == "receiver" else with_context
            state = KVState()
            prefill(receiver, state, segments.context_ids, need_logits=False)
            return state, segments.query_ids, None
        context = other.context if row == "control" else record.context
        alignment = tr_align.align_context(receiver.tokenizer, sharer.tokenizer, context, self.translator.config.sharer_start)
        if row == "oracle":
            return tr_prefix.oracle_prefix(self.pair, alignment).state, with_context.query_ids, None
        gates = [0.0] * receiver.facts.num_layers if row == "closed" else None
        prefix, _, _ = tr_prefix.translate(self.pair, self.translator, alignment, gates=gates)
        return prefix.state, with_context.query_ids, prefix.memory

    @torch.no_grad()
    def answer(self, row: str, record, other=None) -> tuple[str, float, int]:
        """(greedy answer, summed gold NLL, gold tokens)."""

        receiver = self.pair.receiver
        state, query_ids, memory = self.state(row, record, other)
        scoring = KVState(cache=_copy(state.cache), next_position=state.next_position,
                          prefix_positions=state.prefix_positions, prefix_bias=state.prefix_bias)
        gold = response_ids(receiver.tokenizer, record.answers[0], 16)
        with side.reading(receiver, memory):
            nll = float(tr_prefix.nll_after(receiver, scoring, query_ids, gold))
        if memory is not None:  # the batched decode step fires no hook: decode through the model's forward
            return side.greedy_answer(receiver, state, memory, query_ids, self.settings.max_new_tokens), nll, len(gold)
        first, _ = prefill(receiver, state, query_ids)
        output = generate(receiver, state, first, self.settings)
        return output.text, nll, len(gold)


def _copy(cache):

    return kv.copy_cache(cache)


def rate(hits: int, n: int) -> dict:
    """A count with its share and 95% Wilson interval."""
    low, high = wilson_interval(hits, n)
    return {"contains": hits, "n": n, "rate": hits / n if n else None, "ci95": [low, high]}


def summarise(rows: dict, records, seed: int) -> dict:

    table = {}
    for name, results in rows.items():
        hits = sum(contains_answer(text, record.answers) for (text, _, _), record in zip(results, records))
        tokens = sum(n for _, _, n in results)
        table[name] = {**rate(hits, len(results)), "nll": sum(s for _, s, _ in results) / tokens}
    out = {"rows": table}
    if {"translator", "receiver", "skyline"} <= set(rows):
        receiver, skyline, translated = (table[n]["nll"] for n in ("receiver", "skyline", "translator"))
        gap = receiver - skyline
        out["nll_gap_closed"] = (receiver - translated) / gap if gap > 0 else None
        out["answer_rate_vs_skyline"] = table["translator"]["rate"] / table["skyline"]["rate"] if table["skyline"]["rate"] else None
    if "control" in rows and "translator" in rows:
        diffs = [c[1] - t[1] for c, t in zip(rows["control"], rows["translator"])]
        tokens = [t[2] for t in rows["translator"]]
        wins = sum(d > 0 for d in diffs)
        losses = sum(d < 0 for d in diffs)
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


def evaluate(pair, translator, sets: dict, rows=ROWS, seed: int = 0, max_new_tokens: int = 12, progress=print,
             examples: int = 6, checks: int = 10, swap: bool = True) -> dict:
    """Every row on every record, except the checks (``CHECKS``: oracle = Skyline, closed gates =
    receiver alone), which run on the first ``checks`` records and are compared with their twin;
    with ``swap``, the swap rows on each record's swapped note (sets with swapped facts)."""

    runner = Runner(pair, translator, max_new_tokens)
    report = {}
    for name, records in sets.items():
        swaps = swaps_for(name, records, seed) if swap and name in SWAPPERS else {}
        results, swapped, checked = run_set(runner, name, records, rows, swaps, seed, checks, progress)
        summary = summarise(results, records, seed)
        if (other := control_follows_other(results, records, seed)) is not None:
            summary["control_other_note"] = other
        if swaps:
            summary["swap"] = swap_summary(results, swapped, records, swaps)
        if name == "whereabouts":
            summary["by_people"] = people_summary(results, records)
        summary["checks"] = {
            row: {"records": len(got), "equals": CHECKS[row],
                  "same_answers": sum(a[0] == b[0] for a, b in zip(got, results[CHECKS[row]])),
                  "max_nll_difference": max((abs(a[1] - b[1]) for a, b in zip(got, results[CHECKS[row]])), default=None)}
            for row, got in checked.items() if CHECKS[row] in results and got
        }
        summary["examples"] = [
            {"context": r.context, "question": r.question, "gold": r.answers[0],
             **{row: results[row][i][0] for row in results},
             **({"swapped": swaps[r.id].changed, **{f"{row}_swap": swapped[row][i][0] for row in swapped}} if r.id in swaps else {})}
            for i, r in enumerate(records[:examples])
        ]
        report[name] = summary
    return report


def partners(records, seed: int) -> list[int]:
    """The record whose note each record's control reads (a seeded derangement, never the same note)."""
    return derangement(len(records), seed, same=lambda i, j: records[i].context == records[j].context)


def control_follows_other(rows: dict, records, seed: int) -> dict | None:
    """How often the control (the translator fed another record's note) answers with *that* record's
    answer and not its own: a control below the receiver alone is then the other note crossing, as
    Skyline reading the wrong note would, not the channel breaking the receiver."""
    if "control" not in rows:
        return None
    partner = partners(records, seed)
    hits = sum(contains_answer(text, records[partner[i]].answers) and not contains_answer(text, records[i].answers)
               for i, (text, _, _) in enumerate(rows["control"]))
    return {"names_the_other_notes_answer": hits, "of": len(records)}


def run_set(runner, name: str, records, rows, swaps: dict, seed: int, checks: int, progress):
    """(results per row, results per swap row (None where a record has no swap), check rows): each a
    list of (answer, summed gold NLL, gold tokens) per record."""
    partner = partners(records, seed)
    measured = [row for row in rows if row not in CHECKS]
    results = {row: [] for row in measured}
    swapped = {row: [] for row in SWAP_ROWS if row in measured} if swaps else {}
    checked = {row: [] for row in rows if row in CHECKS}
    started = time.perf_counter()
    for index, record in enumerate(records):
        for row in measured:
            results[row].append(runner.answer(row, record, records[partner[index]]))
        swap = swaps.get(record.id)
        for row in swapped:
            twin = dataclasses.replace(record, context=swap.context, answers=list(swap.answers)) if swap else None
            swapped[row].append(runner.answer(row, twin) if swap else None)
        if index < checks:
            for row in checked:
                checked[row].append(runner.answer(row, record))
        if (index + 1) % 10 == 0 or index + 1 == len(records):
            progress(f"{name}: {index + 1}/{len(records)} ({time.perf_counter() - started:.0f} s)")
    return results, swapped, checked


def run_presets(pair, translator, presets=None, max_new_tokens: int = 12) -> list[dict]:
    """The page's private presets: each row's answer on the preset's note, the translator on another
    preset's note (its control: the next preset's) and Skyline and the translator on its stored swap."""
    runner = Runner(pair, translator, max_new_tokens)
    presets = preset_records() if presets is None else presets
    out = []
    for index, (record, swap) in enumerate(presets):
        other = presets[(index + 1) % len(presets)][0]
        entry = {"preset": record.meta.get("preset", record.id), "gold": record.answers, "other_note": other.context}
        for row in ("receiver", "skyline", "translator", "control"):
            text = runner.answer(row, record, other)[0]
            entry[row] = {"answer": text, "right": contains_answer(text, record.answers)}
        if swap:
            twin = dataclasses.replace(record, context=replace_fact(record.context, swap["replace"], swap["by"]),
                                       answers=list(swap["answers"]))
            for row in SWAP_ROWS:
                text = runner.answer(row, twin)[0]
                entry[f"{row}_swap"] = {"answer": text, "outcome": swap_outcome(text, record.answers, twin.answers)}
        out.append(entry)
    return out


def format_report(report: dict) -> str:
    lines = []
    for name, summary in report.items():
        if not isinstance(summary, dict) or "rows" not in summary:
            continue
        lines.append(f"{name}: answer contained (95% Wilson) and mean gold-answer NLL (nats/token)")
        for row, values in summary["rows"].items():
            low, high = values["ci95"]
            lines.append(f"  {row:<11} {values['contains']:>3}/{values['n']:<3} [{low:.2f}, {high:.2f}]  NLL {values['nll']:.3f}")
        if summary.get("nll_gap_closed") is not None:
            lines.append(f"  translator closes {summary['nll_gap_closed']:.1%} of the receiver-Skyline NLL gap; "
                         f"answer rate {summary['answer_rate_vs_skyline'] or 0:.1%} of Skyline's")
        if "communication" in summary:
            c = summary["communication"]
            lines.append(f"  communication gain {c['gain']:+.3f} nats/token, 95% CI [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]; "
                         f"right context lower on {c['right_context_lower_nll']}/{c['of']} (sign test p = {c['sign_test_p']:.2g})")
            if "control_within_receiver_interval" in summary:
                lines.append(f"  control within the receiver's interval: {summary['control_within_receiver_interval']}")
        if "control_other_note" in summary:
            other = summary["control_other_note"]
            lines.append(f"  the control answers with the other note's answer on {other['names_the_other_notes_answer']}/{other['of']}")
        lines += format_swap(summary.get("swap") or {})
        for people, entry in (summary.get("by_people") or {}).items():
            lines.append(f"  {people} people: " + ", ".join(
                f"{row} {v['contains']}/{v['n']} (other's country {v['other_persons_country']}, place {v['names_the_place']})"
                for row, v in entry.items()))
        for row, check in summary.get("checks", {}).items():
            lines.append(f"  check {row} = {check['equals']} on {check['records']} records: same answers {check['same_answers']}, "
                         f"largest NLL difference {check['max_nll_difference']:.2e}")
    for entry in report.get("presets") or []:
        cells = [f"{row} {entry[row]['answer']!r}" + (" ✓" if entry[row].get("right") else "")
                 for row in ("receiver", "skyline", "translator", "control") if row in entry]
        cells += [f"{row} {entry[row]['answer']!r} ({entry[row]['outcome']})" for row in ("skyline_swap", "translator_swap") if row in entry]
        lines.append(f"preset {entry['preset']}: " + "; ".join(cells))
    return "\n".join(lines)


def format_swap(swap: dict) -> list[str]:
    if not swap:
        return []
    cells = [f"{row} {v['followed']}/{v['n']} [{v['ci95'][0]:.2f}, {v['ci95'][1]:.2f}]" for row, v in swap["rows"].items()]
    tail = f"; translator {swap['follow_vs_skyline']:.1%} of Skyline's" if swap.get("follow_vs_skyline") is not None else ""
    return [f"  swapped fact, follow rate: {', '.join(cells)}{tail}"]


def measured_summary(report: dict) -> dict:
    """The numbers kept beside a shipped translator (``measured.json``; the handoff's note reads
    ``communication_gain``): per set the rows' answer rates and NLL, the gap closed, the gain, the
    follow rates and the who-is-where breakdown; the presets' answers."""
    keys = ("nll_gap_closed", "answer_rate_vs_skyline", "communication", "control_within_receiver_interval",
            "control_minus_receiver_nll", "control_other_note", "checks", "swap", "by_people")
    sets = {}
    for name, summary in report.items():
        if not isinstance(summary, dict) or "rows" not in summary:
            continue
        sets[name] = {
            "rows": {row: {k: v[k] for k in ("contains", "n", "ci95", "nll")} for row, v in summary["rows"].items()},
            **{k: summary[k] for k in keys if k in summary},
        }
    first = next((n for n in ("recall", "countries", "whereabouts") if "communication" in sets.get(n, {})), None)
    out = {"command": report.get("command"), "sets": sets}
    if report.get("presets"):
        out["presets"] = report["presets"]
    if first:
        c = sets[first]["communication"]
        out["set"] = first
        out["communication_gain"] = {"value": c["gain"], "ci95": c["ci95"], "n": c["of"]}
    return out


def configure_parser(parser) -> None:
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--translator", default="", help="translator folder (default: the pair's shipped one)")
    parser.add_argument("--recall", type=int, default=100, help="held-out recall records (0: skip)")
    parser.add_argument("--countries", type=int, default=100, help="Countries records, context private to the sharer (0: skip)")
    parser.add_argument("--whereabouts", type=int, default=120,
                        help="held-out who-is-where records: 1-3 people per note at held-out landmarks (0: skip)")
    parser.add_argument("--no-swap", action="store_true", help="leave out the swapped-fact rows")
    parser.add_argument("--no-presets", action="store_true", help="leave out the page's presets")
    parser.add_argument("--rows", default=",".join(ROWS),
                        help="rows to run (e.g. translator,control to compare translators on the same records; the "
                             "receiver and Skyline rows do not depend on the translator)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checks", type=int, default=10, help="records on which oracle = Skyline and closed = receiver are checked")
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--measured", default=None, help="also write the summary to this file (measured.json beside a shipped translator)")


def main(args) -> int:

    if args.threads:
        torch.set_num_threads(args.threads)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    pair = load_pair(args.pair, "cpu", None, progress=log)
    folder = args.translator or shipped_translator(pair)
    if not folder:
        raise ValueError(f"No KV translator shipped for pair '{pair.name}'; name one with --translator DIR.")
    translator = tr.load_translator(folder, pair.sharer.facts, pair.receiver.facts, pair.name)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = set(rows) - set(ROWS)
    if unknown:
        raise ValueError(f"unknown rows {sorted(unknown)}; choose from {', '.join(ROWS)}")
    started = time.perf_counter()
    sets = heldout_sets(args.recall, args.countries, args.seed, args.whereabouts)
    report = evaluate(pair, translator, sets, rows, args.seed, args.max_new_tokens, log, checks=args.checks, swap=not args.no_swap)
    if not args.no_presets:
        report["presets"] = run_presets(pair, translator, max_new_tokens=args.max_new_tokens)
    report["translator"] = str(folder)
    report["training"] = translator.config.training
    report["seconds"] = time.perf_counter() - started
    program = "python -m kvviz" if getattr(args, "command", None) == "eval-translator" else "python -m kvviz.studies.c2c.translator_eval"
    report["command"] = program + " " + " ".join(sys.argv[1:])
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    if args.measured:
        Path(args.measured).write_text(json.dumps(measured_summary(report), indent=2) + "\n")
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    configure_parser(parser)
    raise SystemExit(main(parser.parse_args()))
