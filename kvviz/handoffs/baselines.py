"""Single-model baselines: the receiver alone, the sharer alone, and Skyline."""

from __future__ import annotations

from kvviz.handoffs.common import LoadedPair, TokenCallback, single_model_result
from kvviz.prompts import build_segments
from kvviz.results import HandoffRequest, HandoffResult


def receiver_alone(pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None) -> HandoffResult:
    """The receiver answers the query without anything from the sharer (the lower bound)."""
    segments = build_segments(pair.receiver.tokenizer, request.query)
    return single_model_result("receiver", pair, pair.receiver, segments, request, "receiver", on_token)


def sharer_alone(pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None) -> HandoffResult:
    """The sharer answers by itself, with the context it holds (for comparison)."""
    segments = build_segments(pair.sharer.tokenizer, request.query, request.context)
    return single_model_result("sharer", pair, pair.sharer, segments, request, "sharer", on_token)


def skyline(pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None) -> HandoffResult:
    """The receiver sees the context and the query in one prompt (the upper bound)."""
    if not request.has_context:
        return HandoffResult.not_applicable(
            "skyline", pair.name, "Skyline needs a private context; without one it is the receiver alone."
        )
    segments = build_segments(pair.receiver.tokenizer, request.query, request.context)
    return single_model_result("skyline", pair, pair.receiver, segments, request, "receiver", on_token)
