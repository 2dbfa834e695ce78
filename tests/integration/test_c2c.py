"""C2C training in two CPU processes (gloo), as ``accelerate launch`` runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

TRAIN_SCRIPT = """
import sys, torch
torch.set_num_threads(1)
from kvviz.runtime.models import register_loaded
from tests.tiny_models import tiny_gemma, tiny_llama
register_loaded(tiny_llama())
register_loaded(tiny_gemma())
from kvviz.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.integration
def test_two_cpu_processes_train_with_gloo(tmp_path):
    """`accelerate launch` with two CPU processes (gloo): a few steps, one checkpoint.

    ``--cpu`` makes accelerate start a single process (multi-CPU needs mpirun), so the test uses
    the torchrun launcher (``--multi_gpu``) and ``--device cpu`` selects the gloo backend.
    """
    data = tmp_path / "data.jsonl"
    rows = [
        {"instruction": f"What is item {i}?", "input": f"Item {i} is a red bicycle number {i}.", "output": f"A red bicycle {i}."}
        for i in range(12)
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", str(script),
        "train-fuser", "--pair", "tiny-llama+tiny-gemma", "--data", str(data), "--out", str(tmp_path / "out"),
        "--steps", "3", "--heldout", "2", "--width", "8", "--device", "cpu", "--no-progress", "--save-every", "2",
    ]
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary_c2c.json").read_text())
    assert summary["kind"] == "c2c"
    config = json.loads((tmp_path / "out" / "c2c" / "config.json").read_text())
    assert config["training"]["processes"] == 2 and config["training"]["steps"] == 3
    assert (tmp_path / "out" / "checkpoint_c2c" / "state.safetensors").exists()  # kvviz.studies.legs: parameters, optimizer, random state
    assert "gloo" in done.stdout + done.stderr
    assert len((tmp_path / "out" / "loss_c2c.csv").read_text().strip().splitlines()) == 4
