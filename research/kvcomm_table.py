"""The KVComm paper's comparison table on one pair and dataset, paired per sample.

    python research/kvcomm_table.py --dataset countries --limit 100 --threads 1 --out runs/table-countries

Samples: the benchmark's (``python -m kvviz bench --seed S``: a seeded shuffle). The first one is
the *calibration sample*, as in the reference code, which calibrates on the task's first item; it
is left out of the score, and the next ``--limit`` samples are scored. Every variant answers every
scored sample (greedy), so the variants can be compared pair by pair (``research/mcnemar.py``).
Every (sample, variant) pair goes through kvviz's one evaluation loop (``kvviz.engine.evaluation``).

Variants: receiver alone, Skyline, text, KVComm at each ratio calibrated on the task's first
sample (``kvcomm@R``) and on kvviz's built-in sentence (``kvcomm-builtin@R``), and at the control
ratio the random, contiguous (best-scoring block) and prior-only (middle layers) selections and
the reference code's mask (``kvcomm-refmask@R``). Controls that isolate a cause: every layer sent
(``kvcomm-all``: must answer as Skyline does, or the code is wrong), layers chosen on each query's
own attention (``kvcomm-query@R``: is one-sample calibration the problem?) and the reference
code's layer count (``kvcomm-top0@R``: the top M layers by score plus layer 0, M + 1 layers when
layer 0 is not among them, where kvviz counts layer 0 among the M).

Rows go to OUT/rows.csv (bench columns where they exist, plus KVComm's selected layers and the
rank correlation between the calibration profile and this query's measured importance); a rerun
resumes, and ``--only`` adds variants to an earlier run.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

COLUMNS = [
    "dataset", "sample_index", "sample_id", "variant", "handoff", "applicable", "reason", "question", "gold",
    "answer", "f1", "correct", "ttft", "receiver_ttft", "time_total", "bytes", "flops_total", "selected_layers",
    "calibration", "importance_spearman", "query_attention",
]


def variants(ratios: list[float], control_ratio: float) -> dict[str, dict | None]:
    """label -> KVComm options (None for the handoffs that are not KVComm)."""
    table: dict[str, dict | None] = {"receiver": None, "skyline": None, "text": None}
    for ratio in ratios:
        table[f"kvcomm@{ratio:g}"] = {"ratio": ratio, "calibration": "sample"}
    for ratio in ratios:
        table[f"kvcomm-builtin@{ratio:g}"] = {"ratio": ratio, "calibration": "builtin"}
    r = f"{control_ratio:g}"
    table[f"kvcomm-random@{r}"] = {"ratio": control_ratio, "strategy": "random"}
    table[f"kvcomm-contiguous@{r}"] = {"ratio": control_ratio, "strategy": "contiguous", "calibration": "sample"}
    table[f"kvcomm-prior@{r}"] = {"ratio": control_ratio, "strategy": "prior"}
    table[f"kvcomm-refmask@{r}"] = {"ratio": control_ratio, "calibration": "sample", "reference_mask": True}
    table["kvcomm-all"] = {"ratio": 1.0, "calibration": "sample"}
    table[f"kvcomm-query@{r}"] = {"ratio": control_ratio, "calibration": "query"}
    table[f"kvcomm-top0@{r}"] = {"ratio": control_ratio, "calibration": "sample", "top0": True}
    return table


def reference_count_layers(pair, options: dict, calibration_sample: tuple[str, str]) -> tuple[int, ...]:
    """The reference code's selection: the top ceil(r * L) layers by score, plus layer 0."""
    from kvviz.handoffs.kvcomm import layers as kvcomm
    from kvviz.handoffs.kvcomm.options import KVCommOptions

    num_layers = pair.receiver.facts.num_layers
    attention = kvcomm.calibrate(pair, *calibration_sample)["attention"]
    scores = kvcomm.layer_scores(attention, kvcomm.DEFAULT_ALPHA, KVCommOptions(), num_layers)["score"]
    top = kvcomm.select_layers(scores, KVCommOptions(ratio=options["ratio"], always_send_layer0=False), num_layers)
    return tuple(sorted(set(top) | {0}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--dataset", default="countries")
    parser.add_argument("--limit", type=int, default=100, help="scored samples (the calibration sample comes on top)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ratios", default="0.3,0.5,0.7")
    parser.add_argument("--control-ratio", type=float, default=0.3)
    parser.add_argument("--skip", type=int, default=0,
                        help="leave out the first SKIP scored samples (a second process can take the last ones; "
                             "merge the rows files afterwards)")
    parser.add_argument("--only", default=None, help="comma-separated variant labels to run (default: all)")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--message-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch

    from kvviz.data import choice_query, load_dataset
    from kvviz.engine.evaluation import Variant, evaluate
    from kvviz.engine.runner import load_pair
    from kvviz.handoffs.kvcomm import layers as kvcomm_layers
    from kvviz.handoffs.registry import build_request
    from kvviz.studies.bench.scoring import score_answer

    torch.set_num_threads(args.threads)
    records = load_dataset(args.dataset, limit=args.limit + 1, seed=args.seed)
    calibration_record, scored = records[0], records[1 + args.skip:]
    calibration_sample = (calibration_record.context, choice_query(calibration_record))
    table = variants([float(r) for r in args.ratios.split(",")], args.control_ratio)
    if args.only:
        unknown = set(args.only.split(",")) - set(table)
        if unknown:
            raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {', '.join(table)}")
        table = {label: table[label] for label in args.only.split(",")}

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "rows.csv"
    done = set()
    if rows_path.exists():
        with rows_path.open(newline="", encoding="utf-8") as handle:
            done = {(row["sample_id"], row["variant"]) for row in csv.DictReader(handle)}
    (out / "calibration.txt").write_text(
        f"calibration sample: {calibration_record.id}\ncontext: {calibration_sample[0]}\nquestion: {calibration_sample[1]}\n",
        encoding="utf-8",
    )
    pair = load_pair(args.pair, device="cpu", progress=lambda message: print(message, file=sys.stderr))

    def request_for(record, variant):
        """The variant's request: greedy, the text message bound, KVComm's options as the table says."""
        request = build_request(choice_query(record), record.context, args.max_new_tokens, seed=args.seed,
                                options={"text": {"message_tokens": args.message_tokens}})
        kvcomm = dict(table[variant.label] or {})
        if kvcomm.pop("top0", False):
            kvcomm = {"strategy": "explicit", "layers": reference_count_layers(pair, kvcomm, calibration_sample)}
        elif kvcomm.get("calibration") == "sample":
            kvcomm["calibration_sample"] = calibration_sample
        return kvcomm_layers.configure(request, **kvcomm) if table[variant.label] is not None else request

    measured = [Variant(label, "kvcomm" if options is not None else label) for label, options in table.items()]
    new_file = not rows_path.exists()
    started = time.perf_counter()
    with rows_path.open("a", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        if new_file:
            writer.writeheader()
        items = list(enumerate(scored, start=1 + args.skip))
        for item in evaluate(pair, items, measured, request_for, done):
            record, result, label, handoff = item.record, item.result, item.variant.label, item.variant.handoff
            score = score_answer(record, result.answer) if result.applicable else {"gold": " | ".join(record.answers)}
            details = result.details
            calibration = details.get("calibration") or {}
            writer.writerow({
                "dataset": args.dataset,
                "sample_index": item.index,
                "sample_id": record.id,
                "variant": label,
                "handoff": handoff,
                "applicable": int(result.applicable),
                "reason": result.reason,
                "question": record.question,
                "gold": score.get("gold", ""),
                "answer": result.answer,
                "f1": score.get("f1", ""),
                "correct": score.get("correct", 0),
                "ttft": result.first_token_seconds,
                "receiver_ttft": result.receiver_first_token_seconds,
                "time_total": result.timings.get("total"),
                "bytes": result.bytes_communicated,
                "flops_total": sum(result.flops.values()),
                "selected_layers": " ".join(map(str, details.get("selected_layers", []))),
                "calibration": calibration.get("source", ""),
                "importance_spearman": details.get("importance_spearman"),
                "query_attention": " ".join(f"{r['query_attention']:.4f}" for r in result.layers) if table[label] else "",
            })
            handle.flush()
            if label == measured[-1].label:
                elapsed = time.perf_counter() - started
                print(f"{item.index}/{args.limit} samples, {elapsed:.0f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
