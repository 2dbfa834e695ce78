"""Evaluate a KV translator on held-out private contexts, with its controls as measured rows.

    python -m kvviz eval-translator --pair embedded --recall 100 --countries 100 [--translator DIR] [--json]

For each held-out record (``kvviz.recall``'s held-out entities, and the evaluators' Countries
sample with the context private to the sharer) every row answers greedily and scores the gold
answer's NLL (nats per token, teacher-forced after the question):

* ``receiver``: the receiver alone on the question;
* ``skyline``: the receiver reads the context itself;
* ``oracle``: the receiver's own KV of the context in the translated slots (equals Skyline: a
  check of the splice);
* ``translator``: the sharer reads the context, the translator's KV is the receiver's prefix;
* ``control``: the translator fed another record's context (a seeded derangement);
* ``closed``: the translator with every gate closed (equals the receiver alone: a check).

Reported per set: answer contained (95% Wilson interval), mean gold NLL, the share of the
receiver-to-Skyline NLL gap the translator closes, the communication gain NLL(control) -
NLL(translator) with a seeded bootstrap 95% interval, and how often the right context lowers
the NLL against the control (with a two-sided sign test).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from kvviz.core.prompts import build_segments
from kvviz.core.results import GenerationSettings
from kvviz.data import contains_answer, load_dataset, recall, wilson_interval
from kvviz.data.metrics import mcnemar_exact
from kvviz.engine.runner import load_pair
from kvviz.handoffs.translate import translator as tr
from kvviz.handoffs.translate.locate import shipped_translator
from kvviz.runtime import cache as kv
from kvviz.runtime.cache import KVState
from kvviz.runtime.decode import generate, prefill
from kvviz.studies.c2c.communication import bootstrap_ratio, derangement
from kvviz.studies.c2c.examples import response_ids

ROWS = ("receiver", "skyline", "oracle", "translator", "control", "closed")
CHECKS = {"oracle": "skyline", "closed": "receiver"}  # rows that must equal another: run on the first records only


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test p-value (ties dropped): McNemar's exact test on the two counts."""
    return mcnemar_exact(wins, losses)


def heldout_sets(recall_n: int, countries_n: int, seed: int = 0) -> dict:
    """The held-out records: recall's held-out entities (seed + 1, as eval-fuser draws them) and
    the first ``countries_n`` of Countries shuffled with ``seed`` (eval-fuser's sample)."""

    sets = {}
    if recall_n:
        sets["recall"] = recall.generate("heldout", recall_n, seed=seed + 1)
    if countries_n:
        sets["countries"] = load_dataset("countries", limit=countries_n, seed=seed)
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


class Runner:
    """Builds each row's receiver state for a record and answers / scores from it."""

    def __init__(self, pair, translator, max_new_tokens: int = 12):

        self.pair, self.translator = pair, translator
        self.settings = GenerationSettings(max_new_tokens=max_new_tokens)

    def state(self, row: str, record, other=None):

        receiver, sharer = self.pair.receiver, self.pair.sharer
        alone = build_segments(receiver.tokenizer, record.question)
        with_context = build_segments(receiver.tokenizer, record.question, record.context)
        if row in ("receiver", "skyline"):
            segments = alone if row == "receiver" else with_context
            state = KVState()
            prefill(receiver, state, segments.context_ids, need_logits=False)
            return state, segments.query_ids
        context = other.context if row == "control" else record.context
        alignment = tr.align_context(receiver.tokenizer, sharer.tokenizer, context, self.translator.config.sharer_start)
        if row == "oracle":
            return tr.oracle_prefix(self.pair, alignment).state, with_context.query_ids
        gates = [0.0] * receiver.facts.num_layers if row == "closed" else None
        prefix, _, _ = tr.translate(self.pair, self.translator, alignment, gates=gates)
        return prefix.state, with_context.query_ids

    @torch.no_grad()
    def answer(self, row: str, record, other=None) -> tuple[str, float, int]:
        """(greedy answer, summed gold NLL, gold tokens)."""

        receiver = self.pair.receiver
        state, query_ids = self.state(row, record, other)
        scoring = KVState(cache=_copy(state.cache), next_position=state.next_position,
                          prefix_positions=state.prefix_positions, prefix_bias=state.prefix_bias)
        gold = response_ids(receiver.tokenizer, record.answers[0], 16)
        nll = float(tr.nll_after(receiver, scoring, query_ids, gold))
        first, _ = prefill(receiver, state, query_ids)
        output = generate(receiver, state, first, self.settings)
        return output.text, nll, len(gold)


def _copy(cache):

    return kv.copy_cache(cache)


def bootstrap(diffs: list[float], tokens: list[int], seed: int) -> list[float]:

    return bootstrap_ratio(diffs, tokens, seed)


def summarise(rows: dict, records, seed: int) -> dict:

    table = {}
    for name, results in rows.items():
        hits = sum(contains_answer(text, record.answers) for (text, _, _), record in zip(results, records))
        tokens = sum(n for _, _, n in results)
        low, high = wilson_interval(hits, len(results))
        table[name] = {"contains": hits, "n": len(results), "rate": hits / len(results), "ci95": [low, high],
                       "nll": sum(s for _, s, _ in results) / tokens}
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
            "gain": sum(diffs) / sum(tokens), "ci95": bootstrap(diffs, tokens, seed),
            "right_context_lower_nll": wins, "of": len(diffs), "sign_test_p": sign_test(wins, losses),
        }
    if "control" in rows and "receiver" in rows:
        tokens = [r[2] for r in rows["receiver"]]
        control_rate, (low, high) = table["control"]["rate"], table["receiver"]["ci95"]
        out["control_within_receiver_interval"] = low <= control_rate <= high
        control_vs_receiver = [c[1] - r[1] for c, r in zip(rows["control"], rows["receiver"])]
        out["control_minus_receiver_nll"] = {"value": sum(control_vs_receiver) / sum(tokens),
                                              "ci95": bootstrap(control_vs_receiver, tokens, seed)}
    return out


def evaluate(pair, translator, sets: dict, rows=ROWS, seed: int = 0, max_new_tokens: int = 12, progress=print,
             examples: int = 6, checks: int = 10) -> dict:
    """Every row on every record, except the checks (``CHECKS``: oracle = Skyline, closed gates =
    receiver alone), which run on the first ``checks`` records and are compared with their twin."""

    runner = Runner(pair, translator, max_new_tokens)
    report = {}
    for name, records in sets.items():
        partner = derangement(len(records), seed, same=lambda i, j: records[i].context == records[j].context)
        measured = [row for row in rows if row not in CHECKS]
        results = {row: [] for row in measured}
        checked = {row: [] for row in rows if row in CHECKS}
        started = time.perf_counter()
        for index, record in enumerate(records):
            for row in measured:
                results[row].append(runner.answer(row, record, records[partner[index]]))
            if index < checks:
                for row in checked:
                    checked[row].append(runner.answer(row, record))
            if (index + 1) % 10 == 0 or index + 1 == len(records):
                progress(f"{name}: {index + 1}/{len(records)} ({time.perf_counter() - started:.0f} s)")
        summary = summarise(results, records, seed)
        summary["checks"] = {
            row: {"records": len(got), "equals": CHECKS[row],
                  "same_answers": sum(a[0] == b[0] for a, b in zip(got, results[CHECKS[row]])),
                  "max_nll_difference": max((abs(a[1] - b[1]) for a, b in zip(got, results[CHECKS[row]])), default=None)}
            for row, got in checked.items() if CHECKS[row] in results
        }
        summary["examples"] = [
            {"context": r.context, "question": r.question, "gold": r.answers[0],
             **{row: results[row][i][0] for row in measured}}
            for i, r in enumerate(records[:examples])
        ]
        report[name] = summary
    return report


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
        for row, check in summary.get("checks", {}).items():
            lines.append(f"  check {row} = {check['equals']} on {check['records']} records: same answers {check['same_answers']}, "
                         f"largest NLL difference {check['max_nll_difference']:.2e}")
    return "\n".join(lines)


def measured_summary(report: dict) -> dict:
    """The numbers kept beside a shipped translator (``measured.json``; the handoff's note reads
    ``communication_gain``): per set the rows' answer rates and NLL, the gap closed, the gain."""
    sets = {}
    for name, summary in report.items():
        if not isinstance(summary, dict) or "rows" not in summary:
            continue
        sets[name] = {
            "rows": {row: {k: v[k] for k in ("contains", "n", "ci95", "nll")} for row, v in summary["rows"].items()},
            **{k: summary[k] for k in ("nll_gap_closed", "answer_rate_vs_skyline", "communication",
                                        "control_within_receiver_interval", "checks") if k in summary},
        }
    first = next((n for n in ("recall", "countries") if "communication" in sets.get(n, {})), None)
    out = {"command": report.get("command"), "sets": sets}
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
    report = evaluate(pair, translator, heldout_sets(args.recall, args.countries, args.seed), rows, args.seed, args.max_new_tokens, log,
                      checks=args.checks)
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
