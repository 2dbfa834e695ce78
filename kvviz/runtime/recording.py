"""What the engine records around one handoff's run, wherever in the method the models run: each
decode loop's batch sizes and, when the request asks, what crossed (``kvviz.runtime.crossed``).

This is kvviz's one context variable, and why: a handoff's prompt passes and decode loops run deep
inside its method, through the shared mechanisms of ``kvviz.runtime.decode`` called from many
helpers, and each of them must know whether this answer is being recorded and add what it ran.
Passing a recorder through every forward would put a recording parameter on every mechanism of
the runtime, for instrumentation only. So the engine sets it around one handoff's run, in that
handoff's own thread (``recording``), and reads back what was recorded. Everything else a run
carries is passed explicitly: its callbacks and what it sent (``kvviz.handoffs.common.HandoffIO``),
the prompts its handoffs read once and the results scored against their controls
(``kvviz.engine.runner.RunContext``).
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from kvviz.runtime.crossed import Inspection, inspection_for


@dataclass
class Recording:
    """What one handoff's run recorded: what crossed (None: not asked) and each decode loop's
    output (``kvviz.runtime.decode.DecodeOutput``), a message's and the answer's, in order."""

    inspection: Inspection | None = None
    decodes: list = field(default_factory=list)


_active: contextvars.ContextVar[Recording | None] = contextvars.ContextVar("kvviz_recording", default=None)


@contextmanager
def recording(request, receiver=None) -> Iterator[Recording]:
    """Around one handoff's run (in its thread): record its decode loops and, when the request asks,
    what crossed in the prompts ``receiver`` reads."""
    token = _active.set(Recording(inspection=inspection_for(request, receiver)))
    try:
        yield _active.get()
    finally:
        _active.reset(token)


def active() -> Recording | None:
    """The recording of the handoff running in this thread, or None outside the engine."""
    return _active.get()


def inspection() -> Inspection | None:
    """What crossed is being recorded for the handoff running in this thread, or None."""
    current = _active.get()
    return None if current is None else current.inspection
