"""What a run of handoffs tells its consumer as it goes (``kvviz.engine.stream.run``): one frozen
dataclass per kind of event, matched by class (``match event: case Token(handoff, text): ...``).

Plain data only (strings and the dicts of ``HandoffResult.to_dict``): on a ZeroGPU Space the events
are pickled across from the GPU worker (``kvviz.core.zerogpu``).

A run's events, in order: ``Status`` lines while the pair loads; ``Done`` at once for each handoff
that cannot run on this pair or request; for each handoff that runs, ``Started``, then the
``Message`` it may write before its answer, the answer's ``Token`` events and its ``Done``; after
every handoff is done, what crossed (``Scored`` and ``Lens``, ``kvviz.engine.runner.finish_crossed``).
A run that ran out of time ends with ``Stopped``, one that could not start with ``Failed``. A
greedy request served by a server's shared runs (``kvviz.engine.shared_runs``) gets ``Computation``
first, and one that shares another's run ``Shared`` next.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Status:
    """A progress line (the pair loading)."""

    text: str


@dataclass(frozen=True)
class Started:
    """A handoff began running."""

    handoff: str


@dataclass(frozen=True)
class Message:
    """The message a handoff writes before its answer, so far."""

    handoff: str
    text: str


@dataclass(frozen=True)
class Token:
    """A handoff's answer so far, after one more token."""

    handoff: str
    text: str


@dataclass(frozen=True)
class Done:
    """A handoff finished (or cannot run here): its result, ``HandoffResult.to_dict``."""

    handoff: str
    result: dict


@dataclass(frozen=True)
class Stopped:
    """The run reached its time cap: why (the handoffs not done did not run)."""

    reason: str


@dataclass(frozen=True)
class Failed:
    """The run could not start or went wrong outside any handoff: why."""

    reason: str


@dataclass(frozen=True)
class Shared:
    """This request shares a run computed for another (``kvviz.engine.shared_runs``): how, in words."""

    text: str


@dataclass(frozen=True)
class Computation:
    """Which computation this request's events come from (``kvviz.engine.shared_runs``): requests that
    share one get the same ``identity``, so what is drawn from its results can be drawn once."""

    identity: str


@dataclass(frozen=True)
class Scored:
    """A finished answer scored against its control's prompt: its result's ``token_change``."""

    handoff: str
    token_change: dict


@dataclass(frozen=True)
class Lens:
    """What the receiver's layers read while a handoff answered: its result's ``logit_lens``."""

    handoff: str
    logit_lens: dict


Event = Status | Started | Message | Token | Done | Stopped | Failed | Computation | Shared | Scored | Lens
