"""The page's runs in worker processes (``kvviz.engine.run_processes``) on the embedded pair: the
same tokens as in the server's own process, a Stop that stops, and a worker that dies says so and is
replaced."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from kvviz.engine.events import Done, Failed, Token
from kvviz.engine.run_processes import RunProcesses
from kvviz.engine.stream import ALL_AT_ONCE, run
from kvviz.studies import run_speed

HANDOFFS = list(run_speed.default_handoffs())


def request(code: str, tokens: int = 4):
    return run_speed.full_run_request(code, tokens=tokens)


def answers(batches) -> dict:
    return {event.handoff: event.result.get("answer_ids") for batch in batches for event in batch
            if isinstance(event, Done)}


@pytest.fixture(scope="module")
def processes():
    workers = RunProcesses(2)
    yield workers
    workers.close()


def test_runs_in_worker_processes_give_the_tokens_of_this_process(embedded_pair, processes):
    """Three distinct runs at once over two workers (two share one worker's decode steps): every
    handoff's tokens equal the same run's in this process."""
    codes = [str(int(run_speed.FULL_RUN_GOLD) + index) for index in range(3)]
    here = {code: answers(run(embedded_pair.name, request(code), HANDOFFS, ALL_AT_ONCE, loaded=embedded_pair))
            for code in codes}
    found: dict[str, dict] = {}

    def one(code):
        found[code] = answers(processes.run("embedded", request(code), HANDOFFS, ALL_AT_ONCE))

    threads = [threading.Thread(target=one, args=(code,)) for code in codes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(found) == set(codes)
    for code in codes:
        assert set(found[code]) == set(HANDOFFS)
        assert all(found[code][name] for name in HANDOFFS)  # every handoff answered something
        assert found[code] == here[code], code


def test_stop_ends_the_run_and_the_worker_goes_on(processes):
    stop = threading.Event()
    events = []
    started = None
    for batch in processes.run("embedded", request("4321", tokens=64), ["text"], 1, stop=stop):
        events += batch
        if any(isinstance(event, Token) for event in batch) and started is None:
            started = time.monotonic()
            stop.set()
    assert started is not None and time.monotonic() - started < 2.0
    assert not any(isinstance(event, Done) for event in events)  # stopped before its answer was done
    assert answers(processes.run("embedded", request("4321"), ["receiver"], 1))["receiver"]


def test_a_worker_that_dies_fails_its_runs_and_is_replaced():
    """Killed mid-run (as the out-of-memory killer would): the run ends with a line that says so, and
    the next run starts a new worker."""
    workers = RunProcesses(1)
    try:
        died, last = [], None
        for batch in workers.run("embedded", request("1111", tokens=64), ["text"], 1):
            if any(isinstance(event, Token) for event in batch) and not died:
                died.append(workers._workers[0].process.pid)
                os.kill(died[0], signal.SIGKILL)
            last = batch
        assert died
        assert isinstance(last[-1], Failed)
        assert "worker process computing this run ended (exit code -9)" in last[-1].reason
        assert answers(workers.run("embedded", request("1111"), ["receiver"], 1))["receiver"]
        assert workers._workers[0].process.pid != died[0]
    finally:
        workers.close()


def test_the_served_page_computes_in_its_workers_with_the_same_answers(embedded_pair):
    """``python app.py`` as a class meets it: two distinct /run calls at once, computed in the server's
    worker processes (its children), each handoff's tokens those of the same run in this process."""
    from gradio_client import Client

    from kvviz.studies import page_speed

    codes = ["2468", "1357"]
    here = {code: answers(run(embedded_pair.name, request(code), HANDOFFS, ALL_AT_ONCE, loaded=embedded_pair))
            for code in codes}
    server, url = page_speed.serve_page("embedded", env={"KVVIZ_RUN_PROCESSES": "2"})
    try:
        jobs = {code: Client(url, verbose=False).submit(
            pair="embedded", query=run_speed.FULL_RUN_QUERY,
            context=run_speed.FULL_RUN_CONTEXT.replace(run_speed.FULL_RUN_GOLD, code), max_new_tokens=4,
            api_name="/run") for code in codes}
        served = {code: {r["handoff"]: r["answer_ids"] for r in job.result(timeout=600)[-1]["results"] if r["applicable"]}
                  for code, job in jobs.items()}
        children = [child for task in os.listdir(f"/proc/{server.pid}/task")
                    for child in open(f"/proc/{server.pid}/task/{task}/children").read().split()]
        commands = [open(f"/proc/{child}/cmdline").read().replace("\0", " ") for child in children]
    finally:
        page_speed.stop_page(server)
    assert sum("kvviz.engine.run_processes" in command for command in commands) == 2, commands
    for code in codes:
        assert {name: served[code][name] for name in HANDOFFS} == here[code], code
