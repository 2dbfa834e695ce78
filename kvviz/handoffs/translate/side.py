"""The gated side memory: the receiver reads the translated KV through a branch of its own beside each
layer's attention, instead of the translated keys joining its cache (the splice, ``prefix``).

In every receiver layer the branch asks the layer's own queries (its ``q_proj`` and ``q_norm``, rotated
at the query's position) to attend over the translated keys and values alone, in a softmax of their
own (the per-token weights enter as ``log w`` score biases), and adds ``gate * o_proj(output)`` to what
the layer's attention writes into the residual stream, per KV head (Draft-KV's gated cross-attention;
docs/C2C.md, "Translation"). The receiver's own prompt is the receiver alone's, untouched: the
translated context never displaces a key the receiver attends to, and with every gate at 0 the
receiver is the receiver alone, bit for bit (a test).

Positions: the translated token that sits at Skyline position ``s`` is rotated at ``s - N + A``
(``N``: Skyline's context segment, ``A``: the receiver alone's), so that every query sees each
translated key at the distance it has in Skyline's prompt.

The branch runs as forward hooks on the receiver's attention modules, armed only inside ``reading``
(one thread at a time). The batched decode step (``kvviz.runtime.step``) runs from the weights, not
the modules, and fires no hook: a side-memory answer is decoded through the model's own forward
(``greedy_answer``).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import torch

from kvviz.core.prompts import build_segments, stop_token_ids
from kvviz.handoffs.translate.align import TranslationAlignment, rotated
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import prefill
from kvviz.runtime.rope import apply_rotation

_lock = threading.Lock()  # hooks are armed on a shared model: one reading at a time


@dataclass
class SideMemory:
    """What each receiver layer's branch attends to: keys (rotated) and values [H_kv, T, D], the
    score bias of each translated token [T] (None: none), and the gate per KV head [H_kv]."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    bias: list[torch.Tensor | None]
    gates: torch.Tensor  # [L, H_kv], in [-1, 1]; 0 adds nothing

    @property
    def tokens(self) -> int:
        return int(self.keys[0].shape[1]) if self.keys else 0


def alone_ids(receiver) -> list[int]:
    """The receiver alone's tokens before its question (Gemma: ``<bos>``); the same for every question."""
    return build_segments(receiver.tokenizer, "?").context_ids


def positions(alignment: TranslationAlignment, alone: int) -> list[int]:
    """Where each translated token is rotated: Skyline's position moved by the difference of the two
    context segments, so that the question sees it at Skyline's distance."""
    shift = len(alignment.receiver_ids) - alone
    return [p - shift for p in range(alignment.own_count, len(alignment.receiver_ids))]


def side_memory(receiver, alignment: TranslationAlignment, keys, values, weights, gates: torch.Tensor) -> SideMemory:
    """The branch's memory from translated position-free ``keys`` / ``values`` [L, H, T, D], the
    per-token ``weights`` [L, T] (None: all 1) and ``gates`` [L, H_kv]."""
    at = positions(alignment, len(alone_ids(receiver)))
    rotated_keys = [rotated(receiver, keys[layer][None], layer, at)[0] for layer in range(len(keys))]
    bias = [None if weights is None else torch.log(weights[layer].clamp_min(1e-6)) for layer in range(len(keys))]
    return SideMemory(rotated_keys, [values[layer] for layer in range(len(keys))], bias, gates)


def alone_state(receiver) -> kv.KVState:
    """A fresh receiver-alone state (its tokens before the question, prefilled)."""
    state = kv.KVState()
    prefill(receiver, state, alone_ids(receiver), need_logits=False)
    return state


def _branch(module, layer: int, memory: SideMemory, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """gate * o_proj(attention of the layer's own queries over the memory), [B, T, hidden]."""
    batch, length, _ = hidden.shape
    query = module.q_proj(hidden).view(batch, length, -1, module.head_dim).transpose(1, 2)
    query = apply_rotation(module.q_norm(query), cos[:, None], sin[:, None])  # [B, Hq, T, D]
    keys, values = memory.keys[layer].to(query.dtype), memory.values[layer].to(query.dtype)
    groups = query.shape[1] // keys.shape[0]
    scores = torch.einsum("bhtd,hsd->bhts", query, keys.repeat_interleave(groups, dim=0)) * module.scaling
    softcap = getattr(module, "attn_logit_softcapping", None)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if memory.bias[layer] is not None:
        scores = scores + memory.bias[layer].to(scores.dtype)
    attended = torch.einsum("bhts,hsd->bhtd", torch.softmax(scores, dim=-1), values.repeat_interleave(groups, dim=0))
    gate = memory.gates[layer].to(attended.dtype).repeat_interleave(groups)
    attended = (attended * gate[None, :, None, None]).transpose(1, 2).reshape(batch, length, -1)
    return module.o_proj(attended)


def _hook(layer: int, memory: SideMemory):
    def add_branch(module, args, kwargs, output):
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        cos, sin = kwargs["position_embeddings"] if "position_embeddings" in kwargs else args[1]
        return (output[0] + _branch(module, layer, memory, hidden, cos, sin),) + tuple(output[1:])

    return add_branch


@contextlib.contextmanager
def reading(receiver, memory: SideMemory | None):
    """While inside, every forward of ``receiver``'s model reads ``memory`` through the gated branch
    (nothing when ``memory`` is None)."""
    if memory is None:
        yield
        return
    with _lock:
        layers = receiver.model.model.layers
        handles = [layers[i].self_attn.register_forward_hook(_hook(i, memory), with_kwargs=True) for i in range(len(layers))]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


@torch.no_grad()
def greedy_answer(receiver, state: kv.KVState, memory: SideMemory, query_ids: list[int], max_new_tokens: int) -> str:
    """The receiver's greedy answer after ``query_ids`` on ``state``, reading ``memory``: one forward
    per token through the model's own modules (the hooks fire), stopping as ``decode.generate`` does
    for a base model (end of sequence, or the end of the first line)."""
    tokenizer = receiver.tokenizer
    stops, token_ids, text = stop_token_ids(tokenizer), [], ""
    with reading(receiver, memory):
        next_token, _ = prefill(receiver, state, query_ids)
        while len(token_ids) < max_new_tokens:
            token = next_token.greedy_token()
            if token in stops:
                break
            token_ids.append(token)
            text = tokenizer.decode(token_ids, skip_special_tokens=True)
            if "\n" in text.lstrip():
                return text.lstrip().split("\n", 1)[0].strip()
            next_token, _ = prefill(receiver, state, [token])
    return text.strip()
