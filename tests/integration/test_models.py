"""The command line in another process: its help lists the subcommands, bad input gets one line."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.integration
def test_cli_help_lists_subcommands():
    output = subprocess.run([sys.executable, "-m", "kvviz", "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("models", "prepare", "run", "bench", "train-fuser", "eval-fuser"):
        assert command in output


@pytest.mark.integration
def test_cli_reports_bad_input_in_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "kvviz", "run", "--pair", "nope", "--query", "hi"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "error: Unknown pair 'nope'" in done.stderr and "Traceback" not in done.stderr
