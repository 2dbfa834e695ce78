"""The decode batch: every sequence that decodes with one model shares its decode steps.

``kvviz.runtime.decode.generate`` stays the one decode loop; each of its steps goes through the model's
``DecodeBatch`` (one per loaded model, shared by every thread of the process: the handoffs of one
run, and concurrent runs). The batch is a barrier. A thread hands in its sequence's next token and
waits; when every sequence of the batch has handed in its token, the last one to arrive runs one
batched step (``kvviz.runtime.step``) for all of them and wakes the others, each with its own result. A
sequence whose prompt is read later joins at the next step; one that stops leaves, and the others
go on without it.

The handoff's own thread keeps everything that is the handoff's: it chooses its first answer token
from its own prefill before it joins (no column waits for the batch before its first token), and it
runs its stop checks and its ``on_token`` callback (which may raise ``Cancelled``) itself; the step
never calls user code. ``on_token`` must not block (the others wait for it).

Every sequence gets exactly the bits it gets alone (``kvviz.runtime.step``), so who else is in a batch
changes no token.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from kvviz.core import policy
from kvviz.runtime.cache import KVState
from kvviz.runtime.step import DecodeStep


@dataclass(eq=False)
class Sequence:
    """One decoding sequence in a batch: its state, the token it feeds next, and what the step left."""

    state: KVState
    greedy: bool = True
    feed: int | None = None
    hidden: torch.Tensor | None = None  # [1, hidden]: the final hidden state after ``feed``
    token: int | None = None  # the greedy choice from ``hidden`` (greedy sequences only)
    error: BaseException | None = None
    done: bool = field(default=False, repr=False)
    sizes: list[int] = field(default_factory=list, repr=False)  # the batch size of each step it took


class DecodeBatch:
    """The shared decode steps of one model. ``step_function(states, tokens) -> hidden [B, H]`` runs a
    batched step; ``choose_greedy(hidden [G, H]) -> list[int]`` picks the greedy tokens of G rows."""

    def __init__(self, step_function, choose_greedy):
        self.step_function = step_function
        self.choose_greedy = choose_greedy
        self._condition = threading.Condition()
        self._members: set[Sequence] = set()
        self._ready: list[Sequence] = []

    def join(self, sequence: Sequence) -> None:
        with self._condition:
            self._members.add(sequence)

    def leave(self, sequence: Sequence) -> None:
        """Leave the batch (always, also on an error: the others must not wait for this one). A
        waiting member runs the step this one no longer holds up."""
        with self._condition:
            self._members.discard(sequence)
            if sequence in self._ready:
                self._ready.remove(sequence)
            self._condition.notify_all()

    def step(self, sequence: Sequence, token: int) -> Sequence:
        """Feed ``token`` into ``sequence`` together with the others; returns it with ``hidden`` (and
        ``token`` for a greedy sequence) set. Re-raises an error the shared step hit."""
        with self._condition:
            if sequence not in self._members:
                raise RuntimeError("the sequence has not joined this batch")
            sequence.feed, sequence.hidden, sequence.token, sequence.done = token, None, None, False
            self._ready.append(sequence)
            while not sequence.done:
                if len(self._ready) == len(self._members):
                    self._run_step()
                else:
                    self._condition.wait()
            if sequence.error is not None:
                error, sequence.error = sequence.error, None
                raise error
            return sequence

    def _run_step(self) -> None:
        # Called with the lock held, when every member has handed in its token: the member that
        # notices runs the step for all, holding the lock meanwhile (nobody has anything else to do
        # with this model until it is done; a sequence that joins now takes the next step).
        batch, self._ready = self._ready, []
        try:
            hidden = self.step_function([s.state for s in batch], [s.feed for s in batch])
            greedy = [index for index, s in enumerate(batch) if s.greedy]
            tokens = self.choose_greedy(hidden[greedy]) if greedy else []
            for index, sequence in enumerate(batch):
                sequence.hidden = hidden[index : index + 1]
            for index, token in zip(greedy, tokens):
                batch[index].token = token
        except BaseException as error:  # every member of the step gets it, in its own thread
            for sequence in batch:
                sequence.error = error
        finally:
            for sequence in batch:
                sequence.sizes.append(len(batch))
                sequence.done = True
            self._condition.notify_all()


# --- each model's shared batch ------------------------------------------------------------------

_decoding_lock = threading.Lock()


def _decoding(loaded) -> tuple[DecodeStep, DecodeBatch | None]:
    """The model's batched step and shared batch (None when the step does not cover the model),
    made once, by the first decode that asks; kept on the ``LoadedModel``."""
    with _decoding_lock:
        if loaded._decoding is None:
            step = DecodeStep(loaded)
            batch = DecodeBatch(step.step, loaded.head.greedy_tokens) if step.supported else None
            loaded._decoding = (step, batch)
        return loaded._decoding


def decode_batch(loaded) -> DecodeBatch | None:
    """The model's shared ``DecodeBatch``, or None when the batched step does not cover the model
    (``decode_path`` says why) or is turned off."""
    return _decoding(loaded)[1] if policy.batched_decode_enabled() else None


def decode_path(loaded) -> dict:
    """How this model's decode tokens are computed (for the speed report and the docs)."""
    if not policy.batched_decode_enabled():
        return {"batched": False, "reason": "KVVIZ_BATCHED_DECODE=0"}
    step, _ = _decoding(loaded)
    if not step.supported:
        return {"batched": False, "reason": step.reason}
    return {"batched": True, "rows_at_least": step.floor, "row_classes": step.row_classes, "products": step.products}
