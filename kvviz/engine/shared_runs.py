"""One computation for identical runs, and the queue for the models that a learner can see.

A class presses Run on the projected preset within seconds: thirty requests, one question. A greedy
run is a pure function of its key (``run_key``: the pair, the fingerprints of its models and of
every shipped or cached fuser and translator, the question, the note, the handoffs, their options,
the generation settings, the code's version and the server's ``KVVIZ_*`` settings), so
``SharedRuns.batches`` (called as ``kvviz.engine.stream.run`` is) computes it once:

* single flight: a request identical to one in flight joins it; it gets every event the run has
  given so far in one batch, then the rest as they come (the same events, in the same order);
* a finished run is kept (``RunCache``: least recently used first out, bounded by bytes), and an
  identical request later gets all its events at once; the whole cache goes when a fingerprint
  changes (a fuser retrained, a model file replaced, the code changed);
* a greedy request's first event is ``Computation``: the identity of the computation its events come
  from (the same for every request that shares it, so a page draws its figures once for them all);
  a ``Shared`` event (next, for a sharing request) says how: "computed 14 s ago on this server for
  another learner", so the page can say that its numbers were measured in that run;
* a sampling run (not greedy) is never shared, nor is what did not finish cleanly cached: a run
  that failed, ran out of time or was stopped, or a handoff that raised (its result holds a
  traceback). A failure reaches every request of the flight as its ``Failed`` line.

Each request reading a computation gets its batches spaced by how many read it (``spacing``): all
of them together get ``BATCHES_PER_SECOND`` (each batch becomes an update the server sends), so a
class reading one run costs the server about what a few learners' own runs cost.

A learner that stops (or leaves) leaves the flight; the run goes on while anyone waits for it and
stops when nobody does (not cached: a new request starts afresh).

The computations share the models through ``ModelGate`` (``kvviz.engine.model_gate``): ``slots`` runs at
once (``kvviz.core.policy.model_concurrency``), the others wait in order, first come first served, and
each waiting request is told its place and an estimate from the measured times of the last runs
(``Status`` events). More than ``max_waiting`` waiting runs: the next is refused with one line. The key
is ``kvviz.engine.run_key``'s, the cache of finished runs ``kvviz.engine.run_cache``'s.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from kvviz.core import policy
from kvviz.core.results import HandoffRequest
from kvviz.engine import stream
from kvviz.engine.events import Computation, Event, Failed, Shared, Status
from kvviz.engine.model_gate import POLL_SECONDS, ModelGate, QueueFull
from kvviz.engine.run_cache import Finished, RunCache, cacheable, events_nbytes
from kvviz.engine.run_key import fingerprint, run_key, shareable



# Batches a second that all the requests reading one computation get together: each update a request
# sends costs the server's event loop (which shares the interpreter with the models), so thirty
# learners reading one run get an update every 1.5 s each: 20 updates a second in all, not 30 x 4.
BATCHES_PER_SECOND = 20.0


def spacing(readers: int) -> float:
    """Seconds between one reader's batches when ``readers`` read the computation."""
    return max(1, readers) / BATCHES_PER_SECOND


# --- the flights --------------------------------------------------------------------------------

_computations = itertools.count(1)  # numbers the computations of this server (``Flight.identity``)


@dataclass
class Flight:
    """One computation and what it has given so far, for every request that shares it."""

    key: str | None  # None: not shared (a sampling run)
    started: float  # time.time()
    identity: str = field(default_factory=lambda: f"{os.getpid()}-{next(_computations)}")  # unique in this server
    events: list[Event] = field(default_factory=list)
    done: bool = False
    followers: int = 0  # requests reading it now
    cancel: threading.Event = field(default_factory=threading.Event)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def add(self, events: list[Event]) -> None:
        with self.cond:
            self.events.extend(events)
            self.cond.notify_all()

    def finish(self) -> None:
        with self.cond:
            self.done = True
            self.cond.notify_all()


@dataclass
class Counts:
    """How the requests were answered: computed (one computation each), joined (a run in flight),
    cached (a finished run), refused (queue full)."""

    computed: int = 0
    joined: int = 0
    cached: int = 0
    refused: int = 0
    not_shared: int = 0  # of the computed: sampling runs


def shared_line(how: str, seconds_ago: float) -> str:
    """What a request that shares another learner's run is told."""
    if how == "cached":
        return (f"computed {seconds_ago:.0f} s ago on this server for another learner (same question, handoffs and "
                "settings); its answers and numbers are shown as measured then")
    return (f"computed once for you and another learner who pressed Run {seconds_ago:.0f} s before you (same question, "
            "handoffs and settings); the numbers were measured in that one run")


class SharedRuns:
    """The server's runs: identical greedy runs computed once, the models' queue (see the module's
    docstring). ``compute``: what runs a computation, called as ``kvviz.engine.stream.run``;
    ``fingerprint_of``: a pair's fingerprint (``fingerprint``); ``clock``: wall time."""

    def __init__(self, compute: Callable[..., Iterator[list[Event]]] = stream.run, max_bytes: int | None = None,
                 slots: int | None = None, max_waiting: int | None = None,
                 fingerprint_of: Callable[[str], str] = fingerprint, clock: Callable[[], float] = time.time):
        self.compute, self.fingerprint_of, self.clock = compute, fingerprint_of, clock
        self.cache = RunCache(policy.run_cache_bytes() if max_bytes is None else max_bytes)
        self.gate = ModelGate(policy.model_concurrency() if slots is None else slots,
                              policy.caps().queue_size if max_waiting is None else max_waiting)
        self.counts = Counts()
        self._flights: dict[str, Flight] = {}
        self._fingerprints: dict[str, str] = {}
        self._lock = threading.Lock()

    def summary(self) -> dict:
        """The counts, the cache and the queue now (the page's ``/run_counts``)."""
        with self._lock:
            return {**dataclasses.asdict(self.counts), "in_flight": len(self._flights), "cached_runs": len(self.cache),
                    "cache_bytes": self.cache.nbytes, "waiting": self.gate.waiting,
                    "running": self.gate.running,
                    "run_seconds": list(self.gate.run_seconds)}

    def batches(self, pair_name: str, request: HandoffRequest, names: Iterable[str], workers: int = 1,
                stop: threading.Event | None = None, idle: float | None = None) -> Iterator[list[Event]]:
        """The run's events in batches, as ``kvviz.engine.stream.run`` gives them, computed once for
        identical greedy requests; a request that shares another's run gets a ``Shared`` event first.
        ``stop`` leaves the run (stopping it when nobody else reads it)."""
        names = list(names)
        stop = stop or threading.Event()
        try:
            flight, how = self._flight_for(pair_name, request, names, workers)
        except QueueFull as full:
            yield [Failed(str(full))]
            return
        except ValueError as error:  # a pair that does not resolve: said as the run would say it
            yield [Failed(str(error))]
            return
        if how == "cached":
            finished = flight
            yield [Computation(finished.identity), Shared(shared_line("cached", self.clock() - finished.computed_at)),
                   *(event for event in finished.events if not isinstance(event, Status))]
            return
        yield from self._follow(flight, how, stop, idle)

    def _flight_for(self, pair_name, request, names, workers):
        """(the flight or finished run, how: "computed", "joined", "cached")."""
        if not shareable(request):
            flight = Flight(key=None, started=self.clock(), followers=1)
            with self._lock:
                self.counts.computed += 1
                self.counts.not_shared += 1
            self._start(flight, pair_name, request, names, workers)
            return flight, "computed"
        printed = self.fingerprint_of(pair_name)
        key = run_key(pair_name, request, names, workers, printed)
        with self._lock:
            if self._fingerprints.get(pair_name) not in (None, printed):
                self.cache.clear()  # a model, a fuser, a translator or the code changed
            self._fingerprints[pair_name] = printed
            finished = self.cache.get(key)
            if finished is not None:
                self.counts.cached += 1
                return finished, "cached"
            flight = self._flights.get(key)
            if flight is not None and not flight.cancel.is_set():
                with flight.cond:
                    flight.followers += 1
                self.counts.joined += 1
                return flight, "joined"
            flight = Flight(key=key, started=self.clock(), followers=1)
            self._flights[key] = flight
            self.counts.computed += 1
        self._start(flight, pair_name, request, names, workers)
        return flight, "computed"

    def _start(self, flight: Flight, pair_name, request, names, workers) -> None:
        threading.Thread(target=self._compute, args=(flight, pair_name, request, names, workers), daemon=True,
                         name="kvviz-shared-run").start()

    def _compute(self, flight: Flight, pair_name, request, names, workers) -> None:
        """The computation's thread: a slot, the run, then the cache (or not)."""
        took = None
        got_slot = False
        try:
            got_slot = self.gate.wait_turn(flight.cancel, lambda line: flight.add([Status(line)]))
            if not got_slot:
                return
            flight.add([Status("Starting the run …")])  # no longer waiting
            began = time.monotonic()
            for batch in self.compute(pair_name, request, names, workers, stop=flight.cancel):
                if batch:
                    flight.add(list(batch))
            if not flight.cancel.is_set():
                took = time.monotonic() - began
        except QueueFull as full:
            with self._lock:
                self.counts.refused += 1
                self.counts.computed -= 1
            flight.add([Failed(str(full))])
        except Exception as error:  # noqa: BLE001 (said to every request of the flight, once)
            flight.add([Failed(f"{type(error).__name__}: {error}")])
        finally:
            if got_slot:
                self.gate.release(took)
            self._land(flight, took is not None)

    def _land(self, flight: Flight, completed: bool) -> None:
        with self._lock:
            if flight.key is not None and self._flights.get(flight.key) is flight:
                del self._flights[flight.key]
            events = [event for event in flight.events if not isinstance(event, Status)]
            if flight.key is not None and completed and cacheable(events):
                self.cache.put(flight.key, Finished(events, events_nbytes(events), self.clock(), flight.identity))
        flight.finish()

    def _follow(self, flight: Flight, how: str, stop: threading.Event, idle: float | None) -> Iterator[list[Event]]:
        """A request's reading of a flight: what it gave so far, then each new batch, spaced so that
        all the requests reading it get ``BATCHES_PER_SECOND`` batches a second together (``spacing``);
        an empty batch after ``idle`` seconds without events."""
        seen, sent = 0, 0.0
        first = ([Computation(flight.identity)] if flight.key is not None else []) + (  # a sampling run is its own
            [Shared(shared_line("joined", self.clock() - flight.started))] if how == "joined" else [])
        quiet_since = time.monotonic()
        try:
            while True:
                with flight.cond:
                    if len(flight.events) == seen and not flight.done:
                        flight.cond.wait(POLL_SECONDS if idle is None else min(idle, POLL_SECONDS))
                    wait = 0.0 if flight.done else sent + spacing(flight.followers) - time.monotonic()
                    new, done = ([], False) if wait > 0 else (flight.events[seen:], flight.done)
                    seen += len(new)
                    held = len(flight.events) > seen
                if stop.is_set():
                    return
                if new or first:
                    yield first + new
                    first = []
                    quiet_since = sent = time.monotonic()
                elif done:
                    return
                elif held:  # its events wait for their turn: this reader's next batch is not due yet
                    time.sleep(min(wait, POLL_SECONDS))
                elif idle is not None and time.monotonic() - quiet_since >= idle:
                    quiet_since = time.monotonic()
                    yield []
                if done and seen == len(flight.events):
                    return
        finally:
            self._leave(flight)

    def _leave(self, flight: Flight) -> None:
        with flight.cond:
            flight.followers -= 1
            nobody = flight.followers <= 0 and not flight.done
        if nobody:  # nobody reads it: stop it, and let a new request start afresh
            with self._lock:
                flight.cancel.set()
                if flight.key is not None and self._flights.get(flight.key) is flight:
                    del self._flights[flight.key]
