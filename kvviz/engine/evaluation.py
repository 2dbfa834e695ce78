"""The one evaluation loop: run handoff variants over records, score each answer, tally.

The benchmark (``kvviz.studies.bench``), ``eval-fuser`` (``kvviz.studies.c2c.evaluate``), the page's sweep
(``kvviz.app.sweep``) and the studies in ``research/`` all run the same three steps:

1. ``evaluate(pair, items, variants, request_for, done=...)``: every (record, variant) not yet in
   ``done`` (the pairs already on disk: a resumed run skips them) becomes a request
   (``request_for(record, variant)``) and a result (``kvviz.engine.runner.run_handoff``), yielded as an
   ``Evaluated`` as soon as it is there, so the caller writes its row at once;
2. the caller scores it with its own scorer (``kvviz.data`` metrics: containment, token F1, the
   multiple-choice letter);
3. ``tally`` counts hits per variant (or per any key), each with its 95% Wilson interval; a result
   that did not apply is counted apart, with its reason, never as wrong.

A ``Variant`` is a handoff with some option values (``kvcomm@0.3``: KVComm at ratio 0.3); its
label names the rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable, Iterator

from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.data import wilson_interval
from kvviz.data.swaps import Swap
from kvviz.engine import runner


@dataclass(frozen=True)
class Variant:
    label: str  # the row name: "text", "kvcomm@0.3", "kvcomm-random@0.5"
    handoff: str  # the registry name
    options: dict = field(default_factory=dict)  # option values of this variant (its handoff's)


@dataclass(frozen=True)
class Evaluated:
    """One record answered by one variant (and, with a swap arm, on its swapped note too)."""

    index: int  # the record's position in the task
    record: object
    variant: Variant
    request: HandoffRequest
    result: HandoffResult
    swap: Swap | None = None  # the record's swapped note, when the loop has a swap arm
    swapped: HandoffResult | None = None  # the same variant on it


def evaluate(
    pair,
    items: Iterable[tuple[int, object]],
    variants: list[Variant],
    request_for: Callable[[object, Variant], HandoffRequest],
    done: set[tuple[str, str]] = frozenset(),
    record_id: Callable[[object], str] = lambda record: record.id,
    swap_of: Callable[[object], Swap | None] | None = None,
) -> Iterator[Evaluated]:
    """Each (record, variant) pair not in ``done`` ((record id, variant label) pairs), in record
    order, the variants in their order. ``swap_of``: a record's swapped note (or None); the same
    variant then also answers on it (the swap arm), with the same options (on the pair the swap names,
    when its sharer is what changed)."""
    for index, record in items:
        swap = swap_of(record) if swap_of is not None else None
        for variant in variants:
            if (record_id(record), variant.label) in done:
                continue
            request = request_for(record, variant)
            result = runner.run_handoff(variant.handoff, pair, request)
            swapped = None
            if swap is not None:
                swapped_request = dataclasses.replace(request, context=swap.context)
                swapped = runner.run_handoff(variant.handoff, runner.swap_pair(pair, swap), swapped_request)
            yield Evaluated(index, record, variant, request, result, swap, swapped)


def pending(items: list[tuple[int, object]], variants: list[Variant], done: set[tuple[str, str]],
            record_id: Callable[[object], str] = lambda record: record.id) -> int:
    """How many (record, variant) pairs ``evaluate`` will run."""
    return sum((record_id(record), variant.label) not in done for _, record in items for variant in variants)


@dataclass
class Tally:
    """Hits out of the answers that applied, with a 95% Wilson interval; not applicable apart."""

    correct: int = 0
    n: int = 0
    skipped: int = 0
    reason: str = ""  # why a result did not apply (the last one seen)

    def add(self, hit: bool | None, reason: str = "") -> None:
        """One answer: ``hit`` True / False, or None when the handoff did not apply (``reason``)."""
        if hit is None:
            self.skipped += 1
            self.reason = reason or self.reason
            return
        self.n += 1
        self.correct += int(bool(hit))

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.n if self.n else None

    @property
    def ci95(self) -> tuple[float, float] | None:
        return wilson_interval(self.correct, self.n) if self.n else None


def tally(scored: Iterable[tuple[Hashable, bool | None, str]]) -> dict[Hashable, Tally]:
    """``(key, hit or None, reason)`` items -> one ``Tally`` per key, in first-seen order."""
    out: dict[Hashable, Tally] = {}
    for key, hit, reason in scored:
        out.setdefault(key, Tally()).add(hit, reason)
    return out
