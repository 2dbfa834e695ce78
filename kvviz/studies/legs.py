"""Training in legs: a time budget per run, and a checkpoint that the same command resumes from.

On a shared 2-core machine a training run does not fit in one sitting. A trainer gives itself a
budget (``--minutes``); when it is spent the trainer saves where it is and exits, and running the
same command again continues from there (``Budget``, ``save_state``, ``load_state``). Each leg
appends one line to ``legs.jsonl`` (its steps, seconds and last loss: what docs/C2C.md reports).

The checkpoint holds the trained parameters by name, the optimizer's state (AdamW's moments and
step count) and torch's random state, as safetensors, and the step and trainer's notes as JSON:
nothing is pickled.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

STATE_FILE = "state.safetensors"
TRAINER_FILE = "trainer.json"
LEGS_FILE = "legs.jsonl"


class Budget:
    """A leg's time budget: ``spent()`` once ``minutes`` have passed since it started (0: never)."""

    def __init__(self, minutes: float = 0.0):
        self.minutes = float(minutes or 0.0)
        self.started = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def spent(self) -> bool:
        return self.minutes > 0 and self.seconds >= self.minutes * 60


def save_state(folder: Path, parameters: dict[str, torch.Tensor], optimizer, step: int, notes: dict | None = None) -> None:
    """Write the named parameters, ``optimizer``'s state for them and the random state into
    ``folder`` (files replaced whole: an interrupted save leaves the previous checkpoint)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = {id(tensor): name for name, tensor in parameters.items()}
    tensors = {f"param::{name}": tensor.detach().to("cpu").contiguous() for name, tensor in parameters.items()}
    for group in optimizer.param_groups:
        for param in group["params"]:
            for key, value in optimizer.state.get(param, {}).items():
                tensors[f"optim::{names[id(param)]}::{key}"] = torch.as_tensor(value).detach().to("cpu").contiguous()
    tensors["rng::torch"] = torch.get_rng_state()
    temporary = folder / (STATE_FILE + ".tmp")
    save_file(tensors, str(temporary))
    temporary.replace(folder / STATE_FILE)
    (folder / (TRAINER_FILE + ".tmp")).write_text(json.dumps({"step": step, **(notes or {})}, indent=2))
    (folder / (TRAINER_FILE + ".tmp")).replace(folder / TRAINER_FILE)


def has_state(folder: Path) -> bool:
    return (Path(folder) / TRAINER_FILE).is_file() and (Path(folder) / STATE_FILE).is_file()


def load_state(folder: Path, parameters: dict[str, torch.Tensor], optimizer) -> dict:
    """Restore what ``save_state`` wrote into the same named parameters and optimizer; returns the
    trainer's JSON (its ``step`` and notes). A ValueError names a parameter the checkpoint lacks."""
    tensors = load_file(str(Path(folder) / STATE_FILE))
    missing = [name for name in parameters if f"param::{name}" not in tensors]
    if missing:
        raise ValueError(f"The checkpoint in {folder} was made for other parameters (it lacks {missing[0]}); "
                         "use another --out, or delete it to start over.")
    with torch.no_grad():
        for name, tensor in parameters.items():
            tensor.copy_(tensors[f"param::{name}"].to(tensor.device, tensor.dtype))
    by_name = {name: tensor for name, tensor in parameters.items()}
    for key, value in tensors.items():
        if key.startswith("optim::"):
            _, name, field = key.split("::", 2)
            param = by_name[name]
            optimizer.state[param][field] = value.to(param.device) if field != "step" else value.float()
    torch.set_rng_state(tensors["rng::torch"])
    return json.loads((Path(folder) / TRAINER_FILE).read_text())


def log_leg(out: Path, record: dict, name: str = LEGS_FILE) -> None:
    """Append one leg's record (steps, seconds, loss, ...) to ``out/legs.jsonl`` (or ``name``)."""
    with (Path(out) / name).open("a") as handle:
        handle.write(json.dumps(record) + "\n")


def legs(out: Path, name: str = LEGS_FILE) -> list[dict]:
    """The legs run so far in ``out`` (oldest first)."""
    path = Path(out) / name
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
