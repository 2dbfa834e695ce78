"""Train a C2C fuser: ``python -m kvviz train-fuser --pair embedded --out runs/c2c``.

Both LLMs are frozen; only the fuser learns. Loss = the receiver's cross-entropy on the response
tokens, with the receiver's prompt (all but the last token) fused with the sharer's KV through
``kvviz.handoffs.c2c.fusion`` (the pipeline the handoff and the evaluator run too). AdamW, warm-up then linear
decay, gradient clipping, Gumbel-sigmoid gates (noise per batch item, head and token) with the
temperature annealed from ``--tau-start`` to ``--tau-end`` over ``--tau-anneal`` of the run.
``--control`` trains the control fuser (sharer KV replaced by zeros) with the same data, steps,
seed and initialisation.

Data: ``--data recall`` (``kvviz.data.recall``: private-context facts, split by entity),
``handbook`` (``kvviz.data.handbook``: questions about invented entities only the sharer was
taught, no context; train on fuser-train entities, hold out the others: ``--pair knower``),
``dolly`` (Dolly records; ``--context-only`` keeps those with an input), ``recall+dolly`` (recall
mixed with Dolly records that have an input, ``--dolly-share`` of the training examples), or a
JSONL path. Architecture: ``--rope plain|aware``, ``--fuse kv|k|v``, ``--bias``,
``--intermediate``, ``--proj-blocks``, ``--zero-init`` (see ``kvviz.handoffs.c2c.fuser``).

Speed on a CPU: the loss runs the output head at the response positions only (``kvviz.studies.c2c.scoring``).
One example per forward; ``--batch-size`` accumulates gradients over that many examples. The
sharer's KV is not cached between steps: a run sees each example once, so a cache would not help.

Data-parallel: run the same command under ``accelerate launch --num_processes N`` (GPUs, or CPU
processes with the gloo backend). Each process takes every N-th example; DDP averages gradients.

Legs (``kvviz.studies.legs``): with ``--minutes M`` the run stops after M minutes of training, saves
its state and exits; the same command with ``--resume`` continues it (give ``--resume`` from the
first leg on: there is nothing to resume yet, so it starts). Each leg is a line of
``legs_<kind>.jsonl`` (its steps and seconds). ``--fuser-now DIR`` trains nothing: it writes the
checkpoint's fuser as it stands into ``DIR/<kind>`` (measured and recorded as a finished run's, its
config's ``steps_done`` saying how far it got), so a partly trained fuser can be evaluated.

Outputs in ``--out``: ``c2c/`` or ``control/`` (the fuser checkpoint),
``loss_<kind>.csv``, ``loss_<kind>.html`` (plotly), ``summary_<kind>.json`` and ``checkpoint_<kind>/``
(the fuser's parameters, the optimizer's state and the step, as safetensors and JSON, for
``--resume``); <kind> is ``c2c`` or ``control``, so both can share one folder. (``train_report``
writes the loss curve, the fuser's training record and the summary.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from kvviz.engine import flags, runner
from kvviz.handoffs.c2c.fuser import C2CFuser, annealed_temperature, new_fuser
from kvviz.studies import legs
from kvviz.studies.c2c.examples import SPLIT_DEFAULTS, Example, build_examples, split_records
from kvviz.studies.c2c.scoring import response_nll
from kvviz.studies.c2c.train_report import finish, log_loss, save_measured, start_loss_log

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


# --- CLI --------------------------------------------------------------------------------------


def configure_parser(parser) -> None:
    d = DEFAULTS
    flags.add_model_arguments(parser, threads_help="torch CPU threads (default: leave as is)")
    parser.add_argument(
        "--data", default=d["data"],
        help="recall, handbook, dolly, recall+dolly, instructions, or a JSONL path with instruction/input/output",
    )
    parser.add_argument("--dolly-share", type=float, default=d["dolly_share"], help="share of Dolly records in recall+dolly")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--control", action="store_true", help="train the control fuser (sharer KV replaced by zeros)")
    parser.add_argument("--steps", type=int, default=d["steps"])
    parser.add_argument("--batch-size", type=int, default=d["batch_size"], help="examples per step (gradient accumulation)")
    flags.add_optimizer_arguments(parser, d)
    parser.add_argument("--gate-lr-scale", type=float, default=d["gate_lr_scale"], help="gate logits learn this much faster")
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
    parser.add_argument("--minutes", type=float, default=0,
                        help="end this leg after M minutes of training, saving its state (rerun with --resume; 0: no limit)")
    parser.add_argument("--fp16", action="store_true", help="store the final weights in float16 (half the size)")
    parser.add_argument("--fuser-now", default=None, metavar="DIR",
                        help="train nothing: write DIR/c2c (or DIR/control) from OUT's checkpoint as it stands, measured "
                             "as a finished run's (a partly trained fuser; its config says at which step), e.g. for "
                             "eval-fuser --fuser DIR/c2c or bench --fuser DIR/c2c")
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


def checkpoint_folder(run: Run) -> Path:
    return run.out / f"checkpoint_{run.kind}"


def resume(run: Run, fuser: C2CFuser, optimizer, scheduler) -> int:
    """The step to start from: a saved checkpoint's with ``--resume``, else 0."""
    folder = checkpoint_folder(run)
    if not (run.args.resume and legs.has_state(folder)):
        return 0
    start_step = int(legs.load_state(folder, dict(fuser.named_parameters()), optimizer)["step"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # replaying the schedule before any optimizer step
        for _ in range(start_step):
            scheduler.step()
    run.log(f"resumed from {folder} at step {start_step}")
    return start_step


def leg_spent(run: Run, budget: legs.Budget) -> bool:
    """Whether the leg's time is up (every process decides alike: the first to run out stops all)."""
    spent = budget.spent()
    if run.accelerator.num_processes > 1:
        flag = torch.tensor([int(spent)], device=run.accelerator.device)
        spent = bool(run.accelerator.reduce(flag, reduction="sum").item())
    return spent


def save_leg(run: Run, core: C2CFuser, optimizer, step: int) -> None:
    legs.save_state(checkpoint_folder(run), dict(core.named_parameters()), optimizer, step, {"kind": run.kind})


def train_steps(run: Run, model, optimizer, scheduler, train: list[Example], start_step: int) -> tuple[float, int]:
    """The training loop from ``start_step`` until the last step or the leg's time (``--minutes``);
    returns (its seconds, the step reached). ``model``: the fuser, wrapped by accelerate (DDP) when
    distributed."""
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
    budget = legs.Budget(args.minutes)
    step = start_step
    while step < args.steps:
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
        step += 1
        mean_loss = total / max(count, 1)
        if run.is_main:
            log_loss(csv_path, step, mean_loss, scheduler.get_last_lr()[0], core.temperature, budget.seconds)
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{mean_loss:.3f}", tau=f"{core.temperature:.3g}", gnorm=f"{float(grad_norm):.2f}")
            elif step % 20 == 0:
                run.log(f"{run.kind} step {step}/{args.steps} loss {mean_loss:.4f} ({budget.seconds:.0f} s this leg)")
        if args.save_every and step % args.save_every == 0 and step < args.steps and run.is_main:
            save_leg(run, core, optimizer, step)
        if leg_spent(run, budget):  # checked after a step: every leg moves on
            break
    if progress is not None:
        progress.close()
    if run.is_main:
        if step < args.steps:
            save_leg(run, core, optimizer, step)
        legs.log_leg(run.out, {"kind": run.kind, "from_step": start_step, "to_step": step, "total": args.steps,
                               "seconds": round(budget.seconds, 1), "device": str(run.accelerator.device),
                               "processes": world, "threads": torch.get_num_threads(),
                               "when": time.strftime("%Y-%m-%d %H:%M:%S")}, name=f"legs_{run.kind}.jsonl")
    return budget.seconds, step


def fuser_now(run: Run, fuser: C2CFuser, optimizer, heldout: list[Example]) -> int:
    """``--fuser-now DIR``: the checkpoint's fuser as it stands, in ``DIR/<kind>``, nothing trained
    (the legs' records, the loss curve and the checkpoint are left as they are: the run resumes)."""
    folder = checkpoint_folder(run)
    if not legs.has_state(folder):
        raise SystemExit(f"--fuser-now: no checkpoint in {folder} (train a leg first)")
    step = int(legs.load_state(folder, dict(fuser.named_parameters()), optimizer)["step"])
    recorded = [leg for leg in legs.legs(run.out, name=f"legs_{run.kind}.jsonl") if leg["to_step"] <= step]
    seconds, steps_run = sum(leg["seconds"] for leg in recorded), sum(leg["to_step"] - leg["from_step"] for leg in recorded)
    run.log(f"the {run.kind} fuser as it stands at step {step} of {run.args.steps} (no training)")
    fuser.eval()
    summary, _ = save_measured(run, fuser, heldout, seconds, steps_run, Path(run.args.fuser_now) / run.kind, step)
    (Path(run.args.fuser_now) / f"summary_{run.kind}.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


def main(args) -> int:
    run = start(args)
    train, heldout = training_examples(run)
    fuser = initial_fuser(run)
    optimizer, scheduler = optimizer_for(args, fuser)
    if args.fuser_now:
        return fuser_now(run, fuser, optimizer, heldout) if run.is_main else 0
    start_step = resume(run, fuser, optimizer, scheduler)
    model, optimizer = run.accelerator.prepare(fuser, optimizer)
    _, step = train_steps(run, model, optimizer, scheduler, train, start_step)
    run.accelerator.wait_for_everyone()
    if not run.is_main:
        return 0
    if step < args.steps:
        run.log(f"leg done at step {step} of {args.steps}: run the same command (with --resume) to continue")
        return 0
    seconds = sum(leg["seconds"] for leg in legs.legs(run.out, name=f"legs_{run.kind}.jsonl"))
    summary = finish(run, run.accelerator.unwrap_model(model), heldout, seconds, args.steps)
    print(json.dumps(summary, indent=2))
    return 0
