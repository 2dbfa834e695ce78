"""CIPHER: the sharer writes its message as expected embeddings instead of tokens.

Pham et al. 2024, "Let Models Speak Ciphers" (one of the KVComm paper's baselines, REFERENCE §2):
1. The sharer reads the same prompt as in the text handoff (relay the private context, or write
   background for a shared question).
2. At each step of writing, instead of picking one token it takes the whole next-token
   distribution p (a softmax at ``temperature``) and writes the expected embedding
   ``sum_i p_i * E[i]`` (E: its input-embedding table, at the scale its embedding layer outputs).
   That vector is fed back as its next input. It stops when the most likely token would end the
   message (end of turn, or a new line for a base model), or at the message length bound.
3. The receiver reads those vectors in the context slot of its prompt, where the text handoff puts
   the message's tokens, and answers with the shared decode loop.

The vectors only mean something to a receiver that embeds tokens the same way: sharer and receiver
must share a tokenizer and an embedding width (a model and itself, or its fine-tune). For a
learner, each vector is also read back as its nearest token (cosine over the embedding table) and
as the most likely token; at temperature 0 the distribution is one-hot, every vector is exactly
the embedding of the greedy token, and CIPHER reads what the text handoff's sharer writes.
"""

from __future__ import annotations

from kvviz.core.prompts import build_segments
from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.handoffs.cipher.message import read_message, receiver_pieces, write_message
from kvviz.handoffs.common import HandoffIO, handoff_result
from kvviz.handoffs.registry import Handoff, Option, ReceiverPrompt, option_values
from kvviz.handoffs.text import message_tokens, sharer_message_segments
from kvviz.runtime.decode import generate
from kvviz.runtime.measure import StageTimer, answer_flops, decode_flops, forward_flops
from kvviz.runtime.models import LoadedPair

NAME = "cipher"
COLOR = "#332288"  # indigo
OPTIONS = (
    Option("temperature", "CIPHER temperature of the sharer's softmax (0: one-hot, the text handoff's tokens)", 1.0,
           minimum=0.0, maximum=2.0, step=0.05),
)


# --- writing ----------------------------------------------------------------------------------


# --- reading ----------------------------------------------------------------------------------


# --- the handoff ------------------------------------------------------------------------------


def shared_embedding_space(pair: LoadedPair, request: HandoffRequest) -> str | None:
    sharer, receiver = pair.sharer.facts, pair.receiver.facts
    if sharer.tokenizer_hash != receiver.tokenizer_hash or sharer.hidden_size != receiver.hidden_size:
        return (
            "CIPHER sends embedding vectors that the receiver reads as if they were its own token embeddings, so "
            f"sharer and receiver must share a tokenizer and an embedding width: {sharer.name} has "
            f"{'another tokenizer' if sharer.tokenizer_hash != receiver.tokenizer_hash else 'the same tokenizer'} and "
            f"width {sharer.hidden_size}, {receiver.name} width {receiver.hidden_size}."
        )
    return None


def run(pair: LoadedPair, request: HandoffRequest, io: HandoffIO) -> HandoffResult:
    temperature = option_values(request, NAME, OPTIONS)["temperature"]
    sharer, receiver = pair.sharer, pair.receiver
    timer = StageTimer()
    sharer_segments = sharer_message_segments(pair, request)
    message = write_message(sharer, sharer_segments.input_ids, temperature, message_tokens(request), timer, io.on_message)
    if message.vectors.shape[0]:
        # what crossed: the message vectors, in the receiver's message slot (shown as their nearest tokens)
        start = len(receiver_pieces(receiver, request)[0])
        io.send("message vectors (in the receiver's prompt; shown as the token nearest to each)",
                          range(start, start + message.vectors.shape[0]), message.nearest_ids)
    with timer.stage("receiver_prefill"):
        prompt, attention = read_message(receiver, request, message.vectors)
    with timer.stage("receiver_decode"):
        output = generate(receiver, prompt.state, prompt.next_token, request.generation, on_token=io.on_token, timer=timer)

    count = len(message.steps)
    reading = sharer.tokenizer.decode(message.nearest_ids, skip_special_tokens=True).strip()
    _, _, before, after = receiver_pieces(receiver, request)
    receiver_seen = (f"{before}[{count} vectors, read as nearest tokens: {reading}]{after}" if count
                     else build_segments(receiver.tokenizer, request.query).text)
    prompt_length, sharer_length = prompt.state.next_position, len(sharer_segments.input_ids)
    vocab, width = sharer.facts.vocab_size, sharer.facts.hidden_size
    sharer_flops = (forward_flops(sharer.facts, sharer_length, 0, 1) + decode_flops(sharer.facts, count, sharer_length)
                    + 2.0 * vocab * width * count)  # the expected embeddings
    prompt_flops, receiver_flops = answer_flops(receiver.facts, prompt_length, len(output.token_ids))
    # the receiver cannot start before the whole message is written
    return handoff_result(
        NAME, pair, output, timer,
        seen={"sharer": sharer_segments.text, "message": reading, "receiver": receiver_seen},
        communication="embeddings", bytes_sent=message.vectors.numel() * message.vectors.element_size(),
        flops={"sharer": sharer_flops, "receiver": receiver_flops},
        flops_to_first_token={"sharer": sharer_flops, "receiver": prompt_flops},  # the message is written first
        tokens={"message": count, "receiver_prompt": prompt_length},
        layers=[{"layer": layer, "attention_on_message": mass} for layer, mass in enumerate(attention)],
        details={
            "temperature": temperature,
            "likeliest_message": sharer.tokenizer.decode(message.likeliest_ids, skip_special_tokens=True).strip(),
            "nearest_message": reading,
            "steps": message.steps,
            "mean_top_probability": sum(s["top_probability"] for s in message.steps) / count if count else None,
            "mode": "relay" if request.has_context else "background",
        },
    )


# --- descriptor -------------------------------------------------------------------------------


def receiver_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult) -> ReceiverPrompt:
    """The receiver after reading the message (the sharer writes it again: it is deterministic)."""
    temperature = option_values(request, NAME, OPTIONS)["temperature"]
    message = write_message(pair.sharer, sharer_message_segments(pair, request).input_ids, temperature,
                            message_tokens(request))
    return read_message(pair.receiver, request, message.vectors)[0]


HANDOFFS = (
    Handoff(
        name=NAME,
        title="CIPHER: embedding message",
        label="CIPHER",
        color=COLOR,
        summary="the sharer writes expected embeddings instead of tokens; the receiver reads the vectors",
        run=run,
        control="receiver",
        needs=("a sharer with the receiver's tokenizer and embedding width",),
        applicable=shared_embedding_space,
        options=OPTIONS,
        message_tokens=message_tokens,  # the text handoff's message bound
        receiver_prompt=receiver_prompt,
    ),
)
