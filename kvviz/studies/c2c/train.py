"""Train a C2C fuser: ``python -m kvviz train-fuser --pair embedded --out runs/c2c``.

Both LLMs are frozen; only the fuser learns. Loss = the receiver's cross-entropy on the response
tokens, with the receiver's prompt (all but the last token) fused with the sharer's KV through
``kvviz.handoffs.c2c.fusion`` (the pipeline the handoff and the evaluator run too). AdamW, warm-up then linear
decay, gradient clipping, Gumbel-sigmoid gates (noise per batch item, head and token) with the
temperature annealed from ``--tau-start`` to ``--tau-end`` over ``--tau-anneal`` of the run.
``--control`` trains the control fuser (sharer KV replaced by zeros) with the same data, steps,
seed and initialisation.

Data: ``--data recall`` (``kvviz.data.recall``: private-context facts, split by entity),
``dolly`` (Dolly records; ``--context-only`` keeps those with an input), ``recall+dolly`` (recall
mixed with Dolly records that have an input, ``--dolly-share`` of the training examples), or a
JSONL path. Architecture: ``--rope plain|aware``, ``--fuse kv|k|v``, ``--bias``,
``--intermediate``, ``--proj-blocks``, ``--zero-init`` (see ``kvviz.handoffs.c2c.fuser``).

Speed on a CPU: the loss runs the output head at the response positions only (``kvviz.studies.c2c.scoring``).
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

import argparse
import csv
import json
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import plotly.graph_objects as go
import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from kvviz.engine import flags, runner
from kvviz.handoffs.c2c.fuser import C2CFuser, annealed_temperature, load_fuser, new_fuser
from kvviz.studies.c2c.communication import communication_measure
from kvviz.studies.c2c.examples import SPLIT_DEFAULTS, Example, build_examples, split_records
from kvviz.studies.c2c.scoring import mean_nll, response_nll

DEFAULTS = {
    **SPLIT_DEFAULTS,
    "steps": 300,
    "batch_size": 1,
    "lr": 1e-3,
    "gate_lr_scale": 10.0,
    "weight_decay": 0.01,
    "warmup": 0.1,
    "clip": 1.0,
    "width": 96,
    "dropout": 0.1,
    "tau_start": 1.0,
    "tau_end": 0.001,
    "tau_anneal": 1.0,
    "dolly_share": 0.25,
    "rope": "plain",
    "fuse": "kv",
    "token_alignment": "longest",
}


# --- checkpoint of the trainer (never pickled) ------------------------------------------------


def save_trainer_state(folder: Path, fuser: C2CFuser, optimizer, step: int, extra: dict) -> None:
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
    flags.add_model_arguments(parser, threads_help="torch CPU threads (default: leave as is)")
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
    parser.add_argument("--no-progress", action="store_true")


@dataclass
class Run:
    """One training run as its parts see it: who runs it, on which pair, and where it writes."""

    args: argparse.Namespace
    accelerator: object
    pair: object
    out: Path
    kind: str  # "c2c" or "control"
    log: Callable[[str], None]
    started: float

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def receiver_sees_context(self) -> bool:
        return self.args.context == "shared"


def start(args) -> Run:
    """Threads, accelerate, the pair and the output folder."""
    from accelerate import Accelerator  # only the trainer needs accelerate: imported when it runs

    flags.apply_threads(args)
    accelerator = Accelerator(cpu=(args.device == "cpu"))
    is_main = accelerator.is_main_process
    log = (lambda message: print(message, file=sys.stderr, flush=True)) if is_main else (lambda message: None)
    started = time.perf_counter()
    pair = runner.load_pair(args.pair, args.device or str(accelerator.device), args.dtype, progress=log)
    run = Run(args, accelerator, pair, Path(args.out), "control" if args.control else "c2c", log, started)
    if is_main:
        run.out.mkdir(parents=True, exist_ok=True)
    return run


def training_examples(run: Run) -> tuple[list[Example], list[Example]]:
    """(training examples, held-out examples): enough for every step of every process."""
    args, world = run.args, run.accelerator.num_processes
    needed = args.steps * args.batch_size * world
    train_records, heldout_records = split_records(
        args.data, args.seed, args.heldout, args.context_only, train_count=needed, dolly_share=args.dolly_share
    )
    cut = (args.max_prompt_tokens, args.max_response_tokens)
    variant = (run.receiver_sees_context, args.max_sharer_tokens, args.token_alignment, args.fuse_template)
    heldout = build_examples(run.pair, heldout_records, *cut, None, *variant)
    train = build_examples(run.pair, train_records, *cut, needed, *variant)
    if not train:
        raise ValueError(f"No usable training examples in {args.data} (prompts over {args.max_prompt_tokens} tokens are skipped).")
    if world > 1:
        run.log(f"data-parallel: {world} processes, backend {torch.distributed.get_backend()}")
    run.log(f"{len(train)} training examples (needed {needed}; reused in order when fewer), {len(heldout)} held out")
    return train, heldout


def initial_fuser(run: Run) -> C2CFuser:
    args, pair = run.args, run.pair
    torch.manual_seed(args.seed)
    fuser = new_fuser(
        pair.sharer.facts, pair.receiver.facts, args.width, args.dropout, pair.name, control=args.control,
        rope=args.rope, fuse=args.fuse, token_alignment=args.token_alignment, fuse_template=args.fuse_template,
        bias=args.bias, intermediate=args.intermediate, proj_blocks=args.proj_blocks,
    )
    if args.zero_init:
        fuser.zero_output()
    fuser.to(pair.receiver.device)
    run.log(
        f"fuser: width {args.width}, {fuser.num_parameters:,} parameters, rope {args.rope}, fuse {args.fuse}, "
        f"layer map {fuser.config.layer_map}"
    )
    return fuser


def optimizer_for(args, fuser: C2CFuser):
    """AdamW (the gate logits faster and without weight decay), warm-up then linear decay."""
    other_params = [p for n, p in fuser.named_parameters() if n != "gate_logits"]
    optimizer = torch.optim.AdamW(
        [
            {"params": other_params, "weight_decay": args.weight_decay, "lr": args.lr},
            {"params": [fuser.gate_logits], "weight_decay": 0.0, "lr": args.lr * args.gate_lr_scale},
        ],
    )
    warmup_steps = max(1, int(round(args.warmup * args.steps)))

    def schedule(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (args.steps - step) / max(1, args.steps - warmup_steps))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def resume(run: Run, fuser: C2CFuser, optimizer, scheduler) -> int:
    """The step to start from: a saved checkpoint's with ``--resume``, else 0."""
    checkpoint_dir = run.out / f"checkpoint_{run.kind}"
    if not (run.args.resume and (checkpoint_dir / "trainer.json").is_file()):
        return 0
    start_step = int(load_trainer_state(checkpoint_dir, fuser, optimizer)["step"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # replaying the schedule before any optimizer step
        for _ in range(start_step):
            scheduler.step()
    run.log(f"resumed from {checkpoint_dir} at step {start_step}")
    return start_step


def start_loss_log(path: Path, start_step: int) -> None:
    """The loss CSV's header (resuming: the curve up to the checkpoint is kept)."""
    kept = []
    if start_step and path.exists():
        kept = [row for row in csv.reader(path.open()) if row and row[0] != "step" and int(row[0]) <= start_step]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", "loss", "lr", "tau", "seconds"])
        writer.writerows(kept)


def train_steps(run: Run, model, optimizer, scheduler, train: list[Example], start_step: int) -> float:
    """The training loop from ``start_step``; returns its seconds. ``model``: the fuser, wrapped by
    accelerate (DDP) when distributed."""
    args = run.args
    core: C2CFuser = run.accelerator.unwrap_model(model)
    rank, world = run.accelerator.process_index, run.accelerator.num_processes
    csv_path = run.out / f"loss_{run.kind}.csv"
    if run.is_main:
        start_loss_log(csv_path, start_step)
    progress = None
    if run.is_main and not args.no_progress:
        progress = tqdm(total=args.steps, initial=start_step, desc=f"train {run.kind}", file=sys.stderr, dynamic_ncols=True)
    anneal_steps = max(1, int(round(args.tau_anneal * args.steps)))
    started = time.perf_counter()
    for step in range(start_step, args.steps):
        core.train()
        core.temperature = annealed_temperature(step, anneal_steps, args.tau_start, args.tau_end)
        optimizer.zero_grad(set_to_none=True)
        total, count = 0.0, 0
        for micro in range(args.batch_size):
            example = train[((step * args.batch_size + micro) * world + rank) % len(train)]
            loss_sum, n = response_nll(run.pair, model, example)  # through the DDP wrapper when distributed
            (loss_sum / n / args.batch_size).backward()
            total += float(loss_sum.detach())
            count += n
        grad_norm = torch.nn.utils.clip_grad_norm_(core.parameters(), args.clip)
        optimizer.step()
        scheduler.step()
        mean_loss = total / max(count, 1)
        if run.is_main:
            with csv_path.open("a", newline="") as handle:
                csv.writer(handle).writerow([step + 1, f"{mean_loss:.5f}", f"{scheduler.get_last_lr()[0]:.3e}",
                                             f"{core.temperature:.4g}", f"{time.perf_counter() - started:.1f}"])
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{mean_loss:.3f}", tau=f"{core.temperature:.3g}", gnorm=f"{float(grad_norm):.2f}")
        if args.save_every and (step + 1) % args.save_every == 0 and step + 1 < args.steps and run.is_main:
            save_trainer_state(run.out / f"checkpoint_{run.kind}", core, optimizer, step + 1, {"kind": run.kind})
    if progress is not None:
        progress.close()
    return time.perf_counter() - started


def training_record(run: Run, core: C2CFuser, heldout: list[Example], measured: dict, seconds: float, steps_run: int) -> dict:
    """How the fuser was trained, for its config (``FuserConfig.training``)."""
    args = run.args
    applied = core.open_gates().cpu()
    record = {
        "data": args.data, "steps": args.steps, "batch_size": args.batch_size, "processes": run.accelerator.num_processes,
        "seed": args.seed, "lr": args.lr, "gate_lr_scale": args.gate_lr_scale, "weight_decay": args.weight_decay,
        "warmup": args.warmup, "clip": args.clip, "tau": [args.tau_start, args.tau_end], "tau_anneal": args.tau_anneal,
        "dolly_share": args.dolly_share, "zero_init": args.zero_init, "heldout": args.heldout,
        "heldout_examples": len(heldout), "max_prompt_tokens": args.max_prompt_tokens,
        "max_response_tokens": args.max_response_tokens, "max_sharer_tokens": args.max_sharer_tokens,
        "context": args.context, "receiver_sees_context": run.receiver_sees_context, "context_only": args.context_only,
        "heldout_nll": round(measured["heldout_nll"], 5), "receiver_heldout_nll": round(measured["receiver_nll"], 5),
        "train_seconds": round(seconds, 1), "open_gates_k": int(applied[:, 0].sum()), "open_gates_v": int(applied[:, 1].sum()),
        "control": args.control, "storage": "float16" if args.fp16 else "float32",
        "seconds_per_step": round(seconds / max(steps_run, 1), 3),
    }
    if measured["communication"] is not None:
        record["communication"] = measured["communication"]
    return record


def measure_heldout(run: Run, core: C2CFuser, heldout: list[Example]) -> dict:
    """Held-out NLL of the fuser and of the receiver alone, and with ``--measure`` the communication measure."""
    measured = {"heldout_nll": mean_nll(run.pair, core, heldout), "receiver_nll": mean_nll(run.pair, None, heldout),
                "communication": None}
    if run.args.measure:
        communication = communication_measure(run.pair, core, heldout[: run.args.measure], not run.receiver_sees_context)
        run.log(f"communication gain {communication['gain']:+.4f} nats/token, 95% CI {communication['ci95']}")
        measured["communication"] = communication
    return measured


def finish(run: Run, core: C2CFuser, heldout: list[Example], seconds: float, steps_run: int) -> dict:
    """Measure, save the fuser with its training record, the loss plot and the summary."""
    args, kind = run.args, run.kind
    measured = measure_heldout(run, core, heldout)
    core.config.training = training_record(run, core, heldout, measured, seconds, steps_run)
    target = run.out / kind
    core.save(target, dtype=torch.float16 if args.fp16 else torch.float32)
    write_loss_plot(run.out / f"loss_{kind}.csv", run.out / f"loss_{kind}.html",
                    {f"held-out NLL ({kind})": measured["heldout_nll"], "held-out NLL (receiver alone)": measured["receiver_nll"]})
    gates = core.gate_logits.detach().cpu()
    summary = {
        "fuser": str(target),
        "kind": kind,
        "parameters": core.num_parameters,
        "heldout_nll": measured["heldout_nll"],
        "receiver_heldout_nll": measured["receiver_nll"],
        "train_seconds": seconds,
        "total_seconds": time.perf_counter() - run.started,
        "open_gates": {"k": core.config.training["open_gates_k"], "v": core.config.training["open_gates_v"], "layers": gates.shape[0]},
        "gate_logits": [[round(float(x), 4) for x in row] for row in gates.tolist()],
        "communication": measured["communication"],
    }
    (run.out / f"summary_{kind}.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(args) -> int:
    run = start(args)
    train, heldout = training_examples(run)
    fuser = initial_fuser(run)
    optimizer, scheduler = optimizer_for(args, fuser)
    start_step = resume(run, fuser, optimizer, scheduler)
    model, optimizer = run.accelerator.prepare(fuser, optimizer)
    seconds = train_steps(run, model, optimizer, scheduler, train, start_step)
    run.accelerator.wait_for_everyone()
    if not run.is_main:
        return 0
    summary = finish(run, run.accelerator.unwrap_model(model), heldout, seconds, args.steps - start_step)
    print(json.dumps(summary, indent=2))
    return 0
