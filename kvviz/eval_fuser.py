"""Evaluate a C2C fuser: ``python -m kvviz eval-fuser --pair embedded [--json]``.

1. Held-out response NLL (nats per token, the fuser's own held-out split rebuilt from its
   checkpoint config): receiver alone vs the control fuser vs C2C, hard gates as at inference.
2. Multiple-choice accuracy on ARC-Challenge and OpenBookQA subsets (seeded sample) for the
   receiver, the sharer, the text handoff and C2C (and the control), each with a 95% Wilson
   interval. Every answer is produced by the handoff itself (greedy) from the one multiple-choice
   prompt the benchmark uses too (``kvviz.data.choice_query``) and scored with
   ``extract_choice_letter``; no letter counts as wrong.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

def configure_parser(parser) -> None:
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--fuser", default=None, help="C2C fuser folder (default: the pair's shipped one)")
    parser.add_argument("--control", default=None, help="control fuser folder (default: beside --fuser, or shipped)")
    parser.add_argument("--heldout", type=int, default=None, help="held-out examples for NLL (default: the fuser's own split)")
    parser.add_argument("--datasets", default="arc_challenge,openbookqa")
    parser.add_argument("--mc-limit", type=int, default=30, help="questions per multiple-choice dataset")
    parser.add_argument("--handoffs", default="receiver,sharer,text,c2c,c2c_control")
    parser.add_argument("--max-new-tokens", type=int, default=6)
    parser.add_argument("--message-tokens", type=int, default=32, help="text handoff message bound")
    parser.add_argument("--seed", type=int, default=0, help="seed of the multiple-choice sample")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)


def heldout_nll(pair, c2c_folder: Path, control_folder: Path | None, limit: int | None) -> dict:
    from kvviz.handoffs.c2c import get_fuser
    from kvviz.train_fuser import DEFAULTS, build_examples, mean_nll, split_records

    fuser = get_fuser(c2c_folder, pair)
    trained = fuser.config.training or {}
    data, seed = trained.get("data", DEFAULTS["data"]), trained.get("seed", DEFAULTS["seed"])
    heldout = trained.get("heldout", DEFAULTS["heldout"])
    _, records = split_records(data, seed, heldout, trained.get("context_only", False))
    examples = build_examples(
        pair, records, trained.get("max_prompt_tokens", DEFAULTS["max_prompt_tokens"]),
        trained.get("max_response_tokens", DEFAULTS["max_response_tokens"]), None,
        trained.get("receiver_sees_context", True), trained.get("max_sharer_tokens"),
    )
    if limit is not None:
        examples = examples[:limit]
    rows = {"receiver": mean_nll(pair, None, examples)}
    if control_folder is not None:
        rows["control"] = mean_nll(pair, get_fuser(control_folder, pair), examples)
    rows["c2c"] = mean_nll(pair, fuser, examples)
    return {
        "data": data, "seed": seed, "examples": len(examples), "context": trained.get("context", "shared"),
        "context_only": trained.get("context_only", False),
        "tokens": sum(len(e.response_ids) for e in examples), "nll": rows,
    }


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
    log("held-out NLL ...")
    report["heldout"] = heldout_nll(pair, c2c_folder, control_folder, args.heldout)
    names = parse_handoffs(args.handoffs)
    if not control_folder:
        names = [n for n in names if n != "c2c_control"]
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if args.mc_limit > 0 and datasets:
        request_kwargs = {
            "generation": GenerationSettings(max_new_tokens=args.max_new_tokens),
            "text_message_tokens": args.message_tokens,
            "c2c_fuser": str(c2c_folder),
        }
        report["mc"] = mc_accuracy(pair, names, datasets, args.mc_limit, args.seed, request_kwargs, log)
    report["seconds"] = time.perf_counter() - started
    report["settings"] = {"mc_limit": args.mc_limit, "seed": args.seed, "max_new_tokens": args.max_new_tokens, "message_tokens": args.message_tokens}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
