"""Evaluate a C2C fuser: ``python -m kvviz eval-fuser --pair embedded [--json]``.

1. Held-out response NLL (nats per token, the fuser's own held-out split rebuilt from its
   checkpoint config): receiver alone vs the control fuser vs C2C, hard gates as at inference.
   **Communication**: the same NLL with the sharer reading the right context, another example's
   context (a fixed, seeded derangement) and with the sharer's KV zeroed. The communication gain
   is NLL(other context) - NLL(right context), with a seeded bootstrap 95% interval over
   examples; a fuser that ignores the sharer (the control) scores exactly 0.
2. Multiple-choice accuracy on ARC-Challenge and OpenBookQA subsets (seeded sample) for the
   receiver, the sharer, the text handoff and C2C (and the control), each with a 95% Wilson
   interval. Every answer is produced by the handoff itself (greedy) from the one multiple-choice
   prompt the benchmark uses too (``kvviz.data.choice_query``) and scored with
   ``extract_choice_letter``; no letter counts as wrong.
3. ``--mc-scoring likelihood``: multiple choice scored as the C2C paper scores it, by the
   likelihood of each choice's text in the state each handoff left the receiver in (the
   benchmark's ``kvviz.studies.bench.scoring`` scorer), plus one more row: C2C with **another question
   in the sharer** (a seeded derangement; the other prompt's sharer cache stretched to this
   prompt's fused tokens). The communication gain on multiple choice is the accuracy of C2C minus
   that row, paired per question (bootstrap 95% interval, McNemar's exact test), beside the
   same for the gold choice's length-normalised log-likelihood. Per-question results are kept,
   so two reports (e.g. C2C and a self-fusion fuser, ``--pair embedded-gemma``) can be paired
   (``research/c2c_paper_table.py``).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from kvviz.data import (
    LETTERS,
    choice_query,
    contains_answer,
    extract_choice_letter,
    f1_match,
    load_dataset,
    recall,
    wilson_interval,
)
from kvviz.engine import flags, runner
from kvviz.engine.evaluation import Tally, Variant, evaluate
from kvviz.handoffs import parse_handoffs
from kvviz.handoffs.c2c.handoff import fused_prompt, request_alignment
from kvviz.handoffs.c2c.locate import get_fuser, resolve_fuser
from kvviz.handoffs.registry import build_request
from kvviz.runtime.checkpoints import checkpoint_label
from kvviz.studies.bench.scoring import best_option, choice_likelihoods, option_scores
from kvviz.data.stats import paired_comparison
from kvviz.studies.c2c.communication import communication_measure, derangement, other_prompt_sharer
from kvviz.studies.c2c.examples import heldout_examples
from kvviz.studies.c2c.scoring import mean_nll


def configure_parser(parser) -> None:
    flags.add_model_arguments(parser, threads_help="torch CPU threads (default: leave as is)")
    parser.add_argument("--fuser", default=None, help="C2C fuser folder (default: the pair's shipped one)")
    parser.add_argument("--control", default=None, help="control fuser folder (default: beside --fuser, or shipped)")
    parser.add_argument(
        "--heldout", type=int, default=None, help="held-out examples for NLL (default: the fuser's own split; 0: skip)"
    )
    parser.add_argument("--datasets", default="arc_challenge,openbookqa")
    parser.add_argument("--mc-limit", type=int, default=30, help="questions per multiple-choice dataset")
    parser.add_argument(
        "--mc-scoring", choices=("letter", "likelihood"), default="letter",
        help="letter: the letter each handoff writes; likelihood: each choice's likelihood (the C2C paper), "
        "with C2C's other-question control and the communication gain",
    )
    parser.add_argument("--handoffs", default="receiver,sharer,text,c2c,c2c_control")
    parser.add_argument("--max-new-tokens", type=int, default=6)
    parser.add_argument("--message-tokens", type=int, default=32, help="text handoff message bound")
    parser.add_argument("--seed", type=int, default=0, help="seed of the multiple-choice sample, the derangement and the bootstrap")
    parser.add_argument("--recall", type=int, default=0, help="held-out recall questions answered by each handoff (0: skip)")
    parser.add_argument("--countries", type=int, default=0, help="Countries questions, context private to the sharer (0: skip)")
    parser.add_argument("--answer-handoffs", default="receiver,sharer,c2c,c2c_control", help="handoffs for --recall / --countries")
    parser.add_argument("--answer-tokens", type=int, default=12, help="max new tokens for --recall / --countries answers")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", default=None, help="also write the JSON here")


def heldout_nll(pair, c2c_folder: Path, control_folder: Path | None, limit: int | None, seed: int = 0) -> dict:
    fuser = get_fuser(c2c_folder, pair)
    examples, trained = heldout_examples(pair, fuser, limit)
    private = not trained.get("receiver_sees_context", True)
    rows = {"receiver": mean_nll(pair, None, examples)}
    communication = {}
    if control_folder is not None:
        control = get_fuser(control_folder, pair)
        communication["control"] = communication_measure(pair, control, examples, private, seed)
        rows["control"] = communication["control"]["nll"]["right"]
    communication["c2c"] = communication_measure(pair, fuser, examples, private, seed)
    rows["c2c"] = communication["c2c"]["nll"]["right"]
    return {
        "data": trained.get("data", "dolly"), "seed": trained.get("seed", 0), "examples": len(examples),
        "context": trained.get("context", "shared"), "context_only": trained.get("context_only", False),
        "tokens": sum(len(e.response_ids) for e in examples), "nll": rows, "communication": communication,
    }


def answer_accuracy(pair, names: list[str], records, request_for, progress, label: str) -> dict:
    """Greedy answers of each handoff (the evaluation loop), scored by ``contains_answer`` and the
    KVComm F1 metric, each tallied with its 95% Wilson interval."""
    variants = [Variant(name, name) for name in names]
    contains, f1, examples = {}, {}, {name: [] for name in names}
    for item in evaluate(pair, enumerate(records), variants, lambda record, _: request_for(record.question, record.context)):
        name, result, record = item.variant.label, item.result, item.record
        hit = (lambda metric: metric(result.answer, record.answers)) if result.applicable else (lambda metric: None)
        contains.setdefault(name, Tally()).add(hit(contains_answer), result.reason)
        f1.setdefault(name, Tally()).add(hit(f1_match), result.reason)
        if result.applicable and len(examples[name]) < 5:
            examples[name].append({"question": record.question, "gold": record.answers[0], "answer": result.answer})
        if name == names[-1] and ((item.index + 1) % 10 == 0 or item.index + 1 == len(records)):
            progress(f"{label}: {item.index + 1}/{len(records)}")
    table = {}
    for name in names:
        row = {"contains": contains[name].correct, "f1": f1[name].correct, "n": contains[name].n,
               "skipped": contains[name].skipped, "examples": examples[name]}
        if contains[name].skipped:
            row["reason"] = contains[name].reason
        for metric, counts in (("contains", contains[name]), ("f1", f1[name])):
            row[f"{metric}_accuracy"] = counts.accuracy
            row[f"{metric}_ci95"] = list(counts.ci95) if counts.n else None
        table[name] = row
    return table


def mc_accuracy(pair, names: list[str], datasets: list[str], limit: int, seed: int, request_for, progress) -> dict:
    """Multiple-choice accuracy of each handoff per dataset: the letter it writes (the one
    multiple-choice prompt, ``choice_query``), no letter counting as wrong."""
    table = {}
    variants = [Variant(name, name) for name in names]
    for dataset in datasets:
        records = load_dataset(dataset, limit=limit, seed=seed)
        tallies = {name: Tally() for name in names}
        extra = {name: {"no_letter": 0, "seconds": 0.0} for name in names}
        for item in evaluate(pair, enumerate(records), variants, lambda record, _: request_for(choice_query(record), None)):
            name, result, record = item.variant.label, item.result, item.record
            if not result.applicable:
                tallies[name].add(None, result.reason)
            else:
                letter = extract_choice_letter(result.answer, len(record.choices))
                tallies[name].add(letter == LETTERS[record.answer_index])
                extra[name]["no_letter"] += letter is None
                extra[name]["seconds"] += result.total_seconds
            if name == names[-1]:
                progress(f"{dataset}: {item.index + 1}/{len(records)}")
        counts = {}
        for name, counted in tallies.items():
            row = {"correct": counted.correct, "n": counted.n, "no_letter": extra[name]["no_letter"],
                   "skipped": counted.skipped, "seconds": extra[name]["seconds"]}
            if counted.skipped:
                row["reason"] = counted.reason
            row["accuracy"] = counted.accuracy
            row["ci95"] = list(wilson_interval(counted.correct, counted.n))
            counts[name] = row
        table[dataset] = counts
    return table


OTHER_QUESTION = "c2c_other_question"  # the row of C2C with another question in the sharer

# the paired comparisons each dataset reports (those whose rows ran)
LIKELIHOOD_COMPARISONS = (
    ("c2c", OTHER_QUESTION, "communication gain: C2C minus C2C with another question in the sharer"),
    ("c2c", "receiver", "C2C minus the receiver alone"),
    (OTHER_QUESTION, "receiver", "C2C with another question in the sharer minus the receiver alone"),
    ("c2c", "c2c_control", "C2C minus its control"),
    ("c2c", "text", "C2C minus text"),
    ("text", "receiver", "text minus the receiver alone"),
)


def likelihood_row(correct: list[int], gold: list[float], letters: list[int] | None = None) -> dict:
    n = len(correct)
    row = {"n": n, "correct": sum(correct), "accuracy": sum(correct) / n if n else None,
           "ci95": list(wilson_interval(sum(correct), n)), "per_question": correct, "gold_score": gold}
    if letters:
        row["letter_accuracy"] = sum(letters) / n if n else None
    return row


def mc_likelihood(pair, names: list[str], datasets: list[str], limit: int, seed: int, request_for, c2c_folder, progress) -> dict:
    """Multiple choice by the likelihood of each choice (module doc, 3.), per dataset: each
    handoff's accuracy (and the letter it wrote), C2C with another question in the sharer, and
    the paired comparisons of ``LIKELIHOOD_COMPARISONS``."""
    fuser = get_fuser(c2c_folder, pair) if "c2c" in names else None
    variants = [Variant(name, name) for name in names]
    table = {}
    for dataset in datasets:
        records = load_dataset(dataset, limit=limit, seed=seed)
        requests = [request_for(choice_query(record), None) for record in records]
        request_of = {record.id: request for record, request in zip(records, requests)}
        partner = derangement(len(records), seed)
        rows = {name: {"correct": [], "gold": [], "letters": []} for name in names + ([OTHER_QUESTION] if fuser else [])}
        skipped: dict[str, str] = {}  # a handoff that could not score every question is left out

        def add(name, scores, record, letter_right=None):
            rows[name]["correct"].append(int(best_option(scores) == record.answer_index))
            rows[name]["gold"].append(scores[record.answer_index])
            if letter_right is not None:
                rows[name]["letters"].append(letter_right)

        def add_other_question(index, record):
            alignment = request_alignment(pair, requests[index], fuser)
            other = request_alignment(pair, requests[partner[index]], fuser)
            prompt = fused_prompt(pair, fuser, alignment, other_prompt_sharer(pair, alignment, other))
            add(OTHER_QUESTION, option_scores(prompt, record.choices), record)

        for item in evaluate(pair, enumerate(records), variants, lambda record, _: request_of[record.id]):
            name, result, record = item.variant.label, item.result, item.record
            scores = choice_likelihoods(pair, record, name, item.request, result) if result.applicable else None
            if scores is None:
                skipped[name] = result.reason if not result.applicable else "its descriptor cannot rebuild the receiver's state"
            else:
                add(name, scores, record, int(extract_choice_letter(result.answer, len(record.choices)) == LETTERS[record.answer_index]))
            if name == names[-1]:
                if fuser is not None:
                    add_other_question(item.index, record)
                if (item.index + 1) % 10 == 0 or item.index + 1 == len(records):
                    progress(f"{dataset} (likelihood): {item.index + 1}/{len(records)}")
        measured = {name: likelihood_row(row["correct"], row["gold"], row["letters"]) for name, row in rows.items() if name not in skipped}
        comparisons = [
            {
                "first": first, "second": second, "label": label,
                "accuracy": paired_comparison(measured[first]["per_question"], measured[second]["per_question"], seed),
                "gold_score": paired_comparison(measured[first]["gold_score"], measured[second]["gold_score"], seed),
            }
            for first, second, label in LIKELIHOOD_COMPARISONS if first in measured and second in measured
        ]
        table[dataset] = {"ids": [record.id for record in records], "rows": measured, "comparisons": comparisons,
                          "skipped": skipped, "partner": partner}
    return table


def format_report(report: dict) -> str:
    lines = [f"pair {report['pair']}: sharer {report['sharer']} -> receiver {report['receiver']}"]
    lines.append(f"c2c fuser: {report['fuser']}")
    lines.append(f"control:   {report['control']}")
    nll = report.get("heldout")
    if nll:
        lines.append("")
        lines.append(f"Held-out response NLL ({nll['data']}, {nll['examples']} examples, {nll['tokens']} tokens; nats/token, lower is better)")
        for name, value in nll["nll"].items():
            lines.append(f"  {name:<10} {value:.4f}")
        for name, m in nll.get("communication", {}).items():
            low, high = m["ci95"]
            lines.append(
                f"  communication gain ({name}): {m['gain']:+.4f} nats/token, 95% CI [{low:+.4f}, {high:+.4f}] "
                f"(NLL right {m['nll']['right']:.4f}, other context {m['nll']['other']:.4f}, sharer zeroed {m['nll']['zero']:.4f})"
            )
    for label, table in report.get("answers", {}).items():
        lines.append("")
        lines.append(f"{label}: answers (greedy) containing the gold answer / KVComm F1 > 0.5, 95% Wilson interval")
        for name, row in table.items():
            if row["n"] == 0:
                lines.append(f"  {name:<12} n/a  {row.get('reason', '')[:80]}")
                continue
            low, high = row["contains_ci95"]
            lines.append(
                f"  {name:<12} contains {row['contains_accuracy']:.3f} [{low:.3f}, {high:.3f}]  f1 {row['f1_accuracy']:.3f}  n={row['n']}"
            )
    for dataset, measured in report.get("mc_likelihood", {}).items():
        lines.append("")
        lines.append(f"{dataset}: accuracy by choice likelihood, 95% Wilson interval")
        for name, row in measured["rows"].items():
            low, high = row["ci95"]
            lines.append(f"  {name:<20} {row['accuracy']:.3f} [{low:.3f}, {high:.3f}]  n={row['n']}")
        for name, reason in measured["skipped"].items():
            lines.append(f"  {name:<20} n/a  {reason[:80]}")
        for comparison in measured["comparisons"]:
            acc, gold = comparison["accuracy"], comparison["gold_score"]
            lines.append(
                f"  {comparison['label']}: {acc['difference']:+.3f} [{acc['ci95'][0]:+.3f}, {acc['ci95'][1]:+.3f}] "
                f"(only first right {acc['only_first']}, only second {acc['only_second']}, McNemar p {acc['mcnemar_p']:.3g}); "
                f"gold choice log-likelihood per byte {gold['difference']:+.4f} [{gold['ci95'][0]:+.4f}, {gold['ci95'][1]:+.4f}]"
            )
    for dataset, counts in report.get("mc", {}).items():
        lines.append("")
        lines.append(f"{dataset}: accuracy with 95% Wilson interval")
        lines.append(f"  {'handoff':<12} {'acc':>6} {'95% CI':>15} {'n':>4} {'no letter':>9} {'s/question':>10}")
        for name, row in counts.items():
            if row["accuracy"] is None:
                lines.append(f"  {name:<12} {'n/a':>6}  {row.get('reason', '')[:80]}")
                continue
            low, high = row["ci95"]
            lines.append(
                f"  {name:<12} {row['accuracy']:>6.3f} {f'[{low:.3f}, {high:.3f}]':>15} {row['n']:>4} {row['no_letter']:>9} "
                f"{row['seconds'] / max(row['n'], 1):>10.2f}"
            )
    return "\n".join(lines)


def main(args) -> int:
    flags.apply_threads(args)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    started = time.perf_counter()
    pair = runner.load_pair(args.pair, args.device or "cpu", args.dtype, progress=log)
    c2c_folder, reason = resolve_fuser(pair, args.fuser, control=False)
    if c2c_folder is None:
        raise ValueError(reason)
    if args.control:
        control_folder = Path(args.control)
    else:
        control_folder, _ = resolve_fuser(pair, str(c2c_folder), control=True)
    report = {
        "pair": pair.name, "sharer": pair.sharer.name, "receiver": pair.receiver.name,
        "fuser": checkpoint_label(c2c_folder), "control": checkpoint_label(control_folder) if control_folder else None,
    }
    if sys.argv[1:2] == ["eval-fuser"]:  # the command line that made the report (not when called from code)
        report["command"] = "python -m kvviz " + shlex.join(sys.argv[1:])
    if args.heldout != 0:
        log("held-out NLL ...")
        report["heldout"] = heldout_nll(pair, c2c_folder, control_folder, args.heldout, args.seed)
    names = parse_handoffs(args.handoffs)
    if not control_folder:
        names = [n for n in names if n != "c2c_control"]
    answer_names = [n for n in parse_handoffs(args.answer_handoffs) if control_folder or n != "c2c_control"]
    def answer_request(query, context):
        return build_request(query, context, args.answer_tokens, options={"c2c": {"fuser": str(c2c_folder)}})

    if args.recall > 0:
        records = recall.generate("heldout", args.recall, seed=args.seed + 1)
        report.setdefault("answers", {})["recall (held-out entities)"] = answer_accuracy(
            pair, answer_names, records, answer_request, log, "recall"
        )
    if args.countries > 0:
        records = load_dataset("countries", limit=args.countries, seed=args.seed)
        report.setdefault("answers", {})["countries (context private to the sharer)"] = answer_accuracy(
            pair, answer_names, records, answer_request, log, "countries"
        )
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if args.mc_limit > 0 and datasets:
        def mc_request(query, context):
            options = {"c2c": {"fuser": str(c2c_folder)}, "text": {"message_tokens": args.message_tokens}}
            return build_request(query, context, args.max_new_tokens, options=options)

        if args.mc_scoring == "likelihood":
            report["mc_likelihood"] = mc_likelihood(pair, names, datasets, args.mc_limit, args.seed, mc_request, c2c_folder, log)
        else:
            report["mc"] = mc_accuracy(pair, names, datasets, args.mc_limit, args.seed, mc_request, log)
    report["seconds"] = time.perf_counter() - started
    report["settings"] = {
        "mc_limit": args.mc_limit, "mc_scoring": args.mc_scoring, "seed": args.seed, "max_new_tokens": args.max_new_tokens, "message_tokens": args.message_tokens,
        "recall": args.recall, "countries": args.countries, "answer_tokens": args.answer_tokens,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
