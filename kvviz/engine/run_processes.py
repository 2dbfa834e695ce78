"""The page's live runs computed in worker processes beside the server, not in its own process.

Why: the threads of one Python process share one interpreter lock. A run's handoffs are threads,
and between their torch operations they run Python (the transformers forward, the decode loop); on
a CPU with two cores, a thread that lets go of the lock for an operation wakes a thread on the other
core, and gets the lock back only by waking one again. Eight distinct runs at once in one process
took 16 s and 24 CPU-s with 1.2 million context switches; the same runs as two processes of four took
6.3-7 s and 12-17 CPU-s, with the same answers (docs/SPEED.md 13.9, ``research/run_processes.py``).
Every token is the same wherever a run is computed: the answers are batch invariant
(``kvviz.runtime.batching``), and a worker runs this checkout's code on this machine's kernels.

``RunProcesses(count).run`` is called as ``kvviz.engine.stream.run`` is (the page's
``SharedRuns.compute``): each run goes to the worker with the fewest runs (runs in one worker share
their decode steps, as in one process; a second worker starts only when the first is busy, unless
``warm`` started them all), and its event batches come back pickled, as on a ZeroGPU
Space (plain data: ``kvviz.engine.events``). ``stop`` (or closing the generator) stops the run in its
worker at its next token. A worker that dies (killed, out of memory) ends each of its runs with a
``Failed`` line, and the next run starts a new one. A worker exits when the server's end of its pipe
closes, so it never outlives the server, even one killed with ``kill -9``.

Each worker is ``python -m kvviz.engine.run_processes``, with two pipes; it loads the pairs it is
asked for itself (``warm``: at the server's start, so that the first run does not wait). The
server's settings reach it through the environment (``KVVIZ_*``, the numeric mode included).
"""

from __future__ import annotations

import itertools
import os
import queue
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Iterator

import torch

import kvviz
from kvviz.core import policy, zerogpu
from kvviz.core.results import HandoffRequest
from kvviz.engine import stream
from kvviz.engine.events import Event, Failed
from kvviz.engine.runner import load_pair


def default_count() -> int:
    """Worker processes for a served page: ``KVVIZ_RUN_PROCESSES`` where set; else none on a GPU or a
    Space (one process holds the models there; several would each hold a copy) or on one core; else
    one per core, at most as many as runs at once (``policy.model_concurrency``). Measured on two
    cores only (docs/SPEED.md 13.9)."""
    given = policy.run_processes_setting()
    if given is not None:
        return given
    cores = os.cpu_count() or 1
    if torch.cuda.is_available() or zerogpu.available() or cores < 2:
        return 0
    return min(cores, policy.model_concurrency())


class Worker:
    """One worker process and the runs it computes: the server's side of its two pipes, and a
    thread that reads what comes back and hands each batch to its run's queue."""

    def __init__(self, index: int):
        self.index = index
        to_child_read, to_child_write = os.pipe()
        from_child_read, from_child_write = os.pipe()
        # kvviz importable in the worker wherever the server was started from
        source = os.path.dirname(os.path.dirname(os.path.abspath(kvviz.__file__)))
        path = os.pathsep.join(part for part in (source, os.environ.get("PYTHONPATH", "")) if part)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kvviz.engine.run_processes", str(to_child_read), str(from_child_write)],
            pass_fds=(to_child_read, from_child_write), stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": path},
        )
        os.close(to_child_read)
        os.close(from_child_write)
        self._send_end = Connection(to_child_write, readable=False)
        self._receive_end = Connection(from_child_read, writable=False)
        self._send_lock = threading.Lock()
        self.runs: dict[int, queue.Queue] = {}
        self.alive = True
        self._lock = threading.Lock()
        threading.Thread(target=self._read, name=f"kvviz-run-process-{index}", daemon=True).start()

    def send(self, message: tuple) -> bool:
        """Send ``message``; False when the worker has gone."""
        try:
            with self._send_lock:
                self._send_end.send(message)
            return True
        except (OSError, ValueError):  # a closed pipe: the worker died (the reader says so to its runs)
            return False

    def start_run(self, run_id: int, job: tuple) -> queue.Queue:
        batches: queue.Queue = queue.Queue()
        with self._lock:
            self.runs[run_id] = batches
            alive = self.alive
        if not alive or not self.send(("run", run_id, *job)):
            self._fail(run_id, batches)
        return batches

    def forget(self, run_id: int) -> None:
        with self._lock:
            self.runs.pop(run_id, None)

    def load(self) -> int:
        with self._lock:
            return len(self.runs)

    def _read(self) -> None:
        while True:
            try:
                kind, run_id, *rest = self._receive_end.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                batches = self.runs.get(run_id)
            if batches is None:  # a run its reader stopped or left: what it still sent goes nowhere
                continue
            batches.put(rest[0] if kind == "batch" else stream.END)
        try:  # the pipe closed: the worker is ending, and its exit code says how
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        with self._lock:
            self.alive = False
            orphans = list(self.runs.items())
        for run_id, batches in orphans:
            self._fail(run_id, batches)

    def _fail(self, run_id: int, batches: queue.Queue) -> None:
        code = self.process.poll()
        said = "" if code is None else f" (exit code {code})"
        batches.put([Failed(f"The worker process computing this run ended{said}; press Run again.")])
        batches.put(stream.END)

    def close(self) -> None:
        self.send(None)
        for end in (self._send_end, self._receive_end):
            end.close()


class RunProcesses:
    """``count`` worker processes computing the page's runs (the module docstring)."""

    def __init__(self, count: int):
        if count < 1:
            raise ValueError(f"RunProcesses needs at least one worker process, got {count}.")
        self.count = count
        self._workers: list[Worker | None] = [None] * count
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def warm(self, pair_name: str) -> None:
        """Start every worker and have each load ``pair_name`` now (its progress lines go to the
        server's output), so that the first run does not wait for it."""
        for index in range(self.count):
            self._worker(index).send(("warm", pair_name))

    def _worker(self, index: int) -> Worker:
        with self._lock:
            return self._start_if_gone(index)

    def _start_if_gone(self, index: int) -> Worker:
        worker = self._workers[index]
        if worker is None or not worker.alive:
            worker = self._workers[index] = Worker(index)
        return worker

    def _least_busy(self) -> Worker:
        """The live worker with the fewest runs; a new one (up to ``count``) only when every live one
        is busy: a server that one learner uses holds the models once."""
        with self._lock:
            live = [worker for worker in self._workers if worker is not None and worker.alive]
            if live and (len(live) == self.count or any(worker.load() == 0 for worker in live)):
                return min(live, key=lambda worker: (worker.load(), worker.index))
            gone = next(index for index, worker in enumerate(self._workers) if worker is None or not worker.alive)
            return self._start_if_gone(gone)

    def run(self, pair_name: str, request: HandoffRequest, names, workers: int = 1, max_seconds: float | None = None,
            stop: threading.Event | None = None, loaded=None, idle: float | None = None) -> Iterator[list[Event]]:
        """The run's event batches, as ``kvviz.engine.stream.run`` gives them. A ``loaded`` pair (one
        this process holds) runs here, in this process."""
        if loaded is not None:
            yield from stream.run(pair_name, request, names, workers, max_seconds, stop, loaded, idle)
            return
        worker = self._least_busy()
        run_id = next(self._ids)
        batches = worker.start_run(run_id, (pair_name, request.to_dict(), list(names), workers, max_seconds))
        ended = []
        try:
            yield from stream.queued_batches(batches, stop, idle, on_end=lambda: ended.append(True))
        finally:
            worker.forget(run_id)
            if not ended:  # stopped, or its reader left: the worker stops it at its next token
                worker.send(("stop", run_id))

    def close(self) -> None:
        with self._lock:
            workers, self._workers = self._workers, [None] * self.count
        for worker in workers:
            if worker is not None:
                worker.close()


# --- the worker process ---------------------------------------------------------------------------


def _compute(send, run_id: int, job: tuple, stop: threading.Event, stops: dict) -> None:
    pair_name, request, names, workers, max_seconds = job
    try:
        for batch in stream.run(pair_name, HandoffRequest.from_dict(request), names, workers, max_seconds, stop=stop):
            send(("batch", run_id, batch))
    except Exception as error:  # stream.run says its own failures as events; this is anything else
        send(("batch", run_id, [Failed(f"{type(error).__name__}: {error}")]))
    finally:
        stops.pop(run_id, None)
        send(("end", run_id))


def _warm(pair_name: str) -> None:
    try:
        load_pair(pair_name, progress=lambda message: print(f"kvviz worker {os.getpid()}: {message}", flush=True))
    except Exception as error:  # a run will say it
        print(f"kvviz worker {os.getpid()}: could not preload the pair '{pair_name}': {error}", flush=True)


def serve(receive_end: Connection, send_end: Connection) -> None:
    """A worker's loop: runs as the server asks, each in a thread of its own, until the server's end
    of the pipe closes (or it says ``None``)."""
    stream.use_one_thread_per_handoff()
    send_lock = threading.Lock()
    stops: dict[int, threading.Event] = {}

    def send(message) -> None:
        try:
            with send_lock:
                send_end.send(message)
        except (OSError, ValueError):  # the server is gone: the loop below ends too
            pass

    while True:
        try:
            message = receive_end.recv()
        except (EOFError, OSError):
            break
        if message is None:
            break
        kind, argument, *rest = message
        if kind == "run":
            stop = stops[argument] = threading.Event()
            threading.Thread(target=_compute, args=(send, argument, tuple(rest), stop, stops),
                             name=f"kvviz-run-{argument}", daemon=True).start()
        elif kind == "stop":
            stop = stops.get(argument)
            if stop is not None:
                stop.set()
        elif kind == "warm":
            threading.Thread(target=_warm, args=(argument,), name="kvviz-warm", daemon=True).start()
    for stop in list(stops.values()):
        stop.set()


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
    os._exit(0)  # without waiting for runs that were stopped: their threads hold nothing of the server's
