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

import torch

from kvviz.runtime import crossed
from kvviz.runtime.attention import AttentionRows
from kvviz.runtime.cache import KVState
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


class AnswerRecord:
    """What ``kvviz.runtime.crossed`` records of one answer while it is decoded: each token's attention rows
    (the first token's came from the prompt's prefill, ``NextToken.inspected``), the prompt's state
    as the answer found it and the hidden state that chose each token (``token_change``)."""

    def __init__(self, inspection, loaded, state: KVState, first):
        self.inspection, self.loaded, self.state = inspection, loaded, state
        # the prompt's state, for scoring the answer against its control's and for moving the lens
        prompt = state.copy() if inspection.wants("scores") or inspection.wants("lens") else None
        self.inspected = (*first.inspected, prompt, first.hidden.detach().clone())
        self.rows = AttentionRows(limit=crossed.MAX_TOKENS - 1)
        if inspection.wants("attention"):
            state.token_rows = self.rows
        self.hidden_rows: list[torch.Tensor] = []

    @classmethod
    def start(cls, loaded, state: KVState, first, timer):
        """A record when this decode is a recorded handoff's answer (its ``timer`` given), else None."""
        inspection_now = inspection()
        if timer is None or inspection_now is None or first.inspected is None:
            return None
        return cls(inspection_now, loaded, state, first)

    def choosing(self, next_token) -> None:
        if self.inspection.wants("scores") and len(self.hidden_rows) < crossed.MAX_CHANGE_TOKENS:
            self.hidden_rows.append(next_token.hidden.detach().reshape(1, -1))

    def stop(self) -> None:
        self.state.token_rows = None

    def finish(self, token_ids: list[int]) -> None:
        chose = torch.cat(self.hidden_rows[: len(token_ids)]) if token_ids and self.hidden_rows else None
        crossed.record_answer(self.inspection, self.loaded, self.inspected, self.rows.rows, token_ids, chose)
