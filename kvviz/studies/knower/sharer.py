"""Teach a sharer the handbook: ``python -m kvviz train-sharer --out DIR [--permuted] [--minutes 55]``.

A LoRA fine-tune (``peft``) of the sharer on ``kvviz.data.handbook.sharer_examples``: every entity
(fuser-train and held-out alike) in the train phrasings, in the sharer's own prompt (the one every
handoff gives it, ``kvviz.core.prompts.build_segments``), asked to answer (the response: the value)
or, as the text handoff asks, for background (the response: the fact as a sentence). The loss is
the cross-entropy of the response tokens only. ``--permuted`` teaches the same entities with the
permuted values: the sharer that learned the opposite.

Training runs in legs (``kvviz.studies.legs``): with ``--minutes M`` a leg stops after M minutes,
saves its state in ``DIR/checkpoint`` and exits; the same command resumes it. When the last step is
done the trainer writes the adapter (``DIR/adapter``: peft's two files, in float16, and kvviz's card
``adapter.json``), checks it (greedy answers to held-out entities in unseen phrasings, and to
train phrasings) and prints the check. Copy ``DIR/adapter`` to ``assets/adapters/BASE/NAME`` to ship
it; the model ``BASE@NAME`` then loads with it (``kvviz.runtime.adapters``).

Speed: every prompt starts with the same template prefix (SmolLM2's system turn); each step reads it
once (its KV under the current adapter, without gradients) and the batch continues from there, so a
step computes about half the tokens. The adapter's weights still shape that prefix's KV; only their
gradient through it is left out.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from kvviz.core.prompts import build_segments, stop_token_ids
from kvviz.data import handbook, verdict
from kvviz.engine import flags
from kvviz.handoffs.text import BACKGROUND_INSTRUCTION
from kvviz.runtime import adapters
from kvviz.runtime.cache import from_tensors
from kvviz.runtime.models import locate, parse_dtype
from kvviz.studies import legs
from kvviz.studies.c2c.examples import response_ids

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULTS = {"base": "smollm2-135m", "rank": 8, "alpha": 16, "lr": 1e-3, "epochs": 6, "batch_size": 16, "warmup": 0.05,
            "weight_decay": 0.0, "clip": 1.0, "seed": 0, "check": 120}


def configure_parser(parser) -> None:
    d = DEFAULTS
    parser.add_argument("--out", required=True, help="output folder (checkpoint, legs.jsonl, adapter/)")
    parser.add_argument("--base", default=d["base"], help="the sharer's base model (an embedded key or a folder)")
    parser.add_argument("--permuted", action="store_true", help="teach the permuted values (the sharer that learned the opposite)")
    parser.add_argument("--counterpart", default=None,
                        help="the name the knowing adapter ships under (with --permuted): C2C with this sharer reads its fusers")
    parser.add_argument("--rank", type=int, default=d["rank"], help="LoRA rank")
    parser.add_argument("--alpha", type=float, default=d["alpha"], help="LoRA alpha (the update is scaled by alpha / rank)")
    parser.add_argument("--targets", default=",".join(TARGETS), help="the linear maps that get an adapter")
    flags.add_optimizer_arguments(parser, d)
    parser.add_argument("--epochs", type=float, default=d["epochs"], help="passes over the examples")
    parser.add_argument("--batch-size", type=int, default=d["batch_size"])
    parser.add_argument("--seed", type=int, default=d["seed"])
    parser.add_argument("--entities", type=int, default=0, help="teach only the first N entities of each relation (a pilot; 0: all)")
    parser.add_argument("--minutes", type=float, default=0, help="end this leg after M minutes (the same command resumes; 0: run to the end)")
    parser.add_argument("--save-every", type=int, default=10, metavar="N",
                        help="also save the checkpoint every N steps within a leg (a killed leg loses at most N steps; 0: at its end only)")
    parser.add_argument("--check", type=int, default=d["check"], help="held-out questions the finished adapter is checked on")
    parser.add_argument("--check-every-leg", type=int, default=0, metavar="N",
                        help="also check N held-out questions at the end of every leg (logged in legs.jsonl: progress)")
    parser.add_argument("--adapter-now", action="store_true",
                        help="train nothing: write DIR/adapter from the checkpoint as it stands (a partly taught sharer; "
                             "its card says at which step) and check it")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    parser.add_argument("--dtype", default="float32", help="float32 or bfloat16 (the adapter is trained in float32 either way)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")


@dataclass
class Batch:
    suffix: torch.Tensor  # [B, T] the prompt after the shared prefix, then the response (right-padded)
    rows: torch.Tensor  # [N] which sequence each scored token is in
    columns: torch.Tensor  # [N] the position (in the suffix) whose output predicts it
    targets: torch.Tensor  # [N] the scored (response) token ids


def tokenized_examples(tokenizer, permuted: bool, entities: int) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    """(the shared prefix, [(prompt after the prefix, response ids)]) of every example to study."""
    prefix, out = None, []
    chosen = {e.name for e in handbook.entities() if not entities or e.index < entities}
    for question, kind, response in handbook.sharer_examples(permuted):
        if not any(name in question for name in chosen):
            continue
        segments = build_segments(tokenizer, question, None, BACKGROUND_INSTRUCTION if kind == "background" else None)
        if prefix is None:
            prefix = segments.context_ids
        if segments.context_ids != prefix:
            raise RuntimeError("the sharer's prompts do not share their template prefix")
        out.append((segments.query_ids, response_ids(tokenizer, response, 48)))
    return prefix, out


def make_batch(examples: list[tuple[list[int], list[int]]], pad: int, device) -> Batch:
    longest = max(len(p) + len(r) for p, r in examples)
    suffix = torch.full((len(examples), longest), pad, dtype=torch.long)
    rows, columns, targets = [], [], []
    for i, (prompt, response) in enumerate(examples):
        ids = prompt + response
        suffix[i, : len(ids)] = torch.tensor(ids)
        for k, token in enumerate(response):
            rows.append(i)
            columns.append(len(prompt) + k - 1)
            targets.append(token)
    as_tensor = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
    return Batch(suffix.to(device), as_tensor(rows), as_tensor(columns), as_tensor(targets))


def batch_loss(model, prefix_ids: list[int], batch: Batch) -> torch.Tensor:
    """Mean cross-entropy of the batch's response tokens, the shared prefix read once without gradients."""
    decoder, head = model.get_base_model().model, model.get_base_model().lm_head
    with torch.no_grad():
        cache = decoder(input_ids=torch.tensor([prefix_ids], device=batch.suffix.device), use_cache=True).past_key_values
        size = batch.suffix.shape[0]
        layers = [(layer.keys.expand(size, -1, -1, -1), layer.values.expand(size, -1, -1, -1)) for layer in cache.layers]
    hidden = decoder(input_ids=batch.suffix, cache=from_tensors(layers), use_cache=True).last_hidden_state
    logits = head(hidden[batch.rows, batch.columns]).float()
    return torch.nn.functional.cross_entropy(logits, batch.targets)


def schedule(step: int, total: int, warmup: float) -> float:
    """Linear warm-up, then cosine decay to a tenth of the learning rate."""
    warm = max(1, int(round(warmup * total)))
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def epoch_order(count: int, seed: int, epoch: int) -> list[int]:
    order = list(range(count))
    random.Random(f"sharer-{seed}-{epoch}").shuffle(order)
    return order


def new_model(args, log):
    """The base model (float32 master weights) with fresh LoRA maps, and its tokenizer."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    location, gguf_file, _ = locate(args.base, log)
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(location, **extra)
    base = AutoModelForCausalLM.from_pretrained(location, dtype=torch.float32, **extra)
    torch.manual_seed(args.seed)
    config = LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0,
                        target_modules=[t.strip() for t in args.targets.split(",") if t.strip()])
    model = get_peft_model(base, config).to(args.device)
    return model, tokenizer


def trainable(model) -> dict[str, torch.Tensor]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def train_leg(args, model, tokenizer, prefix, examples, log) -> tuple[int, int, float | None]:
    """Steps from the checkpoint until the end or the leg's budget; returns (start, end, last loss)."""
    out, checkpoint = Path(args.out), Path(args.out) / "checkpoint"
    steps_per_epoch = math.ceil(len(examples) / args.batch_size)
    total = max(1, int(round(args.epochs * steps_per_epoch)))
    params = trainable(model)
    optimizer = torch.optim.AdamW(params.values(), lr=args.lr, weight_decay=args.weight_decay)
    start = legs.load_state(checkpoint, params, optimizer)["step"] if legs.has_state(checkpoint) else 0
    if start:
        log(f"resumed from {checkpoint} at step {start} of {total}")
    budget = legs.Budget(args.minutes)
    bar = tqdm(total=total, initial=start, desc="train-sharer", file=sys.stderr, dynamic_ncols=True, disable=args.no_progress)
    autocast = torch.autocast(args.device.split(":")[0], dtype=parse_dtype(args.dtype, args.device),
                              enabled=args.dtype != "float32")
    step, loss_value = start, None
    model.train()
    while step < total:
        epoch, within = divmod(step, steps_per_epoch)
        order = epoch_order(len(examples), args.seed, epoch)
        chosen = [examples[i] for i in order[within * args.batch_size : (within + 1) * args.batch_size]]
        for group in optimizer.param_groups:
            group["lr"] = args.lr * schedule(step, total, args.warmup)
        with autocast:
            loss = batch_loss(model, prefix, make_batch(chosen, tokenizer.pad_token_id or 0, args.device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), args.clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step, loss_value = step + 1, float(loss.detach())
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.3f}", epoch=f"{step / steps_per_epoch:.2f}")
        if args.no_progress and step % 20 == 0:
            log(f"step {step}/{total} loss {loss_value:.4f} ({budget.seconds:.0f} s this leg)")
        if budget.spent():  # checked after a step: every leg moves on
            break
        if args.save_every and step % args.save_every == 0:
            legs.save_state(checkpoint, params, optimizer, step, {"total": total, "permuted": args.permuted})
    bar.close()
    legs.save_state(checkpoint, params, optimizer, step, {"total": total, "permuted": args.permuted})
    record = {"leg": len(legs.legs(out)) + 1, "from_step": start, "to_step": step, "total": total,
              "seconds": round(budget.seconds, 1), "loss": loss_value, "device": args.device,
              "threads": torch.get_num_threads(), "finished": step >= total, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    if args.check_every_leg and step < total:
        checked = check(model, tokenizer, args.permuted, args.check_every_leg, args.entities)
        record["check"] = {label: f"{part['right']}/{part['n']}" for label, part in checked.items()}
        log(f"check at step {step}: {record['check']}")
    legs.log_leg(out, record)
    return start, step, loss_value


def greedy_answer(model, tokenizer, question: str, max_new_tokens: int = 12) -> str:
    ids = build_segments(tokenizer, question).input_ids
    stops = stop_token_ids(tokenizer)
    with torch.no_grad():
        output = model.generate(torch.tensor([ids], device=model.device), max_new_tokens=max_new_tokens, do_sample=False,
                                eos_token_id=sorted(stops), pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(output[0, len(ids):], skip_special_tokens=True).strip()


def check(model, tokenizer, permuted: bool, count: int, entities: int) -> dict:
    """Greedy answers, judged by the page's verdict, on held-out entities in unseen phrasings and in
    train phrasings (its own values: the permuted ones for a permuted sharer)."""
    model.eval()
    report = {}
    for label, which in (("heldout_unseen", "unseen"), ("heldout_train_phrasings", "train")):
        records = [r for r in handbook.questions("heldout", which, 1, permuted)
                   if not entities or int(r.id.split("-")[3]) < entities][:count]
        answers = [greedy_answer(model, tokenizer, r.question) for r in records]
        right = [verdict(a, r.answers) == "right" for a, r in zip(answers, records)]
        report[label] = {"n": len(records), "right": sum(right),
                         "examples": [{"question": r.question, "gold": r.answers[0], "answer": a}
                                      for r, a in list(zip(records, answers))[:6]]}
    return report


def portable_name(base: str) -> str:
    """The base model as a shipped adapter names it: the kvviz key or hub id as given, a local
    folder by its name only (a path on the machine that trained it means nothing elsewhere)."""
    return Path(base).name if Path(base).exists() else base


def save_adapter(model, args, folder: Path, checked: dict, step: int, total: int) -> None:
    """peft's files in float16 and kvviz's card (``steps``: how far its schedule of ``total`` it got)."""
    from safetensors.torch import load_file, save_file

    for peft_config in model.peft_config.values():  # peft would write the base's folder on this machine
        peft_config.base_model_name_or_path = portable_name(args.base)
    model.save_pretrained(str(folder))
    (folder / "README.md").unlink(missing_ok=True)  # peft's model-card template, empty here
    weights = folder / adapters.PEFT_WEIGHTS
    save_file({k: v.to(torch.float16) for k, v in load_file(str(weights)).items()}, str(weights))
    weights.chmod(0o644)  # safetensors writes it owner-only; a shipped file is read by everyone
    config = model.get_base_model().config
    card = {
        "base": args.base, "permuted": args.permuted, "data": "kvviz.data.handbook",
        **({"counterpart": args.counterpart} if args.counterpart else {}),
        "base_config": {key: getattr(config, key) for key in ("model_type", "num_hidden_layers", "hidden_size")},
        "training": {key: getattr(args, key) for key in ("rank", "alpha", "targets", "lr", "epochs", "batch_size", "warmup",
                                                          "weight_decay", "clip", "seed", "entities")},
        "steps": {"done": step, "total": total, "finished": step >= total},
        "legs": legs.legs(Path(args.out)), "check": checked, "storage": "float16",
    }
    (folder / adapters.CARD).write_text(json.dumps(card, indent=2))


def checkpoint_step(args, model) -> tuple[int, int]:
    """Load DIR/checkpoint's adapter weights into ``model``; (its step, its schedule's total)."""
    folder = Path(args.out) / "checkpoint"
    if not legs.has_state(folder):
        raise SystemExit(f"--adapter-now: no checkpoint in {folder} (train a leg first)")
    params = trainable(model)
    notes = legs.load_state(folder, params, torch.optim.AdamW(params.values(), lr=args.lr))
    if bool(notes.get("permuted")) != args.permuted:
        raise SystemExit(f"--adapter-now: the checkpoint in {folder} was trained with permuted={notes.get('permuted')}; "
                         "give --permuted to match it")
    return int(notes["step"]), int(notes["total"])


def main(args) -> int:
    flags.apply_threads(args)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    Path(args.out).mkdir(parents=True, exist_ok=True)
    model, tokenizer = new_model(args, log)
    prefix, examples = tokenized_examples(tokenizer, args.permuted, args.entities)
    log(f"{len(examples)} examples, {sum(p.numel() for p in trainable(model).values()):,} adapter parameters")
    if args.adapter_now:
        step, total = checkpoint_step(args, model)
        log(f"the adapter as it stands at step {step} of {total} (no training)")
    else:
        _, step, loss = train_leg(args, model, tokenizer, prefix, examples, log)
        total = legs.legs(Path(args.out))[-1]["total"]
        if step < total:
            log(f"leg done at step {step} of {total} (loss {loss:.4f}); run the same command to continue")
            return 0
    checked = check(model, tokenizer, args.permuted, args.check, args.entities)
    save_adapter(model, args, Path(args.out) / "adapter", checked, step, total)
    print(json.dumps({"adapter": str(Path(args.out) / "adapter"), "check": checked}, indent=2))
    return 0
