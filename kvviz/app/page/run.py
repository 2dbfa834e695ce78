"""A live run as the page shows it: a stream of ``{role: value}`` updates (roles as in
``kvviz.app.page.views``), and the per-session stop flags behind the Stop button. No Gradio.

What each event of a run (``kvviz.engine.events``, from ``kvviz.engine.stream.run``) changes, and
nothing more: a token updates its column's answer and the status line; a message being written
updates its column's line; a finished handoff updates its own card and the verdict strip. The
events that waited together give one update (each update the server sends costs its event loop,
which shares the interpreter with the models), and streamed text goes at most every
``STREAM_INTERVAL``; figures are not built here at all (the page builds the tab in view from the
final results). The last update holds ``results`` (the payload) and says how the run ended:
finished, stopped by the user (each column finished, stopped or not started), out of time, or failed.

The run is read (``kvviz.app.reading.read``) as it goes: each time a column starts or finishes, the
reading is brought up to date (the finished columns' marks kept), and every card, the strip and the
status line render it; the last update holds that reading beside the results.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from kvviz.app import present
from kvviz.app.page import views
from kvviz.app.page.spec import STREAM_INTERVAL
from kvviz.app.reading.reading import Reading, read
from kvviz.core.results import HandoffRequest
from kvviz.engine import stream
from kvviz.engine.events import (Computation, Done, Event, Failed, Lens, Message, Scored, Shared, Started, Status, Stopped,
                                 Token)


class StopFlags:
    """One stop flag per browser session: Stop sets it, the session's run checks it between events
    (and ``kvviz.engine.stream`` between tokens). ``begin`` is called when Run is pressed, before the run
    waits in the queue, so that a Stop pressed while it waits stops it too."""

    def __init__(self):
        self._flags: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def begin(self, session: str) -> threading.Event:
        with self._lock:
            self._flags[session] = threading.Event()
            return self._flags[session]

    def current(self, session: str) -> threading.Event:
        with self._lock:
            return self._flags.setdefault(session, threading.Event())

    def stop(self, session: str) -> bool:
        """Stop the session's run; False when it has none."""
        with self._lock:
            flag = self._flags.get(session)
        if flag is None:
            return False
        flag.set()
        return True

    def end(self, session: str) -> None:
        with self._lock:
            self._flags.pop(session, None)


class OwnRuns:
    """The computations each browser session ran itself, with when: a later run of the same tab that
    the server serves from one of them (``kvviz.engine.shared_runs``: its cache, or its flight) is
    this tab's own run again, not "another learner's". At most ``per_session`` a session, for the
    last ``sessions`` sessions."""

    def __init__(self, sessions: int = 1000, per_session: int = 20):
        self.sessions, self.per_session = sessions, per_session
        self._seen: collections.OrderedDict[str, collections.OrderedDict[str, float]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def when(self, session: str, identity: str) -> float | None:
        with self._lock:
            return (self._seen.get(session) or {}).get(identity)

    def add(self, session: str, identity: str) -> None:
        with self._lock:
            runs = self._seen.setdefault(session, collections.OrderedDict())
            runs[identity] = time.monotonic()
            self._seen.move_to_end(session)
            while len(runs) > self.per_session:
                runs.popitem(last=False)
            while len(self._seen) > self.sessions:
                self._seen.popitem(last=False)


def own_line(seconds_ago: float) -> str:
    """What a tab is told when the server serves it its own earlier run again."""
    return (f"the same run this tab computed {seconds_ago:.0f} s ago (same question, handoffs and settings), served "
            "from the server's cache; its answers and numbers are shown as measured then")


@dataclass
class LiveRun:
    """One run's state while it streams: what each column is doing and what has finished."""

    pair: str
    request: HandoffRequest
    names: list[str]
    answers: list[str]
    subject: str
    preset_key: str | None = None
    states: dict[str, str] = field(default_factory=dict)  # waiting / running, until done
    partial: dict[str, str] = field(default_factory=dict)
    results: dict[str, dict] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    log: str = ""  # what the run does before a column starts (loading the pair)
    out_of_time: str = ""  # why the run stopped at its time cap (``Stopped``)
    failed: str = ""  # why the run could not start (``Failed``)
    alone: dict[str, float] = field(default_factory=dict)  # column -> its time alone on this question (a preset's)
    timed: str = "shared"  # "alone" when one column ran at a time: what its times are (``present.time_text``)
    shared: str = ""  # how this request shares a run computed before (``kvviz.engine.shared_runs``), if it does
    session: str = ""  # the browser session that asked (its own earlier runs are not another learner's)
    own: OwnRuns | None = None
    identity: str = ""  # the computation the server's shared runs name for it (a greedy run)
    reading: Reading | None = None  # the run read so far (``refresh``)
    # names the results: the computation's when the server's shared runs name it (a greedy run: every
    # request that shares it draws the same figures, so they are drawn once: ``tabs.FigureCache``),
    # else this run's own (a sampling run; a run stopped, failed or out of time: ``final_update``)
    stamp: str = field(default_factory=views.live_stamp)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def payload(self) -> dict:
        ordered = [self.results[name] for name in self.names if name in self.results]
        data = present.payload(self.pair, self.request.to_dict(), ordered, False, self.preset_key)
        return dict(data, stamp=self.stamp, **({"shared": self.shared} if self.shared else {}))

    def refresh(self) -> Reading:
        """The run read as it stands (each unfinished column by its state); the finished columns'
        marks are kept from the last reading."""
        states = {name: self.states.get(name, "notrun") for name in self.names if name not in self.results}
        self.reading = read(self.payload(), self.answers, self.subject, states, previous=self.reading)
        return self.reading

    def status(self) -> dict:
        return {"status": present.live_status(self.pair, len(self.results), len(self.names), self.states, self.log)}

    def verdict(self) -> dict:
        return views.verdict(self.reading or self.refresh(), self.names)


def stream_run(run: LiveRun, workers: int, stop: threading.Event,
               batches: Callable[..., Iterator[list[Event]]] = stream.run) -> Iterator[dict]:
    """The run's updates, from the first (every column waiting) to the last (with ``results``).

    Events come in batches (``kvviz.engine.stream.run``: all that waited), and each batch gives at
    most one update, holding what its events changed and nothing else: a column that starts or
    finishes updates its own card and the strip at once; streamed text (answers, and the message a
    handoff writes first) is sent at most every ``STREAM_INTERVAL`` seconds for all the columns
    together, the latest text of each column that changed (an idle batch sends what was held back).
    (A run that several requests read, ``kvviz.engine.shared_runs``, gives each its batches spaced by
    how many read it, so its starts and finishes reach each a little later.)
    ``batches``: another source of batches, called as ``stream.run`` is (tests)."""
    run.states = {name: "waiting" for name in run.names}
    run.timed = "alone" if workers == 1 or len(run.names) == 1 else "shared"
    run.refresh()
    first = {**run.status(), **run.verdict()}
    for name in run.names:
        first.update(views.card(name, run.reading, "waiting"))
    yield first
    held: dict[str, str | None] = {}  # column -> its latest message (None: an answer token), not yet sent
    last_sent = time.perf_counter()
    for batch in batches(run.pair, run.request, run.names, workers, stop=stop, idle=STREAM_INTERVAL):
        if stop.is_set():
            break
        update: dict = {}
        now = False  # whether this batch's update goes at once (a column started or finished, a status line)
        for event in batch:
            now = apply_event(run, event, update, held) or now
        if held and (now or not batch or time.perf_counter() - last_sent >= STREAM_INTERVAL):  # an idle batch sends
            for name, message in held.items():
                update[f"answer:{name}"] = run.partial.get(name, "")
                if message is not None:
                    update[f"stats:{name}"] = views.card(name, None, "running", message=message)[f"stats:{name}"]
            held.clear()
            last_sent = time.perf_counter()
        if now:
            run.refresh()
            update.update(run.verdict())
        if update or now:
            yield {**run.status(), **update}
    yield final_update(run, workers, stopped_by_user=stop.is_set(), out_of_time=run.out_of_time, failed=run.failed)


def apply_event(run: LiveRun, event: Event, update: dict, held: dict[str, str | None]) -> bool:
    """What one event changes: the run's state, a column's card in ``update``, the streamed text
    ``held`` back for the next update. True when the update should go at once (a column started
    or finished, a status line)."""
    match event:
        case Status(text):
            run.log = text
            return True
        case Started(name):
            run.states[name] = "running"
            run.partial[name] = ""
            run.log = ""  # a column runs: the pair is loaded
            update.update(views.card(name, None, "running", ""))
            return True
        case Token(name, text):
            run.partial[name] = text
            held.setdefault(name, None)
        case Message(name, text):
            held[name] = text
        case Done(name, result):
            result = {**result, "timed": run.timed, **({"alone_total": run.alone[name]} if name in run.alone else {})}
            run.results[name] = result
            run.states.pop(name, None)
            run.partial.pop(name, None)
            held.pop(name, None)
            update.update(views.card(name, run.refresh()))
            return True
        case Scored(name, token_change) if name in run.results:  # what crossed, after every handoff
            run.results[name] = {**run.results[name], "token_change": token_change}
        case Lens(name, logit_lens) if name in run.results:
            run.results[name] = {**run.results[name], "logit_lens": logit_lens}
        case Stopped(reason):
            run.out_of_time = reason
        case Failed(reason):
            run.failed = reason
        case Computation(identity):
            run.stamp, run.identity = views.shared_stamp(identity), identity
        case Shared(text):
            earlier = run.own.when(run.session, run.identity) if run.own is not None and run.identity else None
            run.shared = text if earlier is None else own_line(time.monotonic() - earlier)
    return False


def final_update(run: LiveRun, workers: int, stopped_by_user: bool, out_of_time: str, failed: str) -> dict:
    """The last update: every unfinished column's state, the status, the strip and the results."""
    cut = stopped_by_user or out_of_time or failed
    if cut:  # not the computation's whole results: their own name
        run.stamp = views.live_stamp()
    elif run.identity and not run.shared and run.own is not None:  # computed here: this tab's own from now on
        run.own.add(run.session, run.identity)
    unfinished = {name: ("stopped" if name in run.partial else "notstarted") for name in run.names if name not in run.results}
    if cut:
        for name, state in unfinished.items():
            run.states[name] = state if stopped_by_user else "notrun"
    reading = run.refresh()
    update: dict = {"results": reading.payload, "reading": reading}
    for name in run.results:  # its evidence may have changed as the others finished (a control, after it)
        update[f"head:{name}"] = views.card(name, reading)[f"head:{name}"]
    if failed:
        update["error"] = failed
    for name in unfinished if cut else ():
        update.update(views.card(name, None, run.states[name], run.partial.get(name, "")))
    if stopped_by_user:
        states = {name: unfinished.get(name, "finished") for name in run.names}
        update["status"] = present.stopped_status(run.pair, run.seconds, states)
    elif failed:
        update["status"] = present.refused_status(f"the run failed: {failed}")
    else:
        update["status"] = present.finished_status(run.pair, run.seconds, workers, out_of_time, run.shared)
    update.update(run.verdict())
    return update
