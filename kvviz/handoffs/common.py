"""Pieces every handoff shares: "prefill these segments, then decode", one model's answer."""

from __future__ import annotations

from typing import Callable

from kvviz.core.prompts import PromptSegments
from kvviz.core.results import GenerationSettings, HandoffRequest, HandoffResult
from kvviz.handoffs.registry import ReceiverPrompt
from kvviz.runtime.cache import KVState
from kvviz.runtime.decode import DecodeOutput, generate, prefill
from kvviz.runtime.measure import StageTimer, decode_flops, forward_flops
from kvviz.runtime.models import LoadedModel, LoadedPair

TokenCallback = Callable[[str], None]

# What a control handoff's sender reads instead of the private context: a fixed sentence that shares
# nothing with any preset or dataset record (the translation's and KVComm's controls).
UNRELATED_CONTEXT = "Mira keeps her red bicycle in the garden shed behind the old library in Lisbon."


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


def single_model_result(
    handoff: str,
    pair: LoadedPair,
    model: LoadedModel,
    segments: PromptSegments,
    request: HandoffRequest,
    role: str,
    on_token: TokenCallback | None,
) -> HandoffResult:
    """One model answers from one prompt: the receiver-alone, sharer-alone and Skyline cases."""
    timer = StageTimer()
    output = answer(model, segments, request.generation, timer, role, on_token)
    prompt_length = len(segments.input_ids)
    prompt_flops = forward_flops(model.facts, prompt_length, 0, logits_tokens=1)
    flops = prompt_flops + decode_flops(model.facts, len(output.token_ids), prompt_length)
    return HandoffResult(
        handoff=handoff,
        pair=pair.name,
        answer=output.text,
        answer_ids=output.token_ids,
        seen={role: segments.text},
        timings=timer.as_dict(),
        bytes_communicated=0,
        communication="none",
        flops={role: flops},
        flops_to_first_token={role: prompt_flops},
        tokens={f"{role}_prompt": prompt_length, "generated": len(output.token_ids)},
        # one model, nothing to wait for: the receiver's side is the whole path (no receiver when
        # the sharer answers alone)
        first_token_seconds=timer.first_token_seconds,
        receiver_first_token_seconds=timer.receiver_first_token_seconds,
        details={"stopped_by": output.stopped_by, f"{role}_model": model.name},
    )


def read_prompt(model: LoadedModel, token_ids: list[int], state: KVState | None = None) -> ReceiverPrompt:
    """The receiver after reading ``token_ids`` (on top of ``state``): what a descriptor's
    ``receiver_prompt`` returns for the benchmark's likelihood scoring."""
    state = state or KVState()
    next_token, _ = prefill(model, state, token_ids)
    return ReceiverPrompt(model=model, state=state, next_token=next_token, last_token=token_ids[-1])
