"""What ``train-fuser`` writes besides its fuser: the loss curve (CSV, kept across legs, and its
plot), how the fuser was trained (its config's ``training`` record), and the summary of the run
(held-out NLL, the communication measure, the gates).
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import plotly.graph_objects as go
import torch

from kvviz.handoffs.c2c.fuser import C2CFuser
from kvviz.studies.c2c.communication import communication_measure
from kvviz.studies.c2c.examples import Example
from kvviz.studies.c2c.scoring import mean_nll

LOSS_COLUMNS = ["step", "loss", "lr", "tau", "seconds"]


def start_loss_log(path: Path, start_step: int) -> None:
    """The loss CSV's header (resuming: the curve up to the checkpoint is kept)."""
    kept = []
    if start_step and path.exists():
        kept = [row for row in csv.reader(path.open()) if row and row[0] != "step" and int(row[0]) <= start_step]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(LOSS_COLUMNS)
        writer.writerows(kept)


def log_loss(path: Path, step: int, loss: float, lr: float, tau: float, seconds: float) -> None:
    with path.open("a", newline="") as handle:
        csv.writer(handle).writerow([step, f"{loss:.5f}", f"{lr:.3e}", f"{tau:.4g}", f"{seconds:.1f}"])


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


def training_record(run, core: C2CFuser, heldout: list[Example], measured: dict, seconds: float, steps_run: int,
                    steps_done: int | None = None) -> dict:
    """How the fuser was trained, for its config (``FuserConfig.training``). ``run``: the trainer's
    ``Run``; ``seconds``: the training time of every leg together, over ``steps_run`` steps;
    ``steps_done``: the step its weights are at (a partly trained fuser, ``--fuser-now``; default:
    the schedule's last)."""
    args = run.args
    steps_done = args.steps if steps_done is None else steps_done
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
        "steps_done": steps_done, "finished": steps_done >= args.steps,
    }
    if measured["communication"] is not None:
        record["communication"] = measured["communication"]
    return record


def measure_heldout(run, core: C2CFuser, heldout: list[Example]) -> dict:
    """Held-out NLL of the fuser and of the receiver alone, and with ``--measure`` the communication measure."""
    measured = {"heldout_nll": mean_nll(run.pair, core, heldout), "receiver_nll": mean_nll(run.pair, None, heldout),
                "communication": None}
    if run.args.measure:
        communication = communication_measure(run.pair, core, heldout[: run.args.measure], not run.receiver_sees_context)
        run.log(f"communication gain {communication['gain']:+.4f} nats/token, 95% CI {communication['ci95']}")
        measured["communication"] = communication
    return measured


def finish(run, core: C2CFuser, heldout: list[Example], seconds: float, steps_run: int) -> dict:
    """Measure, save the fuser with its training record, the loss plot and the summary."""
    kind = run.kind
    summary, measured = save_measured(run, core, heldout, seconds, steps_run, run.out / kind)
    write_loss_plot(run.out / f"loss_{kind}.csv", run.out / f"loss_{kind}.html",
                    {f"held-out NLL ({kind})": measured["heldout_nll"], "held-out NLL (receiver alone)": measured["receiver_nll"]})
    (run.out / f"summary_{kind}.json").write_text(json.dumps(summary, indent=2))
    return summary


def save_measured(run, core: C2CFuser, heldout: list[Example], seconds: float, steps_run: int, target: Path,
                  steps_done: int | None = None) -> tuple[dict, dict]:
    """Measure the fuser on the held-out examples, save it in ``target`` with its training record;
    (its summary, what was measured)."""
    args, kind = run.args, run.kind
    measured = measure_heldout(run, core, heldout)
    core.config.training = training_record(run, core, heldout, measured, seconds, steps_run, steps_done)
    core.save(target, dtype=torch.float16 if args.fp16 else torch.float32)
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
        "steps_done": core.config.training["steps_done"], "steps": args.steps,
    }
    return summary, measured
