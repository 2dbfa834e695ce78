"""Gate 1 of issue 42 on the embedded pair: in the numeric mode this CPU picks (``KVVIZ_NUMERICS=auto``:
bf16 where the CPU multiplies bfloat16 natively), every handoff's tokens alone equal its tokens with
all the others at once, on every preset, and every model's decode step gives a sequence the same bits
alone and at another slot of a batch (``python -m pytest -m real_model -k invariance``).

The check runs in a process of its own (``tests/real_model/invariance_in_mode.py``): a server runs one
mode, and some handoffs cache per model name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from kvviz.runtime import numerics
from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def chosen_mode_report(embedded_pair) -> dict:  # embedded_pair: the models are converted (or the tier skips)
    env = dict(os.environ, KVVIZ_NUMERICS="auto", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "tests.real_model.invariance_in_mode"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.real_model
def test_invariance_the_chosen_mode_is_the_cpus(chosen_mode_report):
    expected = numerics.mode_for("cpu", torch.float32, "auto")
    assert set(chosen_mode_report["numerics"].values()) == {expected}
    for path in chosen_mode_report["decode_path"].values():
        assert path["batched"], path  # the shared decode step covers both models in the mode


@pytest.mark.real_model
def test_invariance_every_handoff_gets_the_same_tokens_alone_and_in_a_shared_batch_in_the_chosen_mode(chosen_mode_report):
    rows = chosen_mode_report["handoffs"]
    assert sum(row["applicable"] for row in rows) >= len(rows) // 2  # (some handoffs need a note some presets lack)
    for row in rows:
        assert row["together"] == row["alone"], (row["preset"], row["handoff"])
    assert max(row["largest_batch"] for row in rows) >= 4  # the steps were shared


@pytest.mark.real_model
def test_invariance_a_sequence_gets_the_same_bits_alone_and_at_any_slot_in_the_chosen_mode(chosen_mode_report):
    for name, result in chosen_mode_report["slots"].items():
        assert result["steps"] > 0 and result["equal"], (name, result)
