"""Stage 2 of the KV translator: training through the frozen receiver (``kvviz.studies.c2c.translator_train``).

    # the teacher's tensors of private-context examples (once; the receiver reads them in training only)
    python research/translator_stage2.py teacher --init DATA/ridge/rank768 \\
        --out DATA/teacher --recall 1200 --dolly 300
    # train from the ridge warm start on the attention-output loss (and, optionally, answer NLL)
    python research/translator_stage2.py train --init DATA/ridge/rank768 \\
        --teacher DATA/teacher --out DATA/stage2 --epochs 4

Training examples: ``kvviz.recall`` train-split records (names and values of the train pools
only), the Countries records outside the evaluators' 100, and Dolly records with an input (the
instruction is the question, the input the private context, the first 16 tokens of the response
the answer). Validation: recall held-out records drawn with another seed than the evaluators'
(``translator_eval`` uses seed 1; this uses 50), never the evaluation records themselves.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvviz.handoffs.translate import align as tr_align
from kvviz.handoffs.translate import prefix as tr_prefix
from kvviz.handoffs.translate import translator as tr  # noqa: E402
from kvviz.studies.c2c import translator_train as tt  # noqa: E402

SHARD = 50
ANSWER_TOKENS = 16
VALIDATION_SEED = 50


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)


def training_records(recall_n: int, dolly_n: int, seed: int):
    from kvviz.data import load_dataset, recall
    from kvviz.studies.c2c.translator_sets import countries_split

    records = [("recall", r) for r in recall.generate("train", recall_n, seed=200 + seed)]
    countries, _ = countries_split()
    records += [("countries", r) for r in countries]
    dolly = [r for r in load_dataset("dolly", seed=seed) if r.context and r.response and len(r.context) < 600]
    records += [("dolly", r) for r in dolly[:dolly_n]]
    random.Random(seed).shuffle(records)
    return records


def validation_records(n: int):
    from kvviz.data import recall

    return [("recall-heldout", r) for r in recall.generate("heldout", n, seed=VALIDATION_SEED)]


def answer_ids(tokenizer, record) -> list[int]:
    from kvviz.studies.c2c.examples import response_ids

    return response_ids(tokenizer, record.response or record.answers[0], ANSWER_TOKENS)


def write_teacher(args, pair, config, name: str, records) -> list[dict]:
    from safetensors.torch import save_file

    out = Path(args.out)
    index, tensors, shard = [], {}, 0
    started = time.perf_counter()
    for k, (source, record) in enumerate(records):
        ids = answer_ids(pair.receiver.tokenizer, record)
        example = tt.teacher_example(pair, config, record.context, record.question, ids)
        if example.context_length > 256:
            continue
        tensors.update(example.to_tensors(f"e{len(index) % SHARD}"))
        index.append({"id": record.id, "source": source, "shard": f"{name}-{shard:03d}.safetensors", "key": f"e{len(index) % SHARD}"})
        if len(index) % SHARD == 0:
            save_file(tensors, str(out / f"{name}-{shard:03d}.safetensors"))
            tensors, shard = {}, shard + 1
            log(f"{name}: {len(index)}/{len(records)} examples ({time.perf_counter() - started:.0f} s)")
    if tensors:
        save_file(tensors, str(out / f"{name}-{shard:03d}.safetensors"))
    return index


def teacher(args) -> int:
    from kvviz.engine.runner import load_pair

    pair = load_pair("embedded", "cpu", None, progress=lambda message: None)
    config = tr.read_config(args.init)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    validation = write_teacher(args, pair, config, "val", validation_records(args.validation))
    train = write_teacher(args, pair, config, "train", training_records(args.recall, args.dolly, args.seed))
    (out / "index.json").write_text(json.dumps({
        "sharer_layers": config.sharer_layers, "neighbours": config.neighbours, "sharer_start": config.sharer_start,
        "train": train, "val": validation, "command": "python research/translator_stage2.py " + " ".join(sys.argv[1:]),
    }, indent=2))
    log(f"wrote {len(train)} training and {len(validation)} validation examples to {out}")
    return 0


def load_examples(folder: Path, entries: list[dict], layers: int) -> list[tt.TeacherExample]:
    from safetensors.torch import load_file

    shards, out = {}, []
    for entry in entries:
        if entry["shard"] not in shards:
            shards = {entry["shard"]: load_file(str(folder / entry["shard"]))}
        out.append(tt.TeacherExample.from_tensors(shards[entry["shard"]], entry["key"], layers))
    return out


def mean_loss(loss_fn, translator, examples) -> tuple[float, list[float]]:
    with torch.no_grad():
        totals, per_layer = 0.0, None
        for example in examples:
            value, layers = loss_fn(translator, example)
            totals += float(value)
            per_layer = layers if per_layer is None else [a + b for a, b in zip(per_layer, layers)]
    return totals / len(examples), [round(v / len(examples), 4) for v in per_layer]


def train(args) -> int:
    from kvviz.engine.runner import load_pair

    torch.manual_seed(args.seed)
    pair = load_pair("embedded", "cpu", None, progress=lambda message: None)
    translator = tr.load_translator(args.init, pair.sharer.facts, pair.receiver.facts, pair.name)
    folder = Path(args.teacher)
    index = json.loads((folder / "index.json").read_text())
    if index["sharer_layers"] != translator.config.sharer_layers or index["neighbours"] != translator.config.neighbours:
        raise ValueError("the teacher's features were made for another feature layout than the translator's")
    layers = pair.receiver.facts.num_layers
    val = load_examples(folder, index["val"], layers)
    train_entries = index["train"][: args.limit] if args.limit else index["train"]
    log(f"{len(train_entries)} training examples, {len(val)} validation")
    loss_fn = tt.AttentionLoss(pair.receiver)
    translator.train()
    groups = [
        {"params": [p for n, p in translator.named_parameters() if n in ("down", "up")], "lr": args.lr},
        {"params": [translator.weight_proj, translator.weight_bias], "lr": args.lr * 10},
        {"params": [translator.gate_logits], "lr": args.gate_lr},
    ]
    optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "loss.csv"
    with log_path.open("w", newline="") as handle:
        csv.writer(handle).writerow(["epoch", "step", "train_loss", "val_loss", "seconds"])
    started = time.perf_counter()
    val_loss, val_layers = mean_loss(loss_fn, translator, val)
    log(f"start: validation attention loss {val_loss:.4f} per layer {val_layers}")
    best = (val_loss, 0)
    history = [{"epoch": 0, "val": val_loss, "val_layers": val_layers}]
    step = 0
    rng = random.Random(args.seed)
    for epoch in range(1, args.epochs + 1):
        shard_names = sorted({e["shard"] for e in train_entries})
        rng.shuffle(shard_names)
        running, count = 0.0, 0
        for shard_name in shard_names:
            entries = [e for e in train_entries if e["shard"] == shard_name]
            examples = load_examples(folder, entries, layers)
            rng.shuffle(examples)
            for start in range(0, len(examples), args.batch):
                optimizer.zero_grad(set_to_none=True)
                for example in examples[start : start + args.batch]:
                    value, _ = loss_fn(translator, example, args.answer_weight)
                    (value / args.batch).backward()
                    running += float(value)
                    count += 1
                torch.nn.utils.clip_grad_norm_(translator.parameters(), 1.0)
                optimizer.step()
                step += 1
                if step % 20 == 0:
                    log(f"epoch {epoch} step {step}: train loss {running / count:.4f}")
        val_loss, val_layers = mean_loss(loss_fn, translator, val)
        elapsed = time.perf_counter() - started
        log(f"epoch {epoch}: train {running / max(count, 1):.4f}, validation {val_loss:.4f} ({elapsed:.0f} s)")
        with log_path.open("a", newline="") as handle:
            csv.writer(handle).writerow([epoch, step, f"{running / max(count, 1):.5f}", f"{val_loss:.5f}", f"{elapsed:.0f}"])
        history.append({"epoch": epoch, "train": running / max(count, 1), "val": val_loss, "val_layers": val_layers,
                        "gates_open": int(translator.open_gates().sum())})
        translator.config.training = {
            **translator.config.training, "stage": "ridge + attention-output training",
            "stage2": {"epochs": epoch, "lr": args.lr, "batch": args.batch, "examples": len(train_entries),
                       "answer_weight": args.answer_weight, "validation_loss": val_loss, "teacher": str(folder),
                       "command": "python research/translator_stage2.py " + " ".join(sys.argv[1:])},
        }
        translator.save(out / f"epoch{epoch}", dtype=torch.float32)
        if val_loss < best[0]:
            best = (val_loss, epoch)
    (out / "history.json").write_text(json.dumps({"history": history, "best_epoch": best[1]}, indent=2))
    log(f"best validation loss {best[0]:.4f} at epoch {best[1]}")
    return 0


def validation_nll(pair, translator, records) -> float:
    """Mean gold-answer NLL per token with hard gates (as at inference) on the validation records."""
    total, tokens = 0.0, 0
    with torch.no_grad():
        for _, record in records:
            ids = answer_ids(pair.receiver.tokenizer, record)
            alignment = tr_align.align_context(pair.receiver.tokenizer, pair.sharer.tokenizer, record.context, translator.config.sharer_start)
            prefix, _, _ = tr_prefix.translate(pair, translator, alignment)
            from kvviz.core.prompts import build_segments

            query_ids = build_segments(pair.receiver.tokenizer, record.question).query_ids
            total += float(tr_prefix.nll_after(pair.receiver, prefix.state, query_ids, ids))
            tokens += len(ids)
    return total / tokens


def train_nll(args) -> int:
    """End to end: the gold answer's NLL through the frozen receiver, from a stage-2 checkpoint."""
    from kvviz.engine.runner import load_pair

    torch.manual_seed(args.seed)
    pair = load_pair("embedded", "cpu", None, progress=lambda message: None)
    pair.receiver.model.requires_grad_(False)
    translator = tr.load_translator(args.init, pair.sharer.facts, pair.receiver.facts, pair.name)
    records = training_records(args.recall, args.dolly, args.seed + 1)  # other records than the teacher's
    val = validation_records(args.validation)
    optimizer = torch.optim.AdamW([
        {"params": [p for n, p in translator.named_parameters() if n in ("down", "up")], "lr": args.lr},
        {"params": [translator.weight_proj, translator.weight_bias], "lr": args.lr * 10},
        {"params": [translator.gate_logits], "lr": args.gate_lr},
    ], weight_decay=0.0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    history = [{"step": 0, "val_nll": validation_nll(pair, translator, val)}]
    log(f"start: validation NLL {history[0]['val_nll']:.4f}")
    started, running, count = time.perf_counter(), 0.0, 0
    translator.train()
    for step in range(1, args.steps + 1):
        optimizer.zero_grad(set_to_none=True)
        for k in range(args.batch):
            _, record = records[((step - 1) * args.batch + k) % len(records)]
            ids = answer_ids(pair.receiver.tokenizer, record)
            loss, n = tt.answer_nll(pair, translator, record.context, record.question, ids)
            (loss / n / args.batch).backward()
            running += float(loss) / n
            count += 1
        torch.nn.utils.clip_grad_norm_(translator.parameters(), 1.0)
        optimizer.step()
        if step % 10 == 0:
            log(f"step {step}: train NLL {running / count:.4f} ({time.perf_counter() - started:.0f} s)")
            running, count = 0.0, 0
        if step % args.eval_every == 0 or step == args.steps:
            value = validation_nll(pair, translator, val)
            history.append({"step": step, "val_nll": value, "gates_open": int(translator.open_gates().sum())})
            log(f"step {step}: validation NLL {value:.4f}")
            translator.config.training = {
                **translator.config.training, "stage": translator.config.training.get("stage", "ridge") + " + answer NLL",
                "nll_stage": {"steps": step, "lr": args.lr, "batch": args.batch, "validation_nll": value,
                              "command": "python research/translator_stage2.py " + " ".join(sys.argv[1:])},
            }
            translator.save(out / f"step{step}", dtype=torch.float32)
            (out / "history.json").write_text(json.dumps(history, indent=2))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("teacher", "train", "nll"))
    parser.add_argument("--steps", type=int, default=200, help="nll: optimizer steps")
    parser.add_argument("--eval-every", type=int, default=50, help="nll: validation every N steps")
    parser.add_argument("--init", required=True, help="the ridge translator (its feature layout)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--teacher", default=None)
    parser.add_argument("--recall", type=int, default=1200)
    parser.add_argument("--dolly", type=int, default=300)
    parser.add_argument("--validation", type=int, default=60)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--gate-lr", type=float, default=0.05)
    parser.add_argument("--answer-weight", type=float, default=2.0, help="weight of answer positions in the loss")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return {"teacher": teacher, "train": train, "nll": train_nll}[args.mode](args)


if __name__ == "__main__":
    raise SystemExit(main())
