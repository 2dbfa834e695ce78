"""Run handoffs in worker threads and stream what happens: the engine, for a page and for the rest.

``run`` is the one entry: it yields a run's events (``kvviz.engine.events``) as they happen, in
batches, all that waited together, so that a page can show each answer token by token while the
handoffs run on a shared pair of models, ``workers`` at a time (the page sends one update per
batch: each update costs the server's event loop, which shares the interpreter with the model
threads). On a Space it runs inside ``@spaces.GPU`` (``kvviz.core.zerogpu.dispatch``). ``results``
collects a run's results, one handoff after another (the command line, the precomputed presets).

By default every handoff of a run starts at once (``ALL_AT_ONCE``): the handoffs that decode with
the same model then share its decode steps (``kvviz.runtime.decode``: one batched step streams the weights
once for all of them, and each still gets the tokens it gets alone), while their prompts are read
side by side. With the batched decode off (``KVVIZ_BATCHED_DECODE=0``) the rule from before holds:
one handoff per CPU core, each on one torch thread (a decode step is bound by memory and per-layer
overhead, and torch's intra-op threads wait on each other when anything else runs). Each handoff's
own timings include sharing the machine with the others; ``workers=1`` gives clean per-handoff
timings.
"""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator

import torch

from kvviz.core import policy, zerogpu
from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.data.swaps import Swap, swap_record
from kvviz.engine import runner
from kvviz.engine.events import Done, Event, Failed, Lens, Message, Scored, Started, Status, Stopped, Token
from kvviz.handoffs import registry
from kvviz.runtime.models import LoadedPair

STOP_POLL_SECONDS = 0.1


class Cancelled(BaseException):
    """Raised inside a token callback to stop a run the user left or cancelled, or that ran out of
    time. A BaseException, like KeyboardInterrupt: no ``except Exception`` in a handoff swallows it."""


ALL_AT_ONCE = 0  # ``workers``: every handoff of the run at once


def default_workers() -> int:
    """How many handoffs of one run go side by side: ``KVVIZ_WORKERS``, else all of them at once
    (``ALL_AT_ONCE``) while decode steps are shared, else one per CPU core (at most 2) when models
    run on the CPU with one torch thread each, else 1."""
    if os.environ.get("KVVIZ_WORKERS"):
        return max(1, int(os.environ["KVVIZ_WORKERS"]))
    if policy.batched_decode_enabled():
        return ALL_AT_ONCE
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


def run(
    pair_name: str, request: HandoffRequest, names: Iterable[str], workers: int = 1, max_seconds: float | None = None,
    stop: threading.Event | None = None, loaded: LoadedPair | None = None, idle: float | None = None,
) -> Iterator[list[Event]]:
    """Run the handoffs, ``workers`` at a time (``ALL_AT_ONCE``: all), in worker threads; yield their
    events (``kvviz.engine.events``, in the order they happened) in batches: each batch holds every
    event that was waiting when the consumer asked (at least one), so that a consumer slower than
    the models (a page: each update it sends costs the server's event loop) sends one update for
    many events. A consumer that wants single events flattens the batches.

    Handoffs that cannot run on this pair or request are ``Done`` at once, before any model runs,
    so that their columns never wait behind the others. ``Scored`` and ``Lens`` come after every
    handoff is done (``runner.finish_crossed``).

    Closing the generator (the user cancelled or left) stops the workers at their next token; so
    does setting ``stop`` (a page's Stop button), after which the generator ends within
    ``STOP_POLL_SECONDS`` even while no handoff is producing tokens. ``idle``: also an empty batch
    after ``idle`` seconds without events (a page sends what it held back). ``max_seconds``
    defaults to the policy's cap (``kvviz.core.policy``; none locally). ``loaded``: the pair
    already loaded (the speed report), instead of loading ``pair_name``.

    On a Space (the ``spaces`` package installed) the run goes inside ``@spaces.GPU``
    (``kvviz.core.zerogpu.dispatch``, for ``run_seconds``), the request crossing as a dict and the
    batches coming back pickled; ``stop``, ``loaded`` and ``idle`` stay behind, and the caller stops
    the run by closing the generator at its next batch.
    """
    yield from zerogpu.dispatch(_run, run_seconds, pair_name, request.to_dict(), list(names), workers, max_seconds,
                                here={"stop": stop, "loaded": loaded, "idle": idle})


def results(pair: LoadedPair, request: HandoffRequest, names, swap: Swap | None = None,
            gold: list[str] | None = None) -> list[HandoffResult]:
    """The handoffs (names as ``registry.parse_handoffs`` reads them) one after another as one run
    on a loaded pair, without a time cap: their results in the order named. A prompt that several
    read is read once, and each answer is scored against its control where both ran (its
    ``Scored`` event, for a method that finished before its control). A ValueError says why the
    run could not start (a prompt too long for the pair).

    With ``swap`` (the note with its answer-bearing fact changed) the same handoffs run again on
    the swapped note, as a second run (on the pair the swap names when its sharer is what changed), and each result's ``swap`` says what it answered there and
    whether it followed the swap (``kvviz.data.swaps.swap_record``; ``gold``: the original answers)."""
    first = _results(pair, request, names)
    if swap is None:
        return first
    swapped = _results(runner.swap_pair(pair, swap), swapped_request(request, swap), names)
    for result, other in zip(first, swapped):
        result.swap = swap_record(result.to_dict(), other.to_dict(), swap, gold)
    return first


def swapped_request(request: HandoffRequest, swap: Swap) -> HandoffRequest:
    """The request on the swapped note. Where the original run records what crossed, so does this
    one, its logit lens tracking the swapped answer (the answer's tokens go into the swap record)."""
    inspect = None if request.inspect is None else {**request.inspect, "gold": swap.answers[0] if swap.answers else None}
    return dataclasses.replace(request, context=swap.context, inspect=inspect)


def _results(pair: LoadedPair, request: HandoffRequest, names) -> list[HandoffResult]:
    names = registry.parse_handoffs(names)
    done: list[tuple[str, dict]] = []  # (handoff, result) as they finished
    for batch in _batches(pair.name, request, names, workers=1, max_seconds=math.inf, loaded=pair):
        for event in batch:
            match event:
                case Done(handoff, result):
                    done.append((handoff, dict(result)))
                case Scored(handoff, token_change):
                    _last(done, handoff)["token_change"] = token_change
                case Lens(handoff, logit_lens):
                    _last(done, handoff)["logit_lens"] = logit_lens
                case Failed(reason) | Stopped(reason):
                    raise ValueError(reason)
    order = {name: index for index, name in enumerate(names)}
    return [HandoffResult.from_dict(result) for _, result in sorted(done, key=lambda item: order[item[0]])]


def _last(done: list[tuple[str, dict]], handoff: str) -> dict:
    """The result of the last ``handoff`` that finished."""
    return next(result for name, result in reversed(done) if name == handoff)


class _RunWorker:
    """One run's worker thread (``_batches``): it loads the pair, runs the handoffs in a pool,
    finishes what crossed, and puts every event on ``events``, then ``END``."""

    def __init__(self, pair_name: str, request: HandoffRequest, names: list[str], workers: int,
                 max_seconds: float | None, loaded: LoadedPair | None):
        self.pair_name, self.request, self.names, self.workers, self.loaded = pair_name, request, names, workers, loaded
        self.events: queue.Queue = queue.Queue()
        self.cancel = threading.Event()
        self.submitted = threading.Event()  # every handoff of the run is in the pool
        self.max_seconds = policy.caps().max_run_seconds if max_seconds is None else max_seconds
        self.deadline = None if self.max_seconds is None else time.monotonic() + self.max_seconds

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def check_stop(self) -> None:
        if self.out_of_time():
            self.cancel.set()  # the handoffs still waiting do not start
        if self.cancel.is_set():
            raise Cancelled()

    def put(self, event: Event) -> None:
        self.events.put(event)

    def run(self) -> None:
        try:
            pair = self.loaded
            if pair is None:
                # load_model says "Loading ..." only for a model not loaded yet in this process
                pair = runner.load_pair(self.pair_name, progress=lambda message: self.put(Status(str(message))))
            runner.check_fits(pair, self.request)
            runnable = []
            for name in self.names:
                refused = runner.not_applicable(name, pair, self.request)
                if refused is None:
                    runnable.append(name)
                else:
                    self.put(Done(name, refused.to_dict()))
            size = len(runnable) if self.workers <= ALL_AT_ONCE else self.workers
            # one run: a prompt that several handoffs read is read once; each answer meets its control's
            run = runner.RunContext()
            with ThreadPoolExecutor(max_workers=max(1, size), thread_name_prefix="kvviz-handoff") as pool:
                futures = [pool.submit(self.run_one, pair, name, run) for name in runnable]
                self.submitted.set()
                for future in futures:
                    future.result()  # re-raises a handoff's unexpected error (or a stop) here
                for event in runner.finish_crossed(run):
                    self.put(event)
        except Cancelled:
            if self.out_of_time():
                self.put(Stopped(f"Stopped: this server allows {self.max_seconds or 0:g} s per run; the "
                                 "handoffs not finished did not run."))
        except Exception as error:  # shown to the user; the server keeps running
            said = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
            self.put(Failed(said))
        finally:
            self.events.put(END)

    def run_one(self, pair: LoadedPair, name: str, run: runner.RunContext) -> None:
        # The pool starts a thread per handoff as it is submitted; a handoff that began at once would
        # hold the interpreter lock in its prompt pass while the next threads start (0.25 s for five
        # through the page). They all begin once every one is submitted.
        self.submitted.wait()
        self.check_stop()
        self.put(Started(name))

        def on_token(text):
            self.check_stop()
            self.put(Token(name, text))

        def on_message(text):
            self.check_stop()
            self.put(Message(name, text))

        result = runner.run_handoff(name, pair, self.request, on_token=on_token, on_message=on_message, run=run)
        self.put(Done(name, result.to_dict()))


END = object()  # on a run's queue after its last event (``queued_batches``)


def _run(pair_name: str, request: dict, names: list[str], workers: int = 1, max_seconds: float | None = None,
         stop: threading.Event | None = None, loaded: LoadedPair | None = None, idle: float | None = None,
         ) -> Iterator[list[Event]]:
    """``run`` where it runs (here, or in a ZeroGPU worker), the request as a dict."""
    yield from _batches(pair_name, HandoffRequest.from_dict(request), names, workers, max_seconds, stop, loaded, idle)


def _batches(
    pair_name: str, request: HandoffRequest, names: list[str], workers: int = 1, max_seconds: float | None = None,
    stop: threading.Event | None = None, loaded: LoadedPair | None = None, idle: float | None = None,
) -> Iterator[list[Event]]:
    """The run in its worker thread (``_RunWorker``) and its events in batches, as ``run`` says."""
    worker = _RunWorker(pair_name, request, list(names), workers, max_seconds, loaded)
    thread = threading.Thread(target=worker.run, name="kvviz-run", daemon=True)
    thread.start()
    try:
        # the worker has put its last event: let it finish before the caller goes on (a command that
        # exits right after its run must not leave a thread inside torch)
        yield from queued_batches(worker.events, stop, idle, on_end=thread.join)
    finally:
        worker.cancel.set()


def queued_batches(items: queue.Queue, stop: threading.Event | None = None, idle: float | None = None,
                   on_end: Callable[[], None] | None = None) -> Iterator[list[Event]]:
    """What a run puts on ``items`` (events, or lists of events), in batches: each batch all that waited
    when the consumer asked (at least one event), until ``END``. ``stop`` set: the batches end within
    ``STOP_POLL_SECONDS``; ``idle``: an empty batch after ``idle`` seconds without events; ``on_end``:
    called when ``END`` comes, before the last batch goes out."""
    waits = [wait for wait in (None if stop is None else STOP_POLL_SECONDS, idle) if wait is not None]
    quiet_since = time.monotonic()
    while True:
        try:
            waiting = [items.get(timeout=min(waits) if waits else None)]
        except queue.Empty:
            if stop is not None and stop.is_set():
                return
            if idle is not None and time.monotonic() - quiet_since >= idle:
                quiet_since = time.monotonic()
                yield []
            continue
        while waiting[-1] is not END:
            try:
                waiting.append(items.get_nowait())
            except queue.Empty:
                break
        if stop is not None and stop.is_set():
            return
        ended = waiting[-1] is END
        if ended:
            waiting.pop()
            if on_end is not None:
                on_end()
        batch = [event for item in waiting for event in (item if isinstance(item, list) else [item])]
        if batch:
            yield batch
        if ended:
            return
        quiet_since = time.monotonic()


def run_seconds(pair_name: str, request: dict, names: list[str], workers: int = 1, max_seconds: float | None = None) -> int:
    """GPU seconds for one page run (``run`` on a ZeroGPU Space): each handoff's answer and the
    message it may write first (``Handoff.message_tokens``), counted one after another whatever
    ``workers`` is (on a GPU handoffs run one at a time)."""
    asked = HandoffRequest.from_dict(request)
    tokens = sum(asked.generation.max_new_tokens + registry.get(name).tokens_before_answer(asked) for name in names)
    return zerogpu.bounded_seconds(zerogpu.BASE_SECONDS + zerogpu.SECONDS_PER_TOKEN * tokens)
