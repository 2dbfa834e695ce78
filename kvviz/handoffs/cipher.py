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

import threading
from dataclasses import dataclass

import torch

from kvviz.core.prompts import build_segments, encode, has_chat_template, split_at_context, stop_token_ids, unmark
from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.handoffs.common import HandoffIO, TokenCallback, handoff_result, read_prompt
from kvviz.handoffs.registry import Handoff, Option, ReceiverPrompt, option_values
from kvviz.handoffs.text import message_tokens, sharer_message_segments
from kvviz.runtime.attention import AttentionPlan
from kvviz.runtime.cache import KVState
from kvviz.runtime.decode import generate, prefill, prefill_vectors
from kvviz.runtime.measure import StageTimer, answer_flops, decode_flops, forward_flops
from kvviz.runtime.models import LoadedModel, LoadedPair

NAME = "cipher"
COLOR = "#332288"  # indigo
OPTIONS = (
    Option("temperature", "CIPHER temperature of the sharer's softmax (0: one-hot, the text handoff's tokens)", 1.0,
           minimum=0.0, maximum=2.0, step=0.05),
)


@dataclass
class Message:
    vectors: torch.Tensor  # [steps, width]: what is sent
    steps: list[dict]  # per vector: its readings and how sure the sharer was
    likeliest_ids: list[int]  # the most likely token at each step
    nearest_ids: list[int]  # the token whose embedding is nearest to each vector


# --- writing ----------------------------------------------------------------------------------

_row_norms: dict[tuple, torch.Tensor] = {}
_row_norms_lock = threading.Lock()


def _embedding_table(model: LoadedModel) -> tuple[torch.Tensor, float]:
    """(the input-embedding weights [vocab, width], the scale the embedding layer multiplies by)."""
    embedding = model.model.get_input_embeddings()
    scale = getattr(embedding, "embed_scale", 1.0)
    return embedding.weight, float(scale)


def _norms(model: LoadedModel, weight: torch.Tensor) -> torch.Tensor:
    key = (model.name, weight.data_ptr(), str(weight.device))
    with _row_norms_lock:
        if key not in _row_norms:
            _row_norms[key] = weight.float().norm(dim=-1).clamp_min(1e-12)
        return _row_norms[key]


def nearest_token(model: LoadedModel, vector: torch.Tensor) -> tuple[int, float]:
    """The token whose embedding points most nearly the same way as ``vector``, and the cosine."""
    weight, _ = _embedding_table(model)
    cosines = (weight.float() @ vector.float()) / (_norms(model, weight) * vector.float().norm().clamp_min(1e-12))
    best = int(cosines.argmax())
    return best, float(cosines[best])


@torch.no_grad()
def write_message(sender: LoadedModel, prompt_ids: list[int], temperature: float, max_vectors: int,
                  timer: StageTimer | None = None, on_message: TokenCallback | None = None) -> Message:
    """The sharer's message as expected embeddings, one per step (see the module docstring); its
    prompt pass is timed as ``sharer_prefill``, the writing as ``sharer_decode``. ``on_message``
    receives the message so far, read as nearest tokens, after every vector."""
    timer = timer or StageTimer()
    weight, scale = _embedding_table(sender)
    tokenizer = sender.tokenizer
    stop_ids = stop_token_ids(tokenizer)
    stop_at_newline = not has_chat_template(tokenizer)
    state = KVState()
    with timer.stage("sharer_prefill"):
        next_token, _ = prefill(sender, state, prompt_ids)
    with timer.stage("sharer_decode"):
        return _write(sender, state, next_token, weight, scale, temperature, max_vectors, stop_ids, stop_at_newline,
                      on_message)


def _write(sender, state, next_token, weight, scale, temperature, max_vectors, stop_ids, stop_at_newline,
           on_message=None) -> Message:
    tokenizer = sender.tokenizer
    vectors, steps, likeliest, nearest = [], [], [], []
    for step in range(max_vectors):
        logits = next_token.logits[0]
        if temperature > 0:
            probabilities = torch.softmax(logits / temperature, dim=-1)
        else:
            probabilities = torch.nn.functional.one_hot(logits.argmax(), logits.shape[-1]).float()
        top = int(probabilities.argmax())
        if top in stop_ids:
            break
        reading = tokenizer.decode(likeliest + [top], skip_special_tokens=True)
        if stop_at_newline and "\n" in reading.lstrip():
            break
        vector = (probabilities.to(weight.dtype) @ weight) * scale
        near, cosine = nearest_token(sender, vector)
        positive = probabilities[probabilities > 0]
        steps.append({
            "step": step,
            "likeliest": tokenizer.decode([top]),
            "nearest": tokenizer.decode([near]),
            "top_probability": float(probabilities[top]),
            "entropy": float(-(positive * positive.log()).sum()),
            "cosine_nearest": cosine,
        })
        vectors.append(vector)
        likeliest.append(top)
        nearest.append(near)
        if on_message is not None:
            on_message(tokenizer.decode(nearest, skip_special_tokens=True).strip())
        if step + 1 < max_vectors:
            next_token = prefill_vectors(sender, state, vector[None])
    width = sender.facts.hidden_size
    stacked = torch.stack(vectors) if vectors else torch.zeros(0, width, dtype=weight.dtype)
    return Message(vectors=stacked, steps=steps, likeliest_ids=likeliest, nearest_ids=nearest)


# --- reading ----------------------------------------------------------------------------------


def receiver_pieces(receiver: LoadedModel, request: HandoffRequest) -> tuple[list[int], list[int], str, str]:
    """The receiver's prompt split around the message slot (where the text handoff puts the
    message): (ids before, ids after, text before, text after)."""
    before, after = split_at_context(receiver.tokenizer, request.query)
    return encode(receiver.tokenizer, before), encode(receiver.tokenizer, after), unmark(before), unmark(after)


@torch.no_grad()
def read_message(receiver: LoadedModel, request: HandoffRequest, vectors: torch.Tensor) -> tuple[ReceiverPrompt, list[float]]:
    """The receiver after reading its prompt with ``vectors`` in the message slot, and per layer the
    attention mass its tokens after the slot put on the message (mean over heads and tokens; the
    measure KVComm ranks layers by). With no vectors: the receiver alone's prompt, as for an empty
    text message, and no attention to report."""
    if vectors.shape[0] == 0:
        return read_prompt(receiver, build_segments(receiver.tokenizer, request.query).input_ids), []
    before, after, _, _ = receiver_pieces(receiver, request)
    device = receiver.device
    embedded_before = receiver.model.get_input_embeddings()(torch.tensor(before, device=device))
    state = KVState()
    prefill_vectors(receiver, state, torch.cat([embedded_before, vectors.to(device=device, dtype=receiver.dtype)]),
                    need_logits=False)
    # The tokens after the slot, with an attention plan of its own: every key before them is a
    # "prefix" at its real position, and the mass on keys [len(before), len(before) + vectors) is
    # recorded per layer (the plan's capture window).
    layers = range(receiver.facts.num_layers)
    keys_so_far = torch.arange(state.next_position, device=device)
    plan = AttentionPlan(prefix_positions={layer: keys_so_far for layer in layers}, capture=True, capture_skip=len(before))
    next_token, _ = prefill(receiver, state, after, plan=plan)
    prompt = ReceiverPrompt(model=receiver, state=state, next_token=next_token, last_token=after[-1])
    return prompt, [plan.captured_mass.get(layer, 0.0) for layer in layers]


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
