"""Train a KV translator through the frozen receiver, in legs that checkpoint and resume.

    python -m kvviz train-translator --out runs/translator/legs --init assets/translators/embedded --minutes 55
    python -m kvviz train-translator --out runs/translator/legs --minutes 55     # the next leg: resumes

The objective is the receiver side (``kvviz.studies.c2c.translator_loss.FollowLoss``): the
sharer reads a note, the translator maps its KV, the receiver reads what follows the note (a
question, or the note's own continuation) and is scored against Skyline, the same receiver reading
the note itself; a note with a swap twin must give its own answer and the twin its own
(``--follow-weight``, ``--follow-margin``); a question over another note's context must not be
answered worse than by the receiver alone (the harm guard: ``--harm-weight``,
``--harm-tolerance``). The notes are ``kvviz.studies.c2c.translator_data.mixture`` (``FOLLOW_MIX``
unless ``--mix`` says otherwise): generic text and paragraphs, who is where (train landmarks and
cities), questions the note does not answer, recall, Countries, Dolly and its passages, mismatched
notes, with nothing of the evaluation's entities or paragraphs. ``--attach side`` trains a
side-memory translator (``kvviz.handoffs.translate.side``) from the ``--init`` translator's map.

A run lives in its ``--out`` folder:

* ``run.json``: what defines the run (the starting translator and its fingerprint, the data, the
  objective, the optimiser). A later leg reads it; flags that would change it are refused.
* ``state/``: the translator (float32), the optimiser's moments (safetensors, nothing is
  unpickled) and ``progress.json`` (steps, the position in the notes). Saved every
  ``--save-minutes`` and at the end of a leg; a leg resumes from it exactly (the notes come in a
  fixed order and nothing else is random), so two legs of N steps end where one of 2N does.
* ``legs.jsonl``: one line per leg: its steps, seconds, training losses and held-out numbers
  (who-is-where and recall validation records of the held-out pools, drawn with seed 50, and
  Dolly's extractive passages, never trained on; none of them the evaluator's: answer rate, NLL and
  follow rate of the translator and its control).
* ``leg-N/``: the translator after leg N (what ``eval-translator --translator`` reads).

A leg ends after ``--minutes`` (at a step's end), after ``--steps`` or when the run's ``--epochs``
are done. ``--device cuda`` runs the same code on a GPU.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from kvviz.engine.runner import load_pair
from kvviz.handoffs.translate import translator as tr
from kvviz.runtime.checkpoints import CheckpointError
from kvviz.studies.c2c import translator_data as td
from kvviz.studies.c2c.translator_rows import evaluate
from kvviz.studies.c2c.translator_sets import heldout_sets
from kvviz.studies.c2c.translator_loss import FollowLoss, ReceiverLoss

STATE_FORMAT = "kvviz-translator-training"
STATE_VERSION = 1
VALIDATION_SEED = 50
RUN_KEYS = ("init_fingerprint", "pair", "notes", "seed", "mix", "lr", "weight_lr", "gate_lr", "batch", "kd_weight",
            "ce_weight", "top_k", "epochs", "twins", "follow_weight", "follow_margin", "harm_weight", "harm_tolerance", "attach")
# what a run made before issue 43 (its run.json lacks these keys) trained with
BEFORE_FOLLOW = {"twins": False, "follow_weight": 0.0, "follow_margin": 0.0, "harm_weight": 0.0, "harm_tolerance": 0.0,
                 "attach": "splice"}


class TrainingStateError(CheckpointError):
    """A training folder's state is missing, corrupt, or belongs to another run."""


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def run_spec(args, init_folder: Path) -> dict:
    """What defines a run (``RUN_KEYS``), from the flags and the starting translator."""
    mix = dict(td.FOLLOW_MIX)
    for item in filter(None, (args.mix or "").split(",")):
        kind, _, share = item.partition("=")
        mix[kind.strip()] = float(share)
    return {
        "init": str(init_folder), "init_fingerprint": file_digest(Path(init_folder) / tr.WEIGHTS_FILE), "pair": args.pair,
        "notes": args.notes, "seed": args.seed, "mix": mix, "lr": args.lr, "weight_lr": args.lr * 10, "gate_lr": args.gate_lr,
        "batch": args.batch, "kd_weight": args.kd_weight, "ce_weight": args.ce_weight, "top_k": args.top_k, "epochs": args.epochs,
        "twins": not args.no_twins, "follow_weight": args.follow_weight, "follow_margin": args.follow_margin,
        "harm_weight": args.harm_weight, "harm_tolerance": args.harm_tolerance, "attach": args.attach,
    }


def with_defaults(spec: dict) -> dict:
    """A run's spec with the keys a run from before issue 43 lacks, as it trained."""
    return {**BEFORE_FOLLOW, **spec}


def optimizer_for(translator: tr.KVTranslator, spec: dict) -> torch.optim.Optimizer:
    """AdamW over the map (``lr``), the per-token weights (``weight_lr``) and the gates (``gate_lr``)."""
    gates = [translator.side_gate_logits] if translator.side else [translator.gate_logits]
    groups = [
        {"params": [p for n, p in translator.named_parameters() if n in ("down", "up") and p is not None], "lr": spec["lr"]},
        {"params": [translator.weight_proj, translator.weight_bias], "lr": spec["weight_lr"]},
        {"params": gates, "lr": spec["gate_lr"]},
    ]
    return torch.optim.AdamW(groups, weight_decay=0.0)


# --- the state on disk ----------------------------------------------------------------------------------


def save_state(folder: Path, translator, optimizer, progress: dict, spec: dict) -> None:
    """The translator, the optimiser's moments and the progress, written beside and then swapped in."""
    from safetensors.torch import save_file

    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    translator.save(tmp, dtype=torch.float32)
    names = {id(p): n for n, p in translator.named_parameters()}
    tensors = {}
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            state = optimizer.state.get(parameter)
            if state:
                name = names[id(parameter)]
                tensors[f"exp_avg.{name}"] = state["exp_avg"].detach().cpu().contiguous()
                tensors[f"exp_avg_sq.{name}"] = state["exp_avg_sq"].detach().cpu().contiguous()
                tensors[f"step.{name}"] = torch.as_tensor(state["step"], dtype=torch.float32).reshape(1).cpu()
    save_file(tensors, str(tmp / "optimizer.safetensors"), metadata={"format": STATE_FORMAT, "version": str(STATE_VERSION)})
    (tmp / "progress.json").write_text(json.dumps({**progress, "format": STATE_FORMAT, "version": STATE_VERSION,
                                                   "run": run_fingerprint(spec)}, indent=2))
    old = folder.with_name(folder.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def run_fingerprint(spec: dict) -> str:
    """What identifies a run's state (the keys a run from before issue 43 lacks are left out, so its
    state still resumes)."""
    return hashlib.sha256(json.dumps({k: spec[k] for k in RUN_KEYS if k in spec}, sort_keys=True).encode()).hexdigest()[:16]


def load_state(folder: Path, pair, spec: dict, device: str = "cpu"):
    """(translator, optimizer, progress) from a state folder; TrainingStateError when it is missing,
    corrupt or another run's."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        progress = json.loads((folder / "progress.json").read_text())
    except (OSError, ValueError) as error:
        raise TrainingStateError(f"No readable training state in {folder} ({error}).") from error
    if progress.get("format") != STATE_FORMAT or progress.get("version") != STATE_VERSION:
        raise TrainingStateError(f"{folder} is not a kvviz translator training state (format {STATE_FORMAT!r} v{STATE_VERSION}).")
    if progress.get("run") != run_fingerprint(spec):
        raise TrainingStateError(f"The training state in {folder} belongs to another run (its settings differ from run.json's).")
    translator = tr.load_translator(folder, pair.sharer.facts, pair.receiver.facts, pair.name, device)
    optimizer = optimizer_for(translator, spec)
    try:
        tensors = load_file(str(folder / "optimizer.safetensors"))
    except (OSError, SafetensorError) as error:
        raise TrainingStateError(f"The optimiser state in {folder} is missing or corrupt ({error}).") from error
    for name, parameter in translator.named_parameters():
        if f"exp_avg.{name}" not in tensors:
            continue
        if tensors[f"exp_avg.{name}"].shape != parameter.shape:
            raise TrainingStateError(f"The optimiser state in {folder} does not match the translator ({name}).")
        optimizer.state[parameter] = {"step": tensors[f"step.{name}"].reshape(()).clone(),
                                      "exp_avg": tensors[f"exp_avg.{name}"].to(device),
                                      "exp_avg_sq": tensors[f"exp_avg_sq.{name}"].to(device)}
    return translator, optimizer, progress


def start_or_resume(out: Path, args, pair):
    """(spec, translator, optimizer, progress): a new run from ``--init``, or the run in ``out``."""
    run_file = out / "run.json"
    if run_file.is_file():
        spec = json.loads(run_file.read_text())
        asked = run_spec(args, Path(args.init or spec["init"]))
        changed = [k for k in RUN_KEYS if k != "init_fingerprint" and asked[k] != with_defaults(spec)[k] and args_given(args, k)]
        if args.init and asked["init_fingerprint"] != spec["init_fingerprint"]:
            changed.append("init")
        if changed:
            raise TrainingStateError(f"{out} holds a run with other settings ({', '.join(changed)}); resume it without "
                                     f"them, or start another run in another folder.")
        translator, optimizer, progress = load_state(out / "state", pair, spec, args.device)
        return spec, translator, optimizer, progress
    if not args.init:
        raise ValueError(f"{out} holds no run yet: give the starting translator with --init DIR.")
    spec = run_spec(args, Path(args.init))
    translator = tr.load_translator(args.init, pair.sharer.facts, pair.receiver.facts, pair.name, args.device)
    if spec["attach"] != translator.config.attach:
        translator = tr.reattached(translator, spec["attach"])
    out.mkdir(parents=True, exist_ok=True)
    run_file.write_text(json.dumps({**spec, "command": command_line()}, indent=2))
    progress = {"step": 0, "cursor": 0, "leg": 0, "seconds": 0.0}
    optimizer = optimizer_for(translator, spec)
    save_state(out / "state", translator, optimizer, progress, spec)
    return spec, translator, optimizer, progress


def args_given(args, key: str) -> bool:
    """Whether a flag that defines the run was given on this command line (not left at its default)."""
    flag = {"notes": "--notes", "seed": "--seed", "mix": "--mix", "lr": "--lr", "weight_lr": "--lr", "gate_lr": "--gate-lr",
            "batch": "--batch", "kd_weight": "--kd-weight", "ce_weight": "--ce-weight", "top_k": "--top-k", "epochs": "--epochs",
            "pair": "--pair", "twins": "--no-twins", "follow_weight": "--follow-weight", "follow_margin": "--follow-margin",
            "harm_weight": "--harm-weight", "harm_tolerance": "--harm-tolerance", "attach": "--attach"}.get(key)
    return flag is not None and any(word == flag or word.startswith(flag + "=") for word in getattr(args, "argv", sys.argv))


def command_line() -> str:
    return "python -m kvviz " + " ".join(sys.argv[1:])


# --- a leg -----------------------------------------------------------------------------------------------


def train_leg(pair, translator, optimizer, spec: dict, notes: list, progress: dict, limits: dict, save) -> dict:
    """Optimiser steps from ``progress`` until a limit (``minutes``, ``steps``, the run's epochs);
    ``save(progress)`` every ``save_minutes``. Returns the leg's mean losses and counts."""
    spec = with_defaults(spec)
    loss_fn = FollowLoss(ReceiverLoss(spec["kd_weight"], spec["ce_weight"], spec["top_k"]), spec["follow_weight"],
                         spec["follow_margin"], spec["harm_weight"], spec["harm_tolerance"])
    total_steps = spec["epochs"] * len(notes) // spec["batch"]
    started = last_save = time.perf_counter()
    sums, counts, counted, steps = {"loss": 0.0}, {}, 0, 0
    budget = min(total_steps - progress["step"], limits.get("steps") or total_steps)
    translator.train()
    bar = tqdm(total=budget, desc=f"leg {progress['leg'] + 1}", unit="step", file=sys.stderr, dynamic_ncols=True)
    while steps < budget and time.perf_counter() - started < limits["minutes"] * 60:
        optimizer.zero_grad(set_to_none=True)
        for _ in range(spec["batch"]):
            note = notes[progress["cursor"] % len(notes)]
            progress["cursor"] += 1
            if not td.target_ids(pair.receiver.tokenizer, note)[1]:
                continue
            loss, parts = loss_fn(pair, translator, note)
            (loss / spec["batch"]).backward()
            sums["loss"] += float(loss.detach())
            for name, value in parts.items():  # each part's mean over the notes that have it
                sums[name] = sums.get(name, 0.0) + value
                counts[name] = counts.get(name, 0) + 1
            counted += 1
        torch.nn.utils.clip_grad_norm_(translator.parameters(), 1.0)
        optimizer.step()
        progress["step"] += 1
        steps += 1
        bar.update(1)
        bar.set_postfix(loss=f"{sums['loss'] / max(counted, 1):.3f}",
                        **{k: f"{sums[k] / counts[k]:.3f}" for k in ("kd", "follow", "harm") if counts.get(k)})
        if time.perf_counter() - last_save > limits["save_minutes"] * 60:
            save(progress)
            last_save = time.perf_counter()
    bar.close()
    translator.eval()
    counts["loss"] = counted
    return {"steps": steps, "notes": counted, "seconds": time.perf_counter() - started,
            **{f"train_{k}": v / max(counts.get(k, 0), 1) for k, v in sums.items()}}


def validation_sets(n: int) -> dict:
    """Held-out validation records (held-out pools, seed 50, and Dolly's extractive passages: not
    the evaluator's records)."""
    if not n:
        return {}
    return heldout_sets(n, 0, VALIDATION_SEED - 1, whereabouts_n=n, passages_n=n)  # seed + 1: the records of seed 50


def validate(pair, translator, n: int) -> dict:
    """Answer rate, NLL and follow rate of the translator and its control on the validation records."""
    if not n:
        return {}
    report = evaluate(pair, translator, validation_sets(n), rows=("translator", "control"), max_new_tokens=12,
                      progress=lambda message: None, examples=0, checks=0)
    out = {}
    for name, summary in report.items():
        rows = summary["rows"]
        out[name] = {row: {"rate": v["rate"], "nll": round(v["nll"], 4)} for row, v in rows.items()}
        if summary.get("swap"):
            out[name]["follow"] = {row: v["rate"] for row, v in summary["swap"]["rows"].items()}
        if summary.get("communication"):
            out[name]["gain"] = round(summary["communication"]["gain"], 4)
    return out


def configure_parser(parser) -> None:
    parser.add_argument("--out", required=True, help="the run's folder (resumed when it holds one)")
    parser.add_argument("--init", default="", help="the starting translator folder (a new run only)")
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--minutes", type=float, default=55.0, help="this leg's length (it ends at a step's end)")
    parser.add_argument("--steps", type=int, default=0, help="at most this many optimiser steps in this leg (0: no limit)")
    parser.add_argument("--save-minutes", type=float, default=15.0)
    parser.add_argument("--notes", type=int, default=24000, help="training notes in the run's mixture")
    parser.add_argument("--epochs", type=int, default=1, help="passes over the notes in the whole run")
    parser.add_argument("--mix", default="", help="kind=share,... over translator_data.FOLLOW_MIX")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-4, help="the map's learning rate (the per-token weights' is 10x)")
    parser.add_argument("--gate-lr", type=float, default=0.01)
    parser.add_argument("--kd-weight", type=float, default=1.0, help="weight of the KL from Skyline")
    parser.add_argument("--ce-weight", type=float, default=1.0, help="weight of the gold token's cross-entropy")
    parser.add_argument("--top-k", type=int, default=32, help="Skyline's likeliest tokens the head is restricted to (plus the gold one)")
    parser.add_argument("--no-twins", action="store_true", help="no swap twins (issue 31's notes)")
    parser.add_argument("--follow-weight", type=float, default=1.0, help="weight of the follow hinge on swap pairs")
    parser.add_argument("--follow-margin", type=float, default=2.0,
                        help="nats by which each note's own answer must lead its twin's at the first answer token")
    parser.add_argument("--harm-weight", type=float, default=1.0, help="weight of the harm guard on mismatched notes")
    parser.add_argument("--harm-tolerance", type=float, default=0.1,
                        help="nats per answer token another note's translation may cost against the receiver alone")
    parser.add_argument("--attach", choices=tr.ATTACHES, default="splice",
                        help="splice: the translated KV in the receiver's cache; side: a gated branch beside its attention")
    parser.add_argument("--validation", type=int, default=30, help="validation records per set after each leg (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)


def main(args) -> int:
    torch.set_num_threads(args.threads)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    pair = load_pair(args.pair, args.device, None, progress=log)
    run_leg(pair, args, log)
    return 0


def run_leg(pair, args, log=print, notes: list | None = None) -> dict:
    """One leg of the run in ``args.out`` (started from ``args.init`` when the folder holds none);
    ``notes``: the training notes (default: the run's mixture). Returns the leg's record."""
    out = Path(args.out)
    pair.receiver.model.requires_grad_(False)
    pair.sharer.model.requires_grad_(False)
    spec, translator, optimizer, progress = start_or_resume(out, args, pair)
    notes = td.mixture(spec["notes"], spec["seed"], spec["mix"], with_defaults(spec)["twins"]) if notes is None else notes
    log(f"{out}: step {progress['step']}, note {progress['cursor']} of {len(notes)} x {spec['epochs']} epochs")
    if progress["leg"] == 0 and args.validation:
        log("validation before training ...")
        append_leg(out, {"leg": 0, "step": 0, "validation": validate(pair, translator, args.validation)})
    limits = {"minutes": args.minutes, "steps": args.steps, "save_minutes": args.save_minutes}
    leg = train_leg(pair, translator, optimizer, spec, notes, progress, limits,
                    lambda p: save_state(out / "state", translator, optimizer, p, spec))
    progress["leg"] += 1
    progress["seconds"] = progress.get("seconds", 0.0) + leg["seconds"]
    save_state(out / "state", translator, optimizer, progress, spec)
    translator.config.training = {**translator.config.training, "receiver_side": {
        **{k: with_defaults(spec)[k] for k in RUN_KEYS if k != "init_fingerprint"}, "init": spec["init"], "steps": progress["step"],
        "notes_read": progress["cursor"], "legs": progress["leg"], "seconds": round(progress["seconds"]),
        "command": f"python -m kvviz train-translator --out {out}"}}
    translator.save(out / f"leg-{progress['leg']}", dtype=torch.float32)
    record = {"leg": progress["leg"], "step": progress["step"], "cursor": progress["cursor"], **leg,
              "command": command_line(), "validation": validate(pair, translator, args.validation)}
    append_leg(out, record)
    log(json.dumps(record, indent=2))
    return record


def append_leg(out: Path, record: dict) -> None:
    with (Path(out) / "legs.jsonl").open("a") as handle:
        handle.write(json.dumps(record) + "\n")
