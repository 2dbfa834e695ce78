"""The server's finished runs (``kvviz.engine.shared_runs``): kept by key for identical requests later,
least recently used first out, bounded by bytes; only runs that finished cleanly."""

from __future__ import annotations

import collections
import pickle
from dataclasses import dataclass

from kvviz.engine.events import Done, Event, Failed, Stopped


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
