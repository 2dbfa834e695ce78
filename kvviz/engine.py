"""Load a pair and run handoffs on it: what the CLI, the app and the benchmark all call."""

from __future__ import annotations

import traceback

from kvviz.handoffs import get, parse_handoffs
from kvviz.handoffs.common import LoadedPair, TokenCallback
from kvviz.models import load_model, resolve_pair
from kvviz.results import HandoffRequest, HandoffResult


def load_pair(pair_name, device: str | None = None, dtype=None, progress=print) -> LoadedPair:
    spec = resolve_pair(pair_name)
    sharer = load_model(spec.sharer, device, dtype, progress)
    receiver = load_model(spec.receiver, device, dtype, progress)
    kvcomm_sender = load_model(spec.kvcomm_sender_name, device, dtype, progress)
    return LoadedPair(spec=spec, sharer=sharer, receiver=receiver, kvcomm_sender=kvcomm_sender)


def not_applicable(name: str, pair: LoadedPair, request: HandoffRequest) -> HandoffResult | None:
    """The "not applicable" result of a handoff whose requirements the pair or the request do not
    meet (its descriptor's ``applicable`` check, no model runs), or None when it can run."""
    handoff = get(name)
    reason = handoff.applicable(pair, request)
    return handoff.not_applicable(pair.name, reason) if reason else None


def run_handoff(name: str, pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None) -> HandoffResult:
    """Run one handoff; an unexpected failure becomes a result that says what went wrong.

    A handoff that cannot run says so at once, without running a model (``not_applicable``).
    """
    try:
        refused = not_applicable(name, pair, request)
        if refused is not None:
            return refused
        return get(name).run(pair, request, on_token=on_token)
    except (ValueError, RuntimeError) as error:
        result = HandoffResult.not_applicable(name, pair.name, f"{type(error).__name__}: {error}")
        result.details["traceback"] = traceback.format_exc(limit=5)
        return result


def run_handoffs(names, pair: LoadedPair, request: HandoffRequest) -> list[HandoffResult]:
    return [run_handoff(name, pair, request) for name in parse_handoffs(names)]
