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


def test_the_app_computes_in_its_workers_with_four_runs_each(monkeypatch):
    """``python app.py`` on a CPU with two cores: two workers, each loading the pair at start, the page's
    runs computed through them, and four runs a worker let onto the models (where not set)."""
    import app
    from kvviz.app import ui
    from kvviz.engine import stream

    monkeypatch.setenv("KVVIZ_CONCURRENCY", "")  # restored after the test: app.main sets it
    monkeypatch.delenv("KVVIZ_CONCURRENCY")
    made, warmed, computed = [], [], []

    class Workers:  # no process started
        def __init__(self, count):
            made.append(count)

        def warm(self, pair):
            warmed.append(pair)

        def run(self, *args, **kwargs):
            raise AssertionError("no run here")

    class Demo:
        def launch(self, **kwargs):
            pass

    def build_demo(default_pair, compute):
        computed.append(compute)
        return Demo()

    monkeypatch.setattr(run_processes, "default_count", lambda: 2)
    monkeypatch.setattr(run_processes, "RunProcesses", Workers)
    monkeypatch.setattr(ui, "build_demo", build_demo)
    monkeypatch.setattr(stream, "use_one_thread_per_handoff", lambda: None)
    app.main(["--pair", "embedded"])
    assert made == [2] and warmed == ["embedded"]
    assert computed[0].__func__ is Workers.run
    assert policy.model_concurrency() == 2 * policy.RUNS_PER_WORKER_PROCESS
