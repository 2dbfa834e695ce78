"""Single-model baselines: the receiver alone, the sharer alone, and Skyline."""

from __future__ import annotations

from kvviz.core.prompts import build_segments
from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.handoffs.common import HandoffIO, read_prompt, single_model_result
from kvviz.handoffs.registry import Handoff, needs_context
from kvviz.runtime.models import LoadedPair


def receiver_alone(pair: LoadedPair, request: HandoffRequest, io: HandoffIO) -> HandoffResult:
    """The receiver answers the query without anything from the sharer (the lower bound)."""
    segments = build_segments(pair.receiver.tokenizer, request.query)
    return single_model_result("receiver", pair, pair.receiver, segments, request, "receiver", io.on_token)


def sharer_alone(pair: LoadedPair, request: HandoffRequest, io: HandoffIO) -> HandoffResult:
    """The sharer answers by itself, with the context it holds (for comparison)."""
    segments = build_segments(pair.sharer.tokenizer, request.query, request.context)
    return single_model_result("sharer", pair, pair.sharer, segments, request, "sharer", io.on_token)


def skyline(pair: LoadedPair, request: HandoffRequest, io: HandoffIO) -> HandoffResult:
    """The receiver sees the context and the query in one prompt (a reference, not a bound)."""
    segments = build_segments(pair.receiver.tokenizer, request.query, request.context)
    # what crossed: the context, read in the receiver's own prompt (positions 0..|C|-1)
    io.send("context tokens (in the receiver's own prompt)", range(len(segments.context_ids)),
                      segments.context_ids)
    return single_model_result("skyline", pair, pair.receiver, segments, request, "receiver", io.on_token)


# --- descriptors ------------------------------------------------------------------------------


def _receiver_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult):
    return read_prompt(pair.receiver, build_segments(pair.receiver.tokenizer, request.query).input_ids)


def _sharer_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult):
    return read_prompt(pair.sharer, build_segments(pair.sharer.tokenizer, request.query, request.context).input_ids)


def _skyline_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult):
    return read_prompt(pair.receiver, build_segments(pair.receiver.tokenizer, request.query, request.context).input_ids)


HANDOFFS = (
    Handoff(
        name="receiver",
        title="Receiver alone",
        label="Receiver",
        color="#7f7f7f",  # grey: nothing shared
        summary="the receiver alone on the query (nothing shared)",
        run=receiver_alone,
        receiver_prompt=_receiver_prompt,
        role="floor",
        default=True,
    ),
    Handoff(
        name="sharer",
        title="Sharer alone",
        label="Sharer",
        color="#D55E00",  # vermillion
        summary="the sharer alone, with whatever context it holds",
        run=sharer_alone,
        receiver_prompt=_sharer_prompt,
    ),
    Handoff(
        name="skyline",
        title="Skyline: sees everything",
        label="Skyline",
        color="#CC79A7",  # purple
        summary="the receiver given context and query in one prompt (the usual reference)",
        run=skyline,
        control="receiver",
        needs=("a private context",),
        applicable=needs_context("Skyline needs a private context; without one it is the receiver alone."),
        receiver_prompt=_skyline_prompt,
        role="ceiling",
        default=True,
    ),
)
