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
   benchmark's ``kvviz.bench.scoring`` scorer), plus one more row: C2C with **another question
   in the sharer** (a seeded derangement; the other prompt's sharer cache stretched to this
   prompt's fused tokens). The communication gain on multiple choice is the accuracy of C2C minus
   that row, paired per question (bootstrap 95% interval, McNemar's exact test), beside the
   same for the gold choice's length-normalised log-likelihood. Per-question results are kept,
   so two reports (e.g. C2C and a self-fusion fuser, ``--pair embedded-gemma``) can be paired
   (``scripts/c2c_paper_table.py``).
"""

from __future__ import annotations

import json
import random
import shlex
import sys
import time
from pathlib import Path

import torch


def configure_parser(parser) -> None:
    parser.add_argument("--pair", default="embedded")
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
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)


def derangement(n: int, seed: int = 0, same=None) -> list[int]:
    """partner[i] != i for every i: a seeded cycle over a shuffled order; ``same(i, j)`` skips
    partners whose context equals i's."""
    if n < 2:
        raise ValueError("the communication measure needs at least two held-out examples")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    partner = [0] * n
    for k, i in enumerate(order):
        for step in range(1, n):
            j = order[(k + step) % n]
            if same is None or not same(i, j):
                break
        partner[i] = j
    return partner


def bootstrap_ratio(diffs: list[float], tokens: list[int], seed: int = 0, resamples: int = 1000) -> list[float]:
    """95% percentile interval of sum(diffs) / sum(tokens) over examples resampled with replacement."""
    generator = torch.Generator().manual_seed(seed)
    d = torch.tensor(diffs, dtype=torch.float64)
    t = torch.tensor(tokens, dtype=torch.float64)
    picks = torch.randint(0, len(diffs), (resamples, len(diffs)), generator=generator)
    stats = d[picks].sum(1) / t[picks].sum(1)
    return [float(torch.quantile(stats, 0.025)), float(torch.quantile(stats, 0.975))]


def other_sharer(pair, examples, private: bool, partner: list[int]):
    """For example i: the sharer's KV with another example's information (see module doc)."""
    from kvviz.align import align_prompt
    from kvviz.fusion import sharer_kv

    def sharer_for(i):
        other = examples[partner[i]]
        if private:  # the same query, another example's context
            alignment = align_prompt(
                pair.receiver.tokenizer, pair.sharer.tokenizer, examples[i].question, other.context, receiver_sees_context=False,
                token_alignment=examples[i].token_alignment, fuse_template=examples[i].fuse_template,
            )
            return sharer_kv(pair, alignment)
        return other_prompt_sharer(pair, examples[i].alignment, other.alignment)

    return sharer_for


def other_prompt_sharer(pair, alignment, other_alignment):
    """Shared input: the sharer's cache of another prompt, stretched to this prompt's fused tokens."""
    from kvviz.fusion import resampled, sharer_kv

    return resampled(sharer_kv(pair, other_alignment), alignment.num_fused)


def communication_measure(pair, fuser, examples, private: bool, seed: int = 0, resamples: int = 1000) -> dict:
    """Held-out NLL with the right context, another example's context and the sharer's KV zeroed;
    the communication gain NLL(other) - NLL(right) with a bootstrap 95% interval."""
    from kvviz.train_fuser import example_nlls

    partner = derangement(len(examples), seed, same=lambda i, j: examples[i].context == examples[j].context)
    right = example_nlls(pair, fuser, examples)
    if fuser.config.control:
        # the control never runs the sharer: every sharer input gives the same cache
        other = zero = right
    else:
        other = example_nlls(pair, fuser, examples, other_sharer(pair, examples, private, partner))
        zero = example_nlls(pair, fuser, examples, lambda i: "zero")
    tokens = [n for _, n in right]
    total = max(sum(tokens), 1)

    def nll(rows):
        return sum(r[0] for r in rows) / total

    gain_diffs = [o[0] - r[0] for o, r in zip(other, right)]
    zero_diffs = [z[0] - r[0] for z, r in zip(zero, right)]
    return {
        "examples": len(examples),
        "tokens": total,
        "nll": {"right": nll(right), "other": nll(other), "zero": nll(zero)},
        "gain": sum(gain_diffs) / total,
        "ci95": bootstrap_ratio(gain_diffs, tokens, seed, resamples),
        "zero_gain": sum(zero_diffs) / total,
        "zero_ci95": bootstrap_ratio(zero_diffs, tokens, seed, resamples),
        "other_context": "same query, another example's context" if private else "another example's sharer cache",
        "seed": seed,
        "resamples": resamples,
    }


def heldout_examples(pair, fuser, limit: int | None):
    """The fuser's held-out examples, rebuilt from its checkpoint config."""
    from kvviz.train_fuser import DEFAULTS, build_examples, split_records

    trained = fuser.config.training or {}
    data, seed = trained.get("data", DEFAULTS["data"]), trained.get("seed", DEFAULTS["seed"])
    heldout = trained.get("heldout", DEFAULTS["heldout"])
    _, records = split_records(data, seed, heldout, trained.get("context_only", False), train_count=1)
    examples = build_examples(
        pair, records, trained.get("max_prompt_tokens", DEFAULTS["max_prompt_tokens"]),
        trained.get("max_response_tokens", DEFAULTS["max_response_tokens"]), None,
        trained.get("receiver_sees_context", True), trained.get("max_sharer_tokens"), fuser.config.token_alignment,
        fuser.config.fuse_template,
    )
    return (examples[:limit] if limit is not None else examples), trained


def heldout_nll(pair, c2c_folder: Path, control_folder: Path | None, limit: int | None, seed: int = 0) -> dict:
    from kvviz.handoffs.c2c import get_fuser
    from kvviz.train_fuser import mean_nll

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


def answer_accuracy(pair, names: list[str], records, request_kwargs: dict, progress, label: str) -> dict:
    """Greedy answers of each handoff, scored by ``contains_answer`` and the KVComm F1 metric."""
    from kvviz.data import contains_answer, f1_match, wilson_interval
    from kvviz.engine import run_handoff
    from kvviz.results import HandoffRequest

    table = {name: {"contains": 0, "f1": 0, "n": 0, "skipped": 0, "examples": []} for name in names}
    for index, record in enumerate(records):
        request = HandoffRequest(query=record.question, context=record.context, **request_kwargs)
        for name in names:
            result = run_handoff(name, pair, request)
            row = table[name]
            if not result.applicable:
                row["skipped"] += 1
                row["reason"] = result.reason
                continue
            row["n"] += 1
            row["contains"] += contains_answer(result.answer, record.answers)
            row["f1"] += f1_match(result.answer, record.answers)
            if len(row["examples"]) < 5:
                row["examples"].append({"question": record.question, "gold": record.answers[0], "answer": result.answer})
        if (index + 1) % 10 == 0 or index + 1 == len(records):
            progress(f"{label}: {index + 1}/{len(records)}")
    for row in table.values():
        for metric in ("contains", "f1"):
            row[f"{metric}_accuracy"] = row[metric] / row["n"] if row["n"] else None
            row[f"{metric}_ci95"] = list(wilson_interval(row[metric], row["n"])) if row["n"] else None
    return table


def mc_accuracy(pair, names: list[str], datasets: list[str], limit: int, seed: int, request_kwargs: dict, progress) -> dict:
    from kvviz.data import LETTERS, choice_query, extract_choice_letter, load_dataset, wilson_interval
    from kvviz.engine import run_handoff
    from kvviz.results import HandoffRequest

    table = {}
    for dataset in datasets:
        records = load_dataset(dataset, limit=limit, seed=seed)
        counts = {name: {"correct": 0, "n": 0, "no_letter": 0, "skipped": 0, "seconds": 0.0} for name in names}
        for index, record in enumerate(records):
            request = HandoffRequest(query=choice_query(record), **request_kwargs)
            for name in names:
                result = run_handoff(name, pair, request)
                row = counts[name]
                if not result.applicable:
                    row["skipped"] += 1
                    row["reason"] = result.reason
                    continue
                letter = extract_choice_letter(result.answer, len(record.choices))
                row["n"] += 1
                row["no_letter"] += letter is None
                row["correct"] += letter == LETTERS[record.answer_index]
                row["seconds"] += result.total_seconds
            progress(f"{dataset}: {index + 1}/{len(records)}")
        for name, row in counts.items():
            low, high = wilson_interval(row["correct"], row["n"])
            row["accuracy"] = row["correct"] / row["n"] if row["n"] else None
            row["ci95"] = [low, high]
        table[dataset] = counts
    return table


OTHER_QUESTION = "c2c_other_question"  # the row of C2C with another question in the sharer


def paired_comparison(first: list[float], second: list[float], seed: int = 0, resamples: int = 1000) -> dict:
    """first - second over the same questions (0/1 correct, or any per-question score): the mean
    difference with a seeded bootstrap 95% interval over questions, and for 0/1 values the
    discordant counts and McNemar's exact p."""
    from kvviz.data import mcnemar_exact

    if len(first) != len(second) or not first:
        raise ValueError(f"a paired comparison needs two equally long, non-empty lists ({len(first)} and {len(second)})")
    diffs = [a - b for a, b in zip(first, second)]
    out = {"n": len(diffs), "difference": sum(diffs) / len(diffs), "ci95": bootstrap_ratio(diffs, [1] * len(diffs), seed, resamples)}
    if all(value in (0, 1) for value in list(first) + list(second)):
        only_first = sum(1 for a, b in zip(first, second) if a and not b)
        only_second = sum(1 for a, b in zip(first, second) if b and not a)
        out.update(only_first=only_first, only_second=only_second, mcnemar_p=mcnemar_exact(only_first, only_second))
    return out


def likelihood_row(correct: list[int], gold: list[float], letters: list[int] | None = None) -> dict:
    from kvviz.data import wilson_interval

    n = len(correct)
    row = {"n": n, "correct": sum(correct), "accuracy": sum(correct) / n if n else None,
           "ci95": list(wilson_interval(sum(correct), n)), "per_question": correct, "gold_score": gold}
    if letters is not None:
        row["letter_accuracy"] = sum(letters) / n if n else None
    return row


# the paired comparisons each dataset reports (those whose rows ran)
LIKELIHOOD_COMPARISONS = (
    ("c2c", OTHER_QUESTION, "communication gain: C2C minus C2C with another question in the sharer"),
    ("c2c", "receiver", "C2C minus the receiver alone"),
    (OTHER_QUESTION, "receiver", "C2C with another question in the sharer minus the receiver alone"),
    ("c2c", "c2c_control", "C2C minus its control"),
    ("c2c", "text", "C2C minus text"),
    ("text", "receiver", "text minus the receiver alone"),
)


def mc_likelihood(pair, names: list[str], datasets: list[str], limit: int, seed: int, request_kwargs: dict, c2c_folder, progress) -> dict:
    """Multiple choice by the likelihood of each choice (module doc, 3.), per dataset: each
    handoff's accuracy (and the letter it wrote), C2C with another question in the sharer, and
    the paired comparisons of ``LIKELIHOOD_COMPARISONS``."""
    from kvviz.bench.scoring import best_option, choice_likelihoods, option_scores
    from kvviz.data import LETTERS, choice_query, extract_choice_letter, load_dataset
    from kvviz.engine import run_handoff
    from kvviz.handoffs.c2c import fused_prompt, get_fuser, request_alignment
    from kvviz.results import HandoffRequest

    fuser = get_fuser(c2c_folder, pair) if "c2c" in names else None
    table = {}
    for dataset in datasets:
        records = load_dataset(dataset, limit=limit, seed=seed)
        requests = [HandoffRequest(query=choice_query(record), **request_kwargs) for record in records]
        partner = derangement(len(records), seed)
        row_names = names + ([OTHER_QUESTION] if fuser is not None else [])
        rows = {name: {"correct": [], "gold": [], "letters": []} for name in row_names}
        skipped: dict[str, str] = {}  # a handoff that could not score every question is left out

        def add(name, scores, record, letter_right=None):
            rows[name]["correct"].append(int(best_option(scores) == record.answer_index))
            rows[name]["gold"].append(scores[record.answer_index])
            if letter_right is not None:
                rows[name]["letters"].append(letter_right)

        for index, (record, request) in enumerate(zip(records, requests)):
            gold_letter = LETTERS[record.answer_index]
            for name in names:
                result = run_handoff(name, pair, request)
                if not result.applicable:
                    skipped[name] = result.reason
                    continue
                scores = choice_likelihoods(pair, record, name, request, result)
                if scores is None:
                    skipped[name] = "its descriptor cannot rebuild the receiver's state"
                    continue
                add(name, scores, record, int(extract_choice_letter(result.answer, len(record.choices)) == gold_letter))
            if fuser is not None:
                alignment = request_alignment(pair, request, fuser)
                other = request_alignment(pair, requests[partner[index]], fuser)
                prompt = fused_prompt(pair, fuser, alignment, other_prompt_sharer(pair, alignment, other))
                add(OTHER_QUESTION, option_scores(prompt, record.choices), record)
            if (index + 1) % 10 == 0 or index + 1 == len(records):
                progress(f"{dataset} (likelihood): {index + 1}/{len(records)}")
        measured = {
            name: likelihood_row(row["correct"], row["gold"], row["letters"] if row["letters"] else None)
            for name, row in rows.items() if name not in skipped
        }
        comparisons = []
        for first, second, label in LIKELIHOOD_COMPARISONS:
            if first in measured and second in measured:
                comparisons.append({
                    "first": first, "second": second, "label": label,
                    "accuracy": paired_comparison(measured[first]["per_question"], measured[second]["per_question"], seed),
                    "gold_score": paired_comparison(measured[first]["gold_score"], measured[second]["gold_score"], seed),
                })
        table[dataset] = {
            "ids": [record.id for record in records], "rows": measured, "comparisons": comparisons,
            "skipped": skipped, "partner": partner,
        }
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
    from kvviz.engine import load_pair
    from kvviz.handoffs import parse_handoffs
    from kvviz.fuser import checkpoint_label
    from kvviz.handoffs.c2c import resolve_fuser
    from kvviz.results import GenerationSettings, HandoffRequest

    if args.threads:
        torch.set_num_threads(args.threads)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    started = time.perf_counter()
    pair = load_pair(args.pair, args.device or "cpu", args.dtype, progress=log)
    probe = HandoffRequest(query="probe", c2c_fuser=args.fuser)
    c2c_folder, reason = resolve_fuser(pair, probe, control=False)
    if c2c_folder is None:
        raise ValueError(reason)
    if args.control:
        control_folder = Path(args.control)
    else:
        control_folder, _ = resolve_fuser(pair, HandoffRequest(query="probe", c2c_fuser=str(c2c_folder)), control=True)
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
    answer_kwargs = {"generation": GenerationSettings(max_new_tokens=args.answer_tokens), "c2c_fuser": str(c2c_folder)}
    if args.recall > 0:
        from kvviz import recall

        records = recall.generate("heldout", args.recall, seed=args.seed + 1)
        report.setdefault("answers", {})["recall (held-out entities)"] = answer_accuracy(
            pair, answer_names, records, answer_kwargs, log, "recall"
        )
    if args.countries > 0:
        from kvviz.data import load_dataset

        records = load_dataset("countries", limit=args.countries, seed=args.seed)
        report.setdefault("answers", {})["countries (context private to the sharer)"] = answer_accuracy(
            pair, answer_names, records, answer_kwargs, log, "countries"
        )
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if args.mc_limit > 0 and datasets:
        request_kwargs = {
            "generation": GenerationSettings(max_new_tokens=args.max_new_tokens),
            "text_message_tokens": args.message_tokens,
            "c2c_fuser": str(c2c_folder),
        }
        if args.mc_scoring == "likelihood":
            report["mc_likelihood"] = mc_likelihood(pair, names, datasets, args.mc_limit, args.seed, request_kwargs, c2c_folder, log)
        else:
            report["mc"] = mc_accuracy(pair, names, datasets, args.mc_limit, args.seed, request_kwargs, log)
    report["seconds"] = time.perf_counter() - started
    report["settings"] = {
        "mc_limit": args.mc_limit, "mc_scoring": args.mc_scoring, "seed": args.seed, "max_new_tokens": args.max_new_tokens, "message_tokens": args.message_tokens,
        "recall": args.recall, "countries": args.countries, "answer_tokens": args.answer_tokens,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
