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
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from kvviz.app import present
from kvviz.app.page import views
from kvviz.app.page.spec import STREAM_INTERVAL
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
    shared: str = ""  # how this request shares another learner's run (``kvviz.engine.shared_runs``), if it does
    # names the results: the computation's when the server's shared runs name it (a greedy run: every
    # request that shares it draws the same figures, so they are drawn once: ``views.FigureCache``),
    # else this run's own (a sampling run; a run stopped, failed or out of time: ``final_update``)
    stamp: str = field(default_factory=views.live_stamp)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def payload(self) -> dict:
        ordered = [self.results[name] for name in self.names if name in self.results]
        data = present.payload(self.pair, self.request.to_dict(), ordered, False, self.preset_key)
        return dict(data, stamp=self.stamp, **({"shared": self.shared} if self.shared else {}))

    def status(self) -> dict:
        return {"status": present.live_status(len(self.results), len(self.names), self.states, self.log)}

    def verdict(self) -> dict:
        states = {name: self.states.get(name, "notrun") for name in self.names}
        payload = {"results": list(self.results.values())}
        return views.verdict(payload, self.names, self.answers, self.subject, states)


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
    first = {**run.status(), **run.verdict()}
    for name in run.names:
        first.update(views.card(name, None, run.answers, "waiting"))
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
                    update[f"stats:{name}"] = present.card_stats(None, message=message)
            held.clear()
            last_sent = time.perf_counter()
        if now:
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
            update.update(views.card(name, None, run.answers, "running", ""))
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
            update.update(views.card(name, result, run.answers))
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
            run.stamp = views.shared_stamp(identity)
        case Shared(text):
            run.shared = text
    return False


def final_update(run: LiveRun, workers: int, stopped_by_user: bool, out_of_time: str, failed: str) -> dict:
    """The last update: every unfinished column's state, the status, the strip and the results."""
    if stopped_by_user or out_of_time or failed:  # not the computation's whole results: their own name
        run.stamp = views.live_stamp()
    update: dict = {"results": run.payload()}
    if failed:
        update["error"] = failed
    unfinished = {name: ("stopped" if name in run.partial else "notstarted") for name in run.names if name not in run.results}
    if stopped_by_user or out_of_time or failed:
        for name, state in unfinished.items():
            state = state if stopped_by_user else "notrun"
            update.update(views.card(name, None, run.answers, state, run.partial.get(name, "")))
            run.states[name] = state
    if stopped_by_user:
        states = {name: unfinished.get(name, "finished") for name in run.names}
        update["status"] = present.stopped_status(run.seconds, states)
    elif failed:
        update["status"] = present.refused_status(f"the run failed: {failed}")
    else:
        update["status"] = present.finished_status(run.seconds, workers, out_of_time, run.shared)
    update.update(run.verdict())
    return update
