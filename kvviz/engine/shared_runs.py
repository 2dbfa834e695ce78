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

The computations share the models through ``ModelGate``: ``slots`` runs at once
(``kvviz.core.policy.model_concurrency``), the others wait in order, first come first served, and
each waiting request is told its place and an estimate from the measured times of the last runs
(``Status`` events). More than ``max_waiting`` waiting runs: the next is refused with one line.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import json
import os
import pickle
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import kvviz
from kvviz.core import policy
from kvviz.core.paths import ASSETS, cache_dir
from kvviz.core.results import HandoffRequest
from kvviz.engine import stream
from kvviz.engine.events import Computation, Done, Event, Failed, Shared, Status, Stopped
from kvviz.runtime.models import EMBEDDED_MODELS, converted_dir, resolve_pair

POLL_SECONDS = 0.1  # how often a waiting request looks at its stop flag


# Batches a second that all the requests reading one computation get together: each update a request
# sends costs the server's event loop (which shares the interpreter with the models), so thirty
# learners reading one run get an update every 1.5 s each: 20 updates a second in all, not 30 x 4.
BATCHES_PER_SECOND = 20.0


def spacing(readers: int) -> float:
    """Seconds between one reader's batches when ``readers`` read the computation."""
    return max(1, readers) / BATCHES_PER_SECOND


class QueueFull(Exception):
    """More runs wait for the models than the server takes: the one line to show."""


# --- the key ----------------------------------------------------------------------------------


def _files_identity(root: Path) -> list:
    """(path, size, mtime) of every file under ``root`` (none when it does not exist)."""
    if not root.exists():
        return []
    if root.is_file():
        stat = root.stat()
        return [(str(root), stat.st_size, stat.st_mtime_ns)]
    found = []
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            path = Path(folder) / name
            try:
                stat = path.stat()
            except OSError:
                continue
            found.append((str(path), stat.st_size, stat.st_mtime_ns))
    return sorted(found)


def model_identity(name: str) -> list:
    """What a model's answers depend on that is not in the request: its files on disk (a local
    folder or file, an embedded model's converted folder); a hub id by its name."""
    if name in EMBEDDED_MODELS:
        return [name, _files_identity(converted_dir(name))]
    path = Path(name).expanduser()
    return [name, _files_identity(path) if path.exists() else None]


def fingerprint(pair_name: str) -> str:
    """The pair's fingerprint: its models' files, every shipped or cached fuser and translator, the
    code's version (``code_version``) and the server's ``KVVIZ_*`` settings (dtype, device, batched
    decode ...). A ValueError for a pair that does not resolve (``resolve_pair``)."""
    spec = resolve_pair(pair_name)
    parts = {
        "pair": dataclasses.asdict(spec),
        "models": [model_identity(name) for name in dict.fromkeys(spec.model_names())],
        "checkpoints": [_files_identity(root) for root in (ASSETS / "fusers", ASSETS / "translators",
                                                           cache_dir() / "fusers", cache_dir() / "translators")],
        "code": code_version(),
        "settings": sorted((k, v) for k, v in os.environ.items() if k.startswith("KVVIZ_") and k != "KVVIZ_DATA_DIR"),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


_code_version: str | None = None


def code_version() -> str:
    """kvviz's version and its source files' sizes and times (once per process)."""
    global _code_version
    if _code_version is None:
        source = Path(kvviz.__file__).parent
        files = [(str(p.relative_to(source)), s, m) for p, s, m in
                 ((Path(f), s, m) for f, s, m in _files_identity(source)) if p.suffix == ".py"]
        digest = hashlib.sha256(json.dumps(files).encode()).hexdigest()[:12]
        _code_version = f"{kvviz.__version__}+{digest}"
    return _code_version


def shareable(request: HandoffRequest) -> bool:
    """Only greedy runs are shared: a sampling run is the learner's own draw."""
    return bool(request.generation.greedy)


def run_key(pair_name: str, request: HandoffRequest, names: Iterable[str], workers: int, fingerprint_of: str) -> str:
    """The key of a run: everything its answers depend on (see the module's docstring)."""
    asked = {"pair": pair_name, "fingerprint": fingerprint_of, "request": request.to_dict(), "names": list(names),
             "workers": workers}
    return hashlib.sha256(json.dumps(asked, sort_keys=True, default=str).encode()).hexdigest()


# --- the cache of finished runs -----------------------------------------------------------------


@dataclass
class Finished:
    """A finished run as the cache keeps it."""

    events: list[Event]
    nbytes: int
    computed_at: float  # time.time() when it finished
    identity: str  # the computation's (``Flight.identity``)


class RunCache:
    """Finished runs by key, least recently used first out, at most ``max_bytes`` in all (a run
    larger than that is not kept)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._runs: collections.OrderedDict[str, Finished] = collections.OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._runs)

    def __contains__(self, key: str) -> bool:
        return key in self._runs

    def get(self, key: str) -> Finished | None:
        found = self._runs.get(key)
        if found is not None:
            self._runs.move_to_end(key)
        return found

    def put(self, key: str, finished: Finished) -> None:
        if key in self._runs:
            self.nbytes -= self._runs.pop(key).nbytes
        if finished.nbytes > self.max_bytes:
            return
        self._runs[key] = finished
        self.nbytes += finished.nbytes
        while self.nbytes > self.max_bytes:
            _, dropped = self._runs.popitem(last=False)
            self.nbytes -= dropped.nbytes

    def clear(self) -> None:
        self._runs.clear()
        self.nbytes = 0


def events_nbytes(events: list[Event]) -> int:
    return len(pickle.dumps(events, protocol=pickle.HIGHEST_PROTOCOL))


def cacheable(events: list[Event]) -> bool:
    """A run that finished cleanly: no failure, no time cap reached, no handoff that raised."""
    for event in events:
        if isinstance(event, (Failed, Stopped)):
            return False
        if isinstance(event, Done) and "traceback" in (event.result.get("details") or {}):
            return False
    return True


# --- the models' queue --------------------------------------------------------------------------


class ModelGate:
    """``slots`` computations at once; the others wait in order of arrival. ``wait_turn`` says each
    waiting one's place and an estimate (``estimate``) from the last measured run times."""

    def __init__(self, slots: int, max_waiting: int, clock: Callable[[], float] = time.monotonic):
        self.slots, self.max_waiting, self.clock = max(1, slots), max_waiting, clock
        self._cond = threading.Condition()
        self._waiting: collections.deque[object] = collections.deque()
        self._running = 0
        self.run_seconds: collections.deque[float] = collections.deque(maxlen=20)  # the last runs' times

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting)

    @property
    def running(self) -> int:
        with self._cond:
            return self._running

    def estimate(self, place: int) -> float | None:
        """Seconds until the run at ``place`` (1: next) is done, from the median of the last runs'
        times: the runs ahead of it and the running ones go ``slots`` at a time; None before any run."""
        if not self.run_seconds:
            return None
        typical = statistics.median(self.run_seconds)
        with self._cond:
            ahead = place - 1 + self._running
        return typical * (ahead // self.slots + 1)

    def wait_turn(self, cancel: threading.Event, tell: Callable[[str], None]) -> bool:
        """Wait for a slot; ``tell`` hears the place and estimate when they change. False when
        ``cancel`` was set first (the slot is not taken). Raises ``QueueFull``."""
        ticket = object()
        with self._cond:
            if self._running >= self.slots or self._waiting:
                if len(self._waiting) >= self.max_waiting:
                    raise QueueFull(f"The server is full: {len(self._waiting)} runs already wait for the models (at most "
                                    f"{self.max_waiting} here). Press Run again in a minute.")
            self._waiting.append(ticket)
        said = None
        try:
            while True:
                with self._cond:
                    if self._waiting[0] is ticket and self._running < self.slots:
                        self._waiting.popleft()
                        self._running += 1
                        self._cond.notify_all()
                        return True
                    place = self._waiting.index(ticket) + 1
                if cancel.is_set():
                    return False
                line = waiting_line(place, self.estimate(place))
                if line != said:
                    tell(line)
                    said = line
                with self._cond:
                    self._cond.wait(POLL_SECONDS * 5)
        finally:
            with self._cond:
                if ticket in self._waiting:
                    self._waiting.remove(ticket)
                    self._cond.notify_all()

    def release(self, seconds: float | None) -> None:
        with self._cond:
            self._running -= 1
            if seconds is not None:
                self.run_seconds.append(seconds)
            self._cond.notify_all()

    def hold(self) -> "_Held":
        """A slot for another kind of model work (the sweep), without a place to tell."""
        return _Held(self)


class _Held:
    def __init__(self, gate: ModelGate):
        self.gate = gate

    def __enter__(self):
        self.gate.wait_turn(threading.Event(), lambda line: None)
        self.started = time.monotonic()

    def __exit__(self, *exc):
        self.gate.release(None)


def waiting_line(place: int, seconds: float | None) -> str:
    """What a waiting learner reads: the place in the models' queue and when the run should be done."""
    when = (f"yours should be done in about {seconds:.0f} s (from the last runs' times)" if seconds is not None
            else "no run has been timed on this server yet")
    return f"Waiting for the models: your run is number {place} in the queue; {when}."


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
