"""The models' queue (``kvviz.engine.shared_runs``): ``slots`` computations on the models at once
(``kvviz.core.policy.model_concurrency``), the others waiting in order, first come first served, each told
its place and an estimate from the measured times of the last runs; past ``max_waiting`` the next is
refused with one line (``QueueFull``)."""

from __future__ import annotations

import collections
import statistics
import threading
import time
from typing import Callable

POLL_SECONDS = 0.1  # how often a waiting request looks at its stop flag


class QueueFull(Exception):
    """More runs wait for the models than the server takes: the one line to show."""


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
