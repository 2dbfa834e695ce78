"""Pieces every handoff shares: "prefill these segments, then decode", one model's answer, and the
one place a handoff's result is assembled (``handoff_result``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvviz.core.prompts import PromptSegments
from kvviz.core.results import GenerationSettings, HandoffRequest, HandoffResult
from kvviz.handoffs.registry import Check, ReceiverPrompt
from kvviz.runtime.cache import KVState
from kvviz.runtime.crossed import SentTokens
from kvviz.runtime.decode import DecodeOutput, SharedPrompts, generate, prefill
from kvviz.runtime.measure import StageTimer, answer_flops
from kvviz.runtime.models import LoadedModel, LoadedPair

TokenCallback = Callable[[str], None]


@dataclass
class HandoffIO:
    """What a handoff's run is handed besides the pair and the request, and what it hands back
    beside its result: where its answer streams (``on_token``: the answer so far, after every
    token) and its message (``on_message``: the message so far, for a handoff that writes one before
    the answer), the prompts its run reads once with the run's other handoffs (``prompts``, for
    ``read_prompt_once``), and what it sent (``send``), which the engine reads for what crossed."""

    on_token: TokenCallback | None = None
    on_message: TokenCallback | None = None
    prompts: SharedPrompts | None = None
    sent: SentTokens | None = None

    def send(self, kind: str, positions, token_ids, layers=None) -> None:
        """Say what crossed: the receiver's key positions that hold it, their tokens, and the
        receiver layers that hold them (None: every layer)."""
        self.sent = SentTokens.of(kind, positions, token_ids, layers)

# What a control handoff's sender reads instead of the note (the KVComm and translation controls):
# function words only, so that the control's note names nothing a question could ask for (no person,
# place, number or object) and its answer cannot repeat one; as many words as the note, so that what
# the receiver attends to has the note's length.
CONTENT_FREE_WORDS = ("it", "is", "as", "it", "was", "and", "so", "it", "will", "be")
CONTROL_NOTE = "a note of the note's length that names nothing (function words only)"


def content_free_note(note: str | None) -> str:
    """The control's note: as many words as ``note`` (at least three), cycling ``CONTENT_FREE_WORDS``,
    as a sentence ("It is as it was and so it will be.")."""
    count = max(3, len((note or "").split()))
    words = [CONTENT_FREE_WORDS[i % len(CONTENT_FREE_WORDS)] for i in range(count)]
    return " ".join(words).capitalize() + "."


def needs_same_shape_sender(method: str, positions: str) -> Check:
    """The one same-shape-sender check (KVComm, its control, the latent relay): the pair's sender
    with the receiver's architecture, KV shape and tokenizer, whose cache the receiver reads as its
    own. ``positions``: why the tokenizer must be shared, for this method."""

    def check(pair: LoadedPair, request: HandoffRequest) -> str | None:
        sender, receiver = pair.same_shape_sender.facts, pair.receiver.facts
        if sender.kv_shape_signature != receiver.kv_shape_signature:
            return (
                f"{method} needs a sender with the receiver's architecture and KV shape (the pair's same-shape sender): "
                f"{sender.name} is {sender.model_type} with {sender.num_layers} layers x {sender.num_kv_heads} KV heads x "
                f"{sender.head_dim} dims, {receiver.name} is {receiver.model_type} with {receiver.num_layers} x "
                f"{receiver.num_kv_heads} x {receiver.head_dim}."
            )
        if sender.tokenizer_hash != receiver.tokenizer_hash:
            return f"{method} needs sender and receiver to share a tokenizer ({positions})."
        return None

    return check


def answer(
    model: LoadedModel,
    segments: PromptSegments,
    settings: GenerationSettings,
    timer: StageTimer,
    role: str,
    on_token: TokenCallback | None = None,
    state: KVState | None = None,
    max_new_tokens: int | None = None,
    is_answer: bool = True,
) -> DecodeOutput:
    """Prefill ``segments`` (on top of ``state`` if given), decode; time both under ``role``.
    ``is_answer``: this decode is the handoff's answer (its first token is marked on the timer);
    False for a message written before it."""
    state = state or KVState()
    with timer.stage(f"{role}_prefill"):
        first, _ = prefill(model, state, segments.input_ids)
    with timer.stage(f"{role}_decode"):
        return generate(model, state, first, settings, on_token=on_token, max_new_tokens=max_new_tokens,
                        timer=timer if is_answer else None)


def handoff_result(
    name: str, pair: LoadedPair, output: DecodeOutput, timer: StageTimer, *, seen: dict[str, str], flops: dict,
    flops_to_first_token: dict, tokens: dict, communication: str = "none", bytes_sent: int = 0,
    layers: list[dict] | None = None, details: dict | None = None,
) -> HandoffResult:
    """A handoff's result, from its answer (``output``: the tokens, the text, why it stopped), its
    ``timer`` (the stages, the one time to first token) and what it declares it measured: what each
    model saw, FLOPs per model (in all and before the answer's first token), token counts (the
    generated count is added here), what it sent (``communication``, ``bytes_sent``), its
    per-layer records and its own details (``stopped_by`` is added here)."""
    return HandoffResult(
        handoff=name,
        pair=pair.name,
        answer=output.text,
        answer_ids=output.token_ids,
        seen=seen,
        timings=timer.as_dict(),
        bytes_communicated=bytes_sent,
        communication=communication,
        flops=flops,
        flops_to_first_token=flops_to_first_token,
        tokens={**tokens, "generated": len(output.token_ids)},
        layers=list(layers or []),
        first_token_seconds=timer.first_token_seconds,
        receiver_first_token_seconds=timer.receiver_first_token_seconds,
        details={**(details or {}), "stopped_by": output.stopped_by},
    )


def single_model_result(
    handoff: str,
    pair: LoadedPair,
    model: LoadedModel,
    segments: PromptSegments,
    request: HandoffRequest,
    role: str,
    on_token: TokenCallback | None,
) -> HandoffResult:
    """One model answers from one prompt: the receiver-alone, sharer-alone and Skyline cases (one
    model, nothing to wait for: the receiver's side is the whole path, and there is no receiver
    when the sharer answers alone)."""
    timer = StageTimer()
    output = answer(model, segments, request.generation, timer, role, on_token)
    prompt_length = len(segments.input_ids)
    prompt_flops, flops = answer_flops(model.facts, prompt_length, len(output.token_ids))
    return handoff_result(
        handoff, pair, output, timer, seen={role: segments.text}, flops={role: flops},
        flops_to_first_token={role: prompt_flops}, tokens={f"{role}_prompt": prompt_length},
        details={f"{role}_model": model.name},
    )


def read_prompt(model: LoadedModel, token_ids: list[int], state: KVState | None = None) -> ReceiverPrompt:
    """The receiver after reading ``token_ids`` (on top of ``state``): what a descriptor's
    ``receiver_prompt`` returns for the benchmark's likelihood scoring."""
    state = state or KVState()
    next_token, _ = prefill(model, state, token_ids)
    return ReceiverPrompt(model=model, state=state, next_token=next_token, last_token=token_ids[-1])
