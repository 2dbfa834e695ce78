"""CIPHER's message: the sharer writes, at each step, the expectation of its token embeddings under its
next-token distribution (fed back to itself as its next input), and the receiver reads the vectors
where it would read the message's words; each vector's nearest token, for people."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from kvviz.core.prompts import build_segments, encode, has_chat_template, split_at_context, stop_token_ids, unmark
from kvviz.core.results import HandoffRequest
from kvviz.handoffs.common import TokenCallback, read_prompt
from kvviz.handoffs.registry import ReceiverPrompt
from kvviz.runtime.attention import AttentionPlan
from kvviz.runtime.cache import KVState
from kvviz.runtime.decode import prefill, prefill_vectors
from kvviz.runtime.measure import StageTimer
from kvviz.runtime.models import LoadedModel


@dataclass
class Message:
    vectors: torch.Tensor  # [steps, width]: what is sent
    steps: list[dict]  # per vector: its readings and how sure the sharer was
    likeliest_ids: list[int]  # the most likely token at each step
    nearest_ids: list[int]  # the token whose embedding is nearest to each vector


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
