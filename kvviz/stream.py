"""Run handoffs in worker threads and stream what happens: the engine, for a page.

``stream_handoffs`` yields events as they happen so that a page can show each answer token by
token while the handoffs run on a shared pair of models, ``workers`` at a time.

Side by side on a CPU: a decode step is bound by memory and per-layer overhead, and torch's
intra-op threads wait on each other when anything else runs, so two handoffs on one thread each
finish sooner than the same two one after another on two threads (``python -m kvviz bench
--perf`` and docs/RESULTS.md have the measurements). Each handoff's own timings then include
sharing the machine with the others; ``workers=1`` gives clean per-handoff timings.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator

import torch

from kvviz import engine, policy, zerogpu
from kvviz.handoffs import registry
from kvviz.results import HandoffRequest


class Cancelled(BaseException):
    """Raised inside a token callback to stop a run the user left or cancelled, or that ran out of
    time. A BaseException, like KeyboardInterrupt: no ``except Exception`` in a handoff swallows it."""


def default_workers() -> int:
    """How many handoffs of one run go side by side: ``KVVIZ_WORKERS``, else one per CPU core (at
    most 2) when models run on the CPU with one torch thread each, else 1."""
    if os.environ.get("KVVIZ_WORKERS"):
        return max(1, int(os.environ["KVVIZ_WORKERS"]))
    if torch.cuda.is_available() or torch.get_num_threads() > 1:
        return 1
    return max(1, min(2, os.cpu_count() or 1))


def use_one_thread_per_handoff() -> None:
    """The serving default on a CPU: one torch thread per handoff, handoffs side by side
    (``default_workers``). ``KVVIZ_THREADS=N`` keeps N intra-op threads instead."""
    if os.environ.get("KVVIZ_THREADS"):
        torch.set_num_threads(max(1, int(os.environ["KVVIZ_THREADS"])))
    elif not torch.cuda.is_available():
        torch.set_num_threads(1)


def stream_handoffs(
    pair_name: str, request: HandoffRequest, names: Iterable[str], workers: int = 1, max_seconds: float | None = None
) -> Iterator[tuple[str, str | None, object]]:
    """``run_events``; on a Space (the ``spaces`` package installed) inside ``@spaces.GPU``, with
    only plain data crossing (``gpu_run_events``, ``kvviz.zerogpu``)."""
    if zerogpu.available():
        yield from gpu_run_events(pair_name, request.to_dict(), list(names), workers, max_seconds)
    else:
        yield from run_events(pair_name, request, names, workers, max_seconds)


def run_events(
    pair_name: str, request: HandoffRequest, names: Iterable[str], workers: int = 1, max_seconds: float | None = None
) -> Iterator[tuple[str, str | None, object]]:
    """Run the handoffs, ``workers`` at a time, in worker threads; yield ``(kind, name, data)``
    events: ``status`` (a progress line), ``start``, ``token`` (answer so far), ``done`` (result
    dict), ``stopped`` (the run reached ``max_seconds``: why; the handoffs not done did not run),
    ``error`` (a message: the run could not start).

    Handoffs that cannot run on this pair or request are ``done`` at once, before any model runs,
    so that their columns never wait behind the others.

    Closing the generator (the user cancelled or left) stops the worker at its next token.
    ``max_seconds`` defaults to the policy's cap (``kvviz.policy``; none locally).
    """
    names = list(names)
    events: queue.Queue = queue.Queue()
    cancel = threading.Event()
    max_seconds = policy.caps().max_run_seconds if max_seconds is None else max_seconds
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    out_of_time = f"Stopped: this server allows {max_seconds or 0:g} s per run; the handoffs not finished did not run."

    def out_of_time_now() -> bool:
        return deadline is not None and time.monotonic() > deadline

    def check_stop():
        if out_of_time_now():
            cancel.set()  # the handoffs still waiting do not start
        if cancel.is_set():
            raise Cancelled()

    def worker():
        try:
            events.put(("status", None, f"Loading the pair '{pair_name}' (once per server) ..."))
            pair = engine.load_pair(pair_name, progress=lambda message: events.put(("status", None, str(message))))
            engine.check_fits(pair, request)
            runnable = []
            for name in names:
                refused = engine.not_applicable(name, pair, request)
                if refused is None:
                    runnable.append(name)
                else:
                    events.put(("done", name, refused.to_dict()))

            def run_one(name):
                check_stop()
                events.put(("start", name, None))

                def on_token(text):
                    check_stop()
                    events.put(("token", name, text))

                result = engine.run_handoff(name, pair, request, on_token=on_token)
                events.put(("done", name, result.to_dict()))

            with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="kvviz-handoff") as pool:
                for future in [pool.submit(run_one, name) for name in runnable]:
                    future.result()  # re-raises a handoff's unexpected error (or a stop) here
        except Cancelled:
            if out_of_time_now():
                events.put(("stopped", None, out_of_time))
        except Exception as error:  # shown to the user; the server keeps running
            said = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
            events.put(("error", None, said))
        finally:
            events.put(("end", None, None))

    thread = threading.Thread(target=worker, name="kvviz-run", daemon=True)
    thread.start()
    try:
        while True:
            event = events.get()
            if event[0] == "end":
                return
            yield event
    finally:
        cancel.set()


# --- on a ZeroGPU Space: the same run inside @spaces.GPU, plain data in and out ------------------


def run_seconds(pair_name: str, request: dict, names: list[str], workers: int = 1, max_seconds: float | None = None) -> int:
    """GPU seconds for one page run: each handoff's answer and the message it may write first
    (``Handoff.message_tokens``), counted one after another whatever ``workers`` is (on a GPU
    handoffs run one at a time)."""
    asked = HandoffRequest.from_dict(request)
    tokens = sum(asked.generation.max_new_tokens + registry.get(name).tokens_before_answer(asked) for name in names)
    return zerogpu.bounded_seconds(zerogpu.BASE_SECONDS + zerogpu.SECONDS_PER_TOKEN * tokens)


def _run_events(pair_name: str, request: dict, names: list[str], workers: int = 1, max_seconds: float | None = None):
    """One page run's events (``run_events``), computed where this runs (a ZeroGPU worker)."""
    yield from run_events(pair_name, HandoffRequest.from_dict(request), names, workers, max_seconds)


# Decorated once, at import (ZeroGPU registers its functions before the app starts).
gpu_run_events = zerogpu.on_gpu(_run_events, run_seconds)
