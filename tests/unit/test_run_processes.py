"""Where the page's runs are computed (``kvviz.engine.run_processes``), without starting a worker."""

from __future__ import annotations

import pytest
import torch

from kvviz.core import policy, zerogpu
from kvviz.engine import run_processes
from kvviz.engine.events import Done
from kvviz.engine.stream import run
from kvviz.core.results import GenerationSettings, HandoffRequest


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.delenv("KVVIZ_RUN_PROCESSES", raising=False)
    monkeypatch.delenv("KVVIZ_CONCURRENCY", raising=False)
    monkeypatch.setattr(run_processes.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(zerogpu, "available", lambda: False)


def test_a_cpu_with_cores_computes_runs_in_one_worker_per_core(two_cores, monkeypatch):
    assert run_processes.default_count() == 2
    monkeypatch.setattr(run_processes.os, "cpu_count", lambda: 16)
    assert run_processes.default_count() == policy.model_concurrency()  # never more workers than runs at once
    monkeypatch.setattr(run_processes.os, "cpu_count", lambda: 1)
    assert run_processes.default_count() == 0


def test_a_gpu_or_a_space_computes_in_the_server(two_cores, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert run_processes.default_count() == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(zerogpu, "available", lambda: True)
    assert run_processes.default_count() == 0


def test_the_setting_wins_and_a_bad_one_says_what_it_wants(two_cores, monkeypatch):
    monkeypatch.setenv("KVVIZ_RUN_PROCESSES", "0")
    assert run_processes.default_count() == 0
    monkeypatch.setenv("KVVIZ_RUN_PROCESSES", "3")
    assert run_processes.default_count() == 3
    for bad in ("two", "-1"):
        monkeypatch.setenv("KVVIZ_RUN_PROCESSES", bad)
        with pytest.raises(ValueError, match="KVVIZ_RUN_PROCESSES"):
            run_processes.default_count()
    with pytest.raises(ValueError, match="at least one"):
        run_processes.RunProcesses(0)


def test_a_pair_loaded_here_runs_here_without_a_worker(tiny):
    """The speed report passes its loaded pair: that run stays in this process, and no worker starts."""
    workers = run_processes.RunProcesses(1)
    request = HandoffRequest(query="Q?", context="C.", generation=GenerationSettings(max_new_tokens=3))
    here = [event for batch in run(tiny.name, request, ["receiver"], 1, loaded=tiny) for event in batch]
    there = [event for batch in workers.run(tiny.name, request, ["receiver"], 1, loaded=tiny) for event in batch]
    done = [event for event in there if isinstance(event, Done)]
    assert len(done) == 1 and done[0].result["answer_ids"] == next(e for e in here if isinstance(e, Done)).result["answer_ids"]
    assert workers._workers == [None]
