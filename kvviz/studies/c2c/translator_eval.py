"""``python -m kvviz eval-translator``: a KV translator on held-out private contexts, with its controls
as measured rows, follow rates on swapped facts, matched / deranged cells and harm against the receiver
alone, each with its interval.

    python -m kvviz eval-translator --pair embedded [--translator DIR] [--seed N] [--json]
        [--recall 100] [--countries 100] [--whereabouts 120] [--paragraphs 103] [--unneeded 100]

The sets are ``translator_sets``' (held out by entity, and HotpotQA's supporting paragraphs by
paragraph), the rows ``translator_rows``', the report ``translator_summary``'s. ``--seed`` draws the
records: a seed no run was chosen on is a *fresh draw* (the report says which seed drew it, as
``draw``). The page's private presets (``assets/presets.toml``) run too: each preset's note, another
preset's note (the control) and its stored swap. ``--measured FILE`` writes what the page shows beside
a shipped translator (``measured.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from kvviz.engine.runner import load_pair
from kvviz.handoffs.translate import translator as tr
from kvviz.handoffs.translate.locate import shipped_translator
from kvviz.studies.c2c.translator_rows import ROWS, evaluate, run_presets
from kvviz.studies.c2c.translator_sets import heldout_sets
from kvviz.studies.c2c.translator_summary import measured_summary


def cell(entry: dict) -> str:
    return f"{entry['contains']}/{entry['n']} [{entry['ci95'][0]:.2f}, {entry['ci95'][1]:.2f}]"


def format_report(report: dict) -> str:
    lines = []
    for name, summary in report.items():
        if not isinstance(summary, dict) or "rows" not in summary:
            continue
        lines.append(f"{name}: answer contained (95% Wilson) and mean gold-answer NLL (nats/token)")
        for row, values in summary["rows"].items():
            low, high = values["ci95"]
            lines.append(f"  {row:<11} {values['contains']:>3}/{values['n']:<3} [{low:.2f}, {high:.2f}]  NLL {values['nll']:.3f}")
        for row, pair in (summary.get("matched_deranged") or {}).items():
            lines.append(f"  {row} matched / deranged (its own note / another record's): {cell(pair['matched'])} / {cell(pair['deranged'])}")
        for row, compared in (summary.get("harm") or {}).items():
            low, high = compared["ci95"]
            lines.append(f"  {row} against the receiver alone: {compared['difference']:+.2f} [{low:+.2f}, {high:+.2f}] "
                         f"(McNemar p = {compared.get('mcnemar_p', 1.0):.2g}; no worse: {compared['no_worse']})")
        if summary.get("answer_gap_closed") is not None:
            lines.append(f"  translator closes {summary['answer_gap_closed']:.1%} of the receiver-Skyline answer-rate gap")
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


def configure_parser(parser) -> None:
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--translator", default="", help="translator folder (default: the pair's shipped one)")
    parser.add_argument("--recall", type=int, default=100, help="held-out recall records (0: skip)")
    parser.add_argument("--countries", type=int, default=100, help="Countries records, context private to the sharer (0: skip)")
    parser.add_argument("--whereabouts", type=int, default=120,
                        help="held-out who-is-where records: 1-3 people per note at held-out landmarks (0: skip)")
    parser.add_argument("--paragraphs", type=int, default=103,
                        help="HotpotQA questions over their whole supporting paragraphs (held out by paragraph; 0: skip)")
    parser.add_argument("--unneeded", type=int, default=100,
                        help="held-out notes asked about a landmark they do not name: the harm set (0: skip)")
    parser.add_argument("--passages", type=int, default=0,
                        help="Dolly's extractive passages: the validation passages training runs are compared on (0: skip)")
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
    sets = heldout_sets(args.recall, args.countries, args.seed, args.whereabouts, args.paragraphs, args.unneeded, args.passages)
    report = evaluate(pair, translator, sets, rows, args.seed, args.max_new_tokens, log, checks=args.checks, swap=not args.no_swap)
    if not args.no_presets:
        report["presets"] = run_presets(pair, translator, max_new_tokens=args.max_new_tokens)
    report["draw"] = {"seed": args.seed, "records": {name: len(records) for name, records in sets.items()},
                      "rule": "recall, whereabouts: seed + 1; unneeded: seed + 1 (notes 10,001 + seed); countries: shuffled "
                              "with seed; paragraphs: HotpotQA's first 103, fixed"}
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
