"""Train a C2C fuser: ``python -m kvviz train-fuser --pair embedded --out runs/c2c``.

Both LLMs are frozen; only the fuser learns. Loss = the receiver's cross-entropy on the response
tokens, with the receiver's prompt (all but the last token) fused with the sharer's KV through
``kvviz.fusion`` (the pipeline the handoff and the evaluator run too). AdamW, warm-up then linear
decay, gradient clipping, Gumbel-sigmoid gates (noise per batch item, head and token) with the
temperature annealed from ``--tau-start`` to ``--tau-end`` over ``--tau-anneal`` of the run.
``--control`` trains the control fuser (sharer KV replaced by zeros) with the same data, steps,
seed and initialisation.

Data: ``--data recall`` (``kvviz.recall``: private-context facts, split by entity),
``dolly`` (Dolly records; ``--context-only`` keeps those with an input), ``recall+dolly`` (recall
mixed with Dolly records that have an input, ``--dolly-share`` of the training examples), or a
JSONL path. Architecture: ``--rope plain|aware``, ``--fuse kv|k|v``, ``--bias``,
``--intermediate``, ``--proj-blocks``, ``--zero-init`` (see ``kvviz.fuser``).

Speed on a CPU: the receiver's output head is applied only at response positions (Gemma 3's 262k
head is the costliest single matrix); prompt prefills run without gradients and without the head.
One example per forward; ``--batch-size`` accumulates gradients over that many examples. The
sharer's KV is not cached between steps: a run sees each example once, so a cache would not help.

Data-parallel: run the same command under ``accelerate launch --num_processes N`` (GPUs, or CPU
processes with the gloo backend). Each process takes every N-th example; DDP averages gradients.

Outputs in ``--out``: ``c2c/`` or ``control/`` (the fuser checkpoint),
``loss_<kind>.csv``, ``loss_<kind>.html`` (plotly), ``summary_<kind>.json`` and ``checkpoint_<kind>/``
(fuser + optimizer state, for ``--resume``); <kind> is ``c2c`` or ``control``, so both can share
one folder.
"""

from __future__ import annotations

import csv
import json
import random
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from kvviz.align import TokenAlignment, align_prompt
from kvviz.fuser import C2CFuser, annealed_temperature, load_fuser, new_fuser
from kvviz.fusion import fuse_prompt, receiver_prefix
from kvviz.prompts import has_chat_template

DEFAULTS = {
    "data": "dolly",
    "steps": 300,
    "batch_size": 1,
    "lr": 1e-3,
    "gate_lr_scale": 10.0,
    "weight_decay": 0.01,
    "warmup": 0.1,
    "clip": 1.0,
    "width": 96,
    "dropout": 0.1,
    "heldout": 64,
    "max_prompt_tokens": 128,
    "max_response_tokens": 48,
    "seed": 0,
    "tau_start": 1.0,
    "tau_end": 0.001,
    "tau_anneal": 1.0,
    "dolly_share": 0.25,
    "rope": "plain",
    "fuse": "kv",
    "token_alignment": "longest",
}


# --- examples ---------------------------------------------------------------------------------


@dataclass
class Example:
    id: str
    alignment: TokenAlignment
    response_ids: list[int]
    question: str = ""
    context: str | None = None
    receiver_sees_context: bool = True
    token_alignment: str = "longest"
    fuse_template: bool = False


def response_ids(tokenizer, response: str, limit: int) -> list[int]:
    """The response as the receiver would write it after its prompt (plus end-of-turn for chat models)."""
    text = response.strip()
    if has_chat_template(tokenizer):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][: limit - 1]
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        ids.append(end if isinstance(end, int) and end != tokenizer.unk_token_id else tokenizer.eos_token_id)
        return ids
    # base models: the prompt ends with "Answer:"
    return tokenizer(" " + text, add_special_tokens=False)["input_ids"][:limit]


def make_example(
    pair, record, max_prompt_tokens: int, max_response_tokens: int, receiver_sees_context: bool = True,
    max_sharer_tokens: int | None = None, token_alignment: str = "longest", fuse_template: bool = False,
) -> Example | None:
    """None when a prompt is too long or the response empty (skipped)."""
    if not record.response or not record.response.strip():
        return None
    alignment = align_prompt(
        pair.receiver.tokenizer, pair.sharer.tokenizer, record.question, record.context, receiver_sees_context,
        token_alignment, fuse_template,
    )
    max_sharer_tokens = max_sharer_tokens or max_prompt_tokens + 64
    if len(alignment.receiver_ids) > max_prompt_tokens or len(alignment.sharer_ids) > max_sharer_tokens:
        return None
    if alignment.num_fused == 0:
        return None
    return Example(
        record.id, alignment, response_ids(pair.receiver.tokenizer, record.response, max_response_tokens),
        record.question, record.context, receiver_sees_context, token_alignment, fuse_template,
    )


def split_records(data: str, seed: int, heldout: int, context_only: bool = False, train_count: int | None = None, dolly_share: float = 0.25):
    """(train records, held-out records), reproducible from the arguments.

    ``recall``: ``kvviz.recall`` records, split by entity (held-out records use names and values
    never seen in training); ``train_count`` of them for training. ``recall+dolly``: the same
    held-out recall records; training interleaves recall with Dolly records that have an input
    (``dolly_share`` of them). Other data: a seeded shuffle, the first ``heldout`` held out.
    """
    from kvviz import recall
    from kvviz.data import load_dataset

    if data in ("recall", "recall+dolly"):
        count = train_count or 2000
        held = recall.generate("heldout", heldout, seed)
        if data == "recall":
            return recall.generate("train", count, seed), held
        dolly_train, _ = split_records("dolly", seed, heldout, context_only=True)
        dolly = dolly_train[: int(round(count * dolly_share))]
        train = recall.generate("train", count - len(dolly), seed)
        # evenly interleaved: recall i at i / |recall|, Dolly j at (j + 0.5) / |dolly|
        keyed = [(i / len(train), 0, r) for i, r in enumerate(train)] + [((j + 0.5) / len(dolly), 1, r) for j, r in enumerate(dolly)]
        return [r for _, _, r in sorted(keyed, key=lambda item: (item[0], item[1]))], held
    records = [r for r in load_dataset(data) if r.response and (r.context or not context_only)]
    random.Random(seed).shuffle(records)
    return records[heldout:], records[:heldout]


def build_examples(
    pair, records, max_prompt_tokens, max_response_tokens, wanted: int | None = None, receiver_sees_context: bool = True,
    max_sharer_tokens: int | None = None, token_alignment: str = "longest", fuse_template: bool = False,
) -> list[Example]:
    examples = []
    for record in records:
        example = make_example(
            pair, record, max_prompt_tokens, max_response_tokens, receiver_sees_context, max_sharer_tokens, token_alignment,
            fuse_template,
        )
        if example is not None:
            examples.append(example)
            if wanted is not None and len(examples) >= wanted:
                break
    return examples


# --- the loss ---------------------------------------------------------------------------------


def output_logits(loaded, hidden: torch.Tensor) -> torch.Tensor:
    """The causal-LM head on given hidden states (with Gemma's final soft-capping)."""
    model = loaded.model
    logits = model.lm_head(hidden)
    cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def fused_state(pair, fuser: C2CFuser | None, example: Example, hard: bool | None = None, sharer="right"):
    """The receiver's state after its prompt minus the last token, fused (``kvviz.fusion``) or not."""
    if fuser is None:
        return receiver_prefix(pair, example.alignment)
    return fuse_prompt(pair, fuser, example.alignment, sharer=sharer, hard=hard).state


def response_nll(
    pair, fuser: C2CFuser | None, example: Example, hard: bool | None = None, sharer="right"
) -> tuple[torch.Tensor, int]:
    """(summed cross-entropy over the response tokens, token count); differentiable in the fuser.

    ``sharer``: what the fuser reads (``kvviz.fusion.fuse_prompt``): "right", "zero" or a SharerKV.
    """
    state = fused_state(pair, fuser, example, hard, sharer)
    receiver = pair.receiver
    tokens = example.alignment.receiver_ids[-1:] + example.response_ids[:-1]
    targets = torch.tensor(example.response_ids, device=receiver.device)
    input_ids = torch.tensor([tokens], device=receiver.device)
    kwargs = {"cache": state.cache, "position_ids": state.positions(len(tokens), receiver.device), "use_cache": True}
    plan = state.plan()
    if plan is not None:
        kwargs["kvviz_plan"] = plan
    hidden = receiver.model.model(input_ids=input_ids, **kwargs).last_hidden_state[0]
    logits = output_logits(receiver, hidden).float()
    loss = torch.nn.functional.cross_entropy(logits, targets, reduction="sum")
    return loss, len(example.response_ids)


@torch.no_grad()
def example_nlls(pair, fuser: C2CFuser | None, examples: list[Example], sharer_for=None) -> list[tuple[float, int]]:
    """(summed NLL, tokens) per example with hard gates (as at inference).

    ``sharer_for(index)`` gives what the fuser reads for example ``index`` (default "right").
    """
    if fuser is not None:
        fuser.eval()
    rows = []
    for index, example in enumerate(examples):
        sharer = "right" if sharer_for is None else sharer_for(index)
        loss, n = response_nll(pair, fuser, example, hard=True, sharer=sharer)
        rows.append((float(loss), n))
    return rows


def mean_nll(pair, fuser: C2CFuser | None, examples: list[Example], sharer_for=None) -> float:
    """Per-token NLL over examples with hard gates (as at inference)."""
    rows = example_nlls(pair, fuser, examples, sharer_for)
    return sum(r[0] for r in rows) / max(sum(r[1] for r in rows), 1)


# --- checkpoint of the trainer (never pickled) ------------------------------------------------


def save_trainer_state(folder: Path, fuser: C2CFuser, optimizer, step: int, extra: dict) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    fuser.save(folder / "fuser")
    names = {id(p): n for n, p in fuser.named_parameters()}
    tensors = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                tensors[f"{names[id(param)]}::{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    tensors["rng::torch"] = torch.get_rng_state()
    save_file(tensors, str(folder / "optimizer.safetensors.tmp"))
    (folder / "optimizer.safetensors.tmp").replace(folder / "optimizer.safetensors")
    (folder / "trainer.json").write_text(json.dumps({"step": step, **extra}, indent=2))


def load_trainer_state(folder: Path, fuser: C2CFuser, optimizer) -> dict:
    from safetensors.torch import load_file

    loaded = load_fuser(folder / "fuser")
    fuser.load_state_dict(loaded.state_dict())
    tensors = load_file(str(folder / "optimizer.safetensors"))
    params = dict(fuser.named_parameters())
    for key, value in tensors.items():
        name, field_name = key.split("::", 1)
        if name == "rng":
            torch.set_rng_state(value)
            continue
        optimizer.state[params[name]][field_name] = value if field_name != "step" else value.float()
    return json.loads((folder / "trainer.json").read_text())


# --- loss curve -------------------------------------------------------------------------------


def write_loss_plot(csv_path: Path, html_path: Path, heldout: dict | None = None) -> None:
    import plotly.graph_objects as go

    rows = list(csv.DictReader(csv_path.open()))
    steps = [int(r["step"]) for r in rows]
    losses = [float(r["loss"]) for r in rows]
    window = max(1, len(losses) // 20)
    smooth = [sum(losses[max(0, i - window + 1) : i + 1]) / len(losses[max(0, i - window + 1) : i + 1]) for i in range(len(losses))]
    figure = go.Figure()
    figure.add_trace(go.Scatter(x=steps, y=losses, mode="lines", name="train loss (per token)", opacity=0.35))
    figure.add_trace(go.Scatter(x=steps, y=smooth, mode="lines", name=f"moving mean ({window} steps)"))
    for label, value in (heldout or {}).items():
        figure.add_trace(go.Scatter(x=[steps[0], steps[-1]] if steps else [0, 1], y=[value, value], mode="lines", name=label, line={"dash": "dot"}))
    figure.update_layout(title="C2C fuser training", xaxis_title="step", yaxis_title="response NLL (nats/token)")
    figure.write_html(str(html_path), include_plotlyjs="cdn")


# --- CLI --------------------------------------------------------------------------------------


def configure_parser(parser) -> None:
    d = DEFAULTS
    parser.add_argument("--pair", default="embedded", help="pair name or SHARER+RECEIVER")
    parser.add_argument(
        "--data", default=d["data"],
        help="recall, dolly, recall+dolly, instructions, or a JSONL path with instruction/input/output",
    )
    parser.add_argument("--dolly-share", type=float, default=d["dolly_share"], help="share of Dolly records in recall+dolly")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--control", action="store_true", help="train the control fuser (sharer KV replaced by zeros)")
    parser.add_argument("--steps", type=int, default=d["steps"])
    parser.add_argument("--batch-size", type=int, default=d["batch_size"], help="examples per step (gradient accumulation)")
    parser.add_argument("--lr", type=float, default=d["lr"])
    parser.add_argument("--gate-lr-scale", type=float, default=d["gate_lr_scale"], help="gate logits learn this much faster")
    parser.add_argument("--weight-decay", type=float, default=d["weight_decay"])
    parser.add_argument("--warmup", type=float, default=d["warmup"], help="share of steps for linear warm-up")
    parser.add_argument("--clip", type=float, default=d["clip"], help="gradient norm clip")
    parser.add_argument("--width", type=int, default=d["width"], help="fuser hidden width W")
    parser.add_argument("--dropout", type=float, default=d["dropout"])
    parser.add_argument("--heldout", type=int, default=d["heldout"], help="records held out (first N after a seeded shuffle)")
    parser.add_argument("--max-prompt-tokens", type=int, default=d["max_prompt_tokens"])
    parser.add_argument(
        "--context", choices=("shared", "private"), default="shared",
        help="shared: both models read a record's input/context (the paper); private: only the sharer does",
    )
    parser.add_argument("--context-only", action="store_true", help="train and hold out only records that have a context")
    parser.add_argument("--max-sharer-tokens", type=int, default=None, help="longest sharer prompt (default: max-prompt-tokens + 64)")
    parser.add_argument("--max-response-tokens", type=int, default=d["max_response_tokens"])
    parser.add_argument("--seed", type=int, default=d["seed"])
    parser.add_argument("--tau-start", type=float, default=d["tau_start"])
    parser.add_argument("--tau-end", type=float, default=d["tau_end"])
    parser.add_argument("--tau-anneal", type=float, default=d["tau_anneal"], help="share of the run over which tau anneals")
    parser.add_argument("--rope", choices=("plain", "aware"), default=d["rope"], help="aware: project position-free keys")
    parser.add_argument("--fuse", choices=("kv", "k", "v"), default=d["fuse"], help="fuse K and V, or one of them (ablation)")
    parser.add_argument(
        "--token-alignment", choices=("longest", "natural"), default=d["token_alignment"],
        help="longest: the paper's one re-encoded sharer token per receiver token; natural: the sharer's own tokenization",
    )
    parser.add_argument(
        "--fuse-template", action="store_true",
        help="also fuse the template tokens before the last prompt token (with the end of the sharer's generation prompt)",
    )
    parser.add_argument("--bias", action="store_true", help="biases on the projector's linear maps (the reference has them)")
    parser.add_argument("--intermediate", type=int, default=None, help="inner width of the trunk and projection blocks")
    parser.add_argument("--proj-blocks", type=int, default=1, help="blocks on the projection path")
    parser.add_argument("--zero-init", action="store_true", help="start the projection output at zero (kvviz format 1)")
    parser.add_argument("--measure", type=int, default=0, help="held-out examples for the communication measure at the end")
    parser.add_argument("--save-every", type=int, default=100, help="checkpoint every N steps (0: only at the end)")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint_<kind> if present")
    parser.add_argument("--fp16", action="store_true", help="store the final weights in float16 (half the size)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: leave as is)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)


def main(args) -> int:
    from accelerate import Accelerator

    if args.threads:
        torch.set_num_threads(args.threads)
    accelerator = Accelerator(cpu=(args.device == "cpu"))
    device = args.device or str(accelerator.device)
    is_main = accelerator.is_main_process
    log = (lambda message: print(message, file=sys.stderr, flush=True)) if is_main else (lambda message: None)
    from kvviz.engine import load_pair

    started = time.perf_counter()
    pair = load_pair(args.pair, device, args.dtype, progress=log)
    out = Path(args.out)
    kind = "control" if args.control else "c2c"
    if is_main:
        out.mkdir(parents=True, exist_ok=True)

    receiver_sees_context = args.context == "shared"
    rank, world = accelerator.process_index, accelerator.num_processes
    needed = args.steps * args.batch_size * world
    train_records, heldout_records = split_records(
        args.data, args.seed, args.heldout, args.context_only, train_count=needed, dolly_share=args.dolly_share
    )
    heldout = build_examples(
        pair, heldout_records, args.max_prompt_tokens, args.max_response_tokens, None, receiver_sees_context,
        args.max_sharer_tokens, args.token_alignment, args.fuse_template,
    )
    train = build_examples(
        pair, train_records, args.max_prompt_tokens, args.max_response_tokens, needed, receiver_sees_context,
        args.max_sharer_tokens, args.token_alignment, args.fuse_template,
    )
    if not train:
        raise ValueError(f"No usable training examples in {args.data} (prompts over {args.max_prompt_tokens} tokens are skipped).")
    if world > 1:
        import torch.distributed as dist

        log(f"data-parallel: {world} processes, backend {dist.get_backend()}")
    log(f"{len(train)} training examples (needed {needed}; reused in order when fewer), {len(heldout)} held out")

    torch.manual_seed(args.seed)
    fuser = new_fuser(
        pair.sharer.facts, pair.receiver.facts, args.width, args.dropout, pair.name, control=args.control,
        rope=args.rope, fuse=args.fuse, token_alignment=args.token_alignment, fuse_template=args.fuse_template,
        bias=args.bias, intermediate=args.intermediate, proj_blocks=args.proj_blocks,
    )
    if args.zero_init:
        fuser.zero_output()
    fuser.to(pair.receiver.device)
    log(
        f"fuser: width {args.width}, {fuser.num_parameters:,} parameters, rope {args.rope}, fuse {args.fuse}, "
        f"layer map {fuser.config.layer_map}"
    )
    gate_params = [fuser.gate_logits]
    other_params = [p for n, p in fuser.named_parameters() if n != "gate_logits"]
    optimizer = torch.optim.AdamW(
        [
            {"params": other_params, "weight_decay": args.weight_decay, "lr": args.lr},
            {"params": gate_params, "weight_decay": 0.0, "lr": args.lr * args.gate_lr_scale},
        ],
    )
    warmup_steps = max(1, int(round(args.warmup * args.steps)))

    def schedule(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (args.steps - step) / max(1, args.steps - warmup_steps))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    start_step = 0
    checkpoint_dir = out / f"checkpoint_{kind}"
    if args.resume and (checkpoint_dir / "trainer.json").is_file():
        state = load_trainer_state(checkpoint_dir, fuser, optimizer)
        start_step = int(state["step"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # replaying the schedule before any optimizer step
            for _ in range(start_step):
                scheduler.step()
        log(f"resumed from {checkpoint_dir} at step {start_step}")
    model, optimizer = accelerator.prepare(fuser, optimizer)
    core: C2CFuser = accelerator.unwrap_model(model)

    csv_path = out / f"loss_{kind}.csv"
    if is_main:
        kept = []
        if start_step and csv_path.exists():  # resuming: keep the curve up to the checkpoint
            kept = [row for row in csv.reader(csv_path.open()) if row and row[0] != "step" and int(row[0]) <= start_step]
        with csv_path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["step", "loss", "lr", "tau", "seconds"])
            writer.writerows(kept)
    progress = None
    if is_main and not args.no_progress:
        from tqdm.auto import tqdm

        progress = tqdm(total=args.steps, initial=start_step, desc=f"train {kind}", file=sys.stderr, dynamic_ncols=True)
    step_started = time.perf_counter()
    for step in range(start_step, args.steps):
        core.train()
        anneal_steps = max(1, int(round(args.tau_anneal * args.steps)))
        core.temperature = annealed_temperature(step, anneal_steps, args.tau_start, args.tau_end)
        optimizer.zero_grad(set_to_none=True)
        total, count = 0.0, 0
        for micro in range(args.batch_size):
            index = ((step * args.batch_size + micro) * world + rank) % len(train)
            example = train[index]
            loss_sum, n = response_nll(pair, model, example)  # through the DDP wrapper when distributed
            (loss_sum / n / args.batch_size).backward()
            total += float(loss_sum.detach())
            count += n
        grad_norm = torch.nn.utils.clip_grad_norm_(core.parameters(), args.clip)
        optimizer.step()
        scheduler.step()
        mean_loss = total / max(count, 1)
        if is_main:
            with csv_path.open("a", newline="") as handle:
                csv.writer(handle).writerow(
                    [step + 1, f"{mean_loss:.5f}", f"{scheduler.get_last_lr()[0]:.3e}", f"{core.temperature:.4g}", f"{time.perf_counter() - step_started:.1f}"]
                )
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{mean_loss:.3f}", tau=f"{core.temperature:.3g}", gnorm=f"{float(grad_norm):.2f}")
        if args.save_every and (step + 1) % args.save_every == 0 and step + 1 < args.steps and is_main:
            save_trainer_state(checkpoint_dir, core, optimizer, step + 1, {"kind": kind})
    if progress is not None:
        progress.close()
    train_seconds = time.perf_counter() - step_started
    accelerator.wait_for_everyone()
    if not is_main:
        return 0

    heldout_nll = mean_nll(pair, core, heldout)
    receiver_nll = mean_nll(pair, None, heldout)
    communication = None
    if args.measure:
        from kvviz.eval_fuser import communication_measure

        communication = communication_measure(pair, core, heldout[: args.measure], not receiver_sees_context)
        log(f"communication gain {communication['gain']:+.4f} nats/token, 95% CI {communication['ci95']}")
    gates = core.gate_logits.detach().cpu()
    applied = core.open_gates().cpu()
    core.config.training = {
        "data": args.data,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "processes": world,
        "seed": args.seed,
        "lr": args.lr,
        "gate_lr_scale": args.gate_lr_scale,
        "weight_decay": args.weight_decay,
        "warmup": args.warmup,
        "clip": args.clip,
        "tau": [args.tau_start, args.tau_end],
        "tau_anneal": args.tau_anneal,
        "dolly_share": args.dolly_share,
        "zero_init": args.zero_init,
        "heldout": args.heldout,
        "heldout_examples": len(heldout),
        "max_prompt_tokens": args.max_prompt_tokens,
        "max_response_tokens": args.max_response_tokens,
        "max_sharer_tokens": args.max_sharer_tokens,
        "context": args.context,
        "receiver_sees_context": receiver_sees_context,
        "context_only": args.context_only,
        "heldout_nll": round(heldout_nll, 5),
        "receiver_heldout_nll": round(receiver_nll, 5),
        "train_seconds": round(train_seconds, 1),
        "open_gates_k": int(applied[:, 0].sum()),
        "open_gates_v": int(applied[:, 1].sum()),
        "control": args.control,
        "storage": "float16" if args.fp16 else "float32",
        "seconds_per_step": round(train_seconds / max(args.steps - start_step, 1), 3),
    }
    if communication is not None:
        core.config.training["communication"] = communication
    target = out / kind
    core.save(target, dtype=torch.float16 if args.fp16 else torch.float32)
    write_loss_plot(csv_path, out / f"loss_{kind}.html", {f"held-out NLL ({kind})": heldout_nll, "held-out NLL (receiver alone)": receiver_nll})
    summary = {
        "fuser": str(target),
        "kind": kind,
        "parameters": core.num_parameters,
        "heldout_nll": heldout_nll,
        "receiver_heldout_nll": receiver_nll,
        "train_seconds": train_seconds,
        "total_seconds": time.perf_counter() - started,
        "open_gates": {"k": core.config.training["open_gates_k"], "v": core.config.training["open_gates_v"], "layers": gates.shape[0]},
        "gate_logits": [[round(float(x), 4) for x in row] for row in gates.tolist()],
        "communication": communication,
    }
    (out / f"summary_{kind}.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0

