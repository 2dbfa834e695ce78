"""Text handoff: the sharer writes a short message, the receiver reads it with the query.

With a private context the sharer relays what matters in it (KVComm's setting); with a shared
question it writes the background that helps (the C2C paper's text-to-text protocol). The
receiver reads the message in the context slot of its prompt, so an empty message gives exactly
the receiver-alone prompt. The message's length bound is this handoff's option
(``message_tokens``, ``--message-tokens``); CIPHER writes its message of vectors under the same bound.
"""

from __future__ import annotations

from kvviz.core.prompts import build_segments
from kvviz.core.results import GenerationSettings, HandoffRequest, HandoffResult
from kvviz.handoffs.common import HandoffIO, answer, handoff_result, read_prompt
from kvviz.handoffs.registry import Handoff, Option, option_values
from kvviz.runtime.measure import StageTimer, answer_flops
from kvviz.runtime.models import LoadedPair

NAME = "text"
OPTIONS = (
    # the bound follows the policy's caps (kvviz.core.limits); the page and the /run API call it message_tokens
    Option("message_tokens", "Message length bound (tokens)", 64, kind="int", limit="message_tokens",
           flag="--message-tokens", api_name="message_tokens"),
)

RELAY_INSTRUCTION = (
    "Another assistant must answer this question but cannot see the context. "
    "Write the facts from the context that it needs, in one or two short sentences."
)
BACKGROUND_INSTRUCTION = "Briefly describe the most useful background to solve the problem."


def message_tokens(request: HandoffRequest) -> int:
    """How long the sharer's message may be, in tokens."""
    return option_values(request, NAME, OPTIONS)["message_tokens"]


def sharer_message_segments(pair: LoadedPair, request: HandoffRequest):
    instruction = RELAY_INSTRUCTION if request.has_context else BACKGROUND_INSTRUCTION
    return build_segments(pair.sharer.tokenizer, request.query, request.context, instruction=instruction)


def receiver_segments(pair: LoadedPair, request: HandoffRequest, message: str):
    return build_segments(pair.receiver.tokenizer, request.query, context=message or None)


def run(pair: LoadedPair, request: HandoffRequest, io: HandoffIO, message_override: str | None = None) -> HandoffResult:
    """``message_override`` skips the sharer and hands over that text (tests, teaching);
    ``io.on_message`` receives the message so far while the sharer writes it."""
    timer = StageTimer()
    sharer_segments = sharer_message_segments(pair, request)
    sharer_flops = 0.0
    if message_override is None:
        # The message is always greedy: sampling settings apply to the final answer only.
        bound = message_tokens(request)
        settings = GenerationSettings(max_new_tokens=bound, greedy=True)
        output = answer(pair.sharer, sharer_segments, settings, timer, "sharer", io.on_message, max_new_tokens=bound,
                        is_answer=False)
        message, written = output.text, len(output.token_ids)
        sharer_flops = answer_flops(pair.sharer.facts, len(sharer_segments.input_ids), written)[1]
    else:
        message = message_override
        written = len(pair.sharer.tokenizer(message, add_special_tokens=False)["input_ids"]) if message else 0

    segments = receiver_segments(pair, request, message)
    # what crossed: the message, at the front of the receiver's prompt
    io.send("message tokens (in the receiver's prompt)", range(len(segments.context_ids)), segments.context_ids)
    output = answer(pair.receiver, segments, request.generation, timer, "receiver", io.on_token)
    prompt_length = len(segments.input_ids)
    prompt_flops, receiver_flops = answer_flops(pair.receiver.facts, prompt_length, len(output.token_ids))
    # the receiver cannot start before the message is written: its stages are on the critical path
    return handoff_result(
        NAME, pair, output, timer,
        seen={"sharer": sharer_segments.text, "message": message, "receiver": segments.text},
        communication="text", bytes_sent=len(message.encode("utf-8")),
        flops={"sharer": sharer_flops, "receiver": receiver_flops},
        flops_to_first_token={"sharer": sharer_flops, "receiver": prompt_flops},  # the message is written first
        tokens={"message": written, "receiver_prompt": prompt_length},
        details={"mode": "relay" if request.has_context else "background"},
    )


# --- descriptor -------------------------------------------------------------------------------


def _receiver_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult):
    return read_prompt(pair.receiver, receiver_segments(pair, request, result.seen.get("message", "")).input_ids)


HANDOFFS = (
    Handoff(
        name=NAME,
        title="Text message",
        label="Text",
        color="#E69F00",  # orange
        summary="the sharer writes a short message; the receiver reads it",
        run=run,
        control="receiver",
        options=OPTIONS,
        message_tokens=message_tokens,
        receiver_prompt=_receiver_prompt,
        default=True,
    ),
)
