"""Which sharer token each receiver token reads, and the two models' KV at those tokens, position-free.

Both models tokenise the same string ``Context: <context>\\n\\n``; each receiver token reads the
sharer token that holds its last character (both tokenizers' offsets), plus optionally the sharer
token before that one (``neighbours``) and three numbers saying how the receiver token sits inside
the sharer token (the tokenizers split words differently).

Keys: the sharer's keys are un-rotated at their own positions (its rotary module); a translator
predicts position-free receiver keys (Gemma 3's after k-norm), which are rotated at the receiver's
positions with the receiver's own rotary module (per layer type: Gemma 3's sliding and full layers
use different theta). ``features`` are what a translator reads, ``targets`` what it predicts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.core.prompts import encode_with_offsets, render, unmark
from kvviz.runtime import cache as kv
from kvviz.runtime.rope import apply_rotation, rotary_tables, undo_rotation

OWN_PREFIX = "Context:"  # the receiver's own, context-free tokens in front of the translated ones
ALIGNMENT_FEATURES = 3  # is the last receiver piece of its sharer token, 1 / pieces, (rank + 1) / pieces


def sharer_start_token(tokenizer) -> str:
    """The token the sharer reads plain text after: SmolLM2's ``<|endoftext|>`` (its declared BOS,
    ``<|im_start|>``, opens a chat role; REFERENCE §6), else the tokenizer's BOS, else nothing."""
    vocab = tokenizer.get_vocab()
    if "<|endoftext|>" in vocab:
        return "<|endoftext|>"
    return tokenizer.bos_token or ""


# --- alignment ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TranslationAlignment:
    """Which sharer token each translated receiver token reads.

    ``receiver_ids``: the receiver's context segment (Skyline's: ``<bos>Context: C\\n\\n``), of
    which the first ``own_count`` tokens are the receiver's own (context-free) and the rest are
    translated. ``sharer_ids``: what the sharer reads (its start token, then the same text).
    ``sharer_index[i]``: the sharer token holding the last character of translated token i;
    ``pieces[i]``: (its rank among the receiver tokens reading that sharer token, how many do).
    """

    receiver_ids: list[int]
    own_count: int
    sharer_ids: list[int]
    sharer_index: list[int]
    pieces: list[tuple[int, int]]

    @property
    def translated_count(self) -> int:
        return len(self.receiver_ids) - self.own_count


def align_context(receiver_tokenizer, sharer_tokenizer, context: str, sharer_start: str | None = None) -> TranslationAlignment:
    """Align the receiver's context segment with the sharer's reading of the same text."""
    if not context or not context.strip():
        raise ValueError("a translation needs a context")
    head, _ = render(receiver_tokenizer, "?", context)  # the head does not depend on the question
    receiver_ids, receiver_offsets = encode_with_offsets(receiver_tokenizer, head)
    head_text = unmark(head)
    start = head_text.find(OWN_PREFIX)
    if start < 0:
        raise ValueError(f"the receiver's prompt layout has no {OWN_PREFIX!r} segment to translate after")
    sharer_start = sharer_start_token(sharer_tokenizer) if sharer_start is None else sharer_start
    marked_body = head[head.find(OWN_PREFIX):]  # the marks keep the user's words plain text
    sharer_ids, sharer_offsets = encode_with_offsets(sharer_tokenizer, sharer_start + marked_body)
    own_end = start + len(OWN_PREFIX)
    own_count = sum(1 for _, end in receiver_offsets if end <= own_end)
    shift = start - len(sharer_start)  # receiver head character -> sharer text character
    sharer_index = []
    for begin, end in receiver_offsets[own_count:]:
        last = max(end, begin + 1) - 1 - shift
        chosen = 0
        for j, (s_begin, s_end) in enumerate(sharer_offsets):
            if s_end <= s_begin:
                continue
            if s_begin <= last:
                chosen = j
            if s_begin <= last < s_end:
                break
        sharer_index.append(chosen)
    pieces = []
    for i, index in enumerate(sharer_index):
        group = [k for k, other in enumerate(sharer_index) if other == index]
        pieces.append((group.index(i), len(group)))
    return TranslationAlignment(receiver_ids, own_count, sharer_ids, sharer_index, pieces)


# --- the models' KV, position-free ------------------------------------------------------------


def layer_type(loaded, layer: int) -> str:
    types = getattr(loaded.facts, "layer_types", None) or ()
    return types[layer] if layer < len(types) else "full_attention"


def unrotated(loaded, keys: torch.Tensor, layer: int, positions: list[int]) -> torch.Tensor:
    """Keys [B, H, T, D] as cached (after RoPE at ``positions``) -> position-free keys."""
    cos, sin = rotary_tables(loaded, positions, layer_type(loaded, layer))
    return undo_rotation(keys.float(), cos.to(keys.device), sin.to(keys.device))


def rotated(loaded, keys: torch.Tensor, layer: int, positions: list[int]) -> torch.Tensor:
    """Position-free keys [B, H, T, D] rotated at ``positions`` with the model's own rotary module."""
    cos, sin = rotary_tables(loaded, positions, layer_type(loaded, layer))
    return apply_rotation(keys, cos.to(keys.device, keys.dtype), sin.to(keys.device, keys.dtype))


@torch.no_grad()
def read_kv(loaded, batch_ids: list[list[int]], pad_id: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One decoder pass over right-padded sequences from position 0 (causal: padding at the end
    changes nothing before it). Returns per layer (position-free keys, values), [B, H, T, D] float32."""
    length = max(len(ids) for ids in batch_ids)
    input_ids = torch.full((len(batch_ids), length), pad_id, dtype=torch.long)
    for row, ids in enumerate(batch_ids):
        input_ids[row, : len(ids)] = torch.tensor(ids)
    state = kv.KVState()
    loaded.model.model(input_ids=input_ids.to(loaded.device), cache=state.cache, use_cache=True,
                       position_ids=state.positions(length, loaded.device).expand(len(batch_ids), -1))
    positions = list(range(length))
    return [
        (unrotated(loaded, keys, layer, positions), values.float())
        for layer, (keys, values) in enumerate(kv.layer_kv(state.cache, i) for i in range(kv.num_layers(state.cache)))
    ]


def feature_width(sharer_facts, sharer_layers, neighbours: int) -> int:
    per_token = len(sharer_layers) * 2 * sharer_facts["num_kv_heads"] * sharer_facts["head_dim"]
    return per_token * (1 + neighbours) + ALIGNMENT_FEATURES


def features(sharer_kv: list[tuple[torch.Tensor, torch.Tensor]], alignment: TranslationAlignment, sharer_layers,
             neighbours: int = 0, row: int = 0) -> torch.Tensor:
    """[translated tokens, F]: for each translated receiver token, the sharer's position-free keys
    and values at the aligned token (and at the ``neighbours`` tokens before it) in
    ``sharer_layers``, then the three alignment numbers. ``row``: the batch row of ``sharer_kv``."""
    index = torch.tensor(alignment.sharer_index, dtype=torch.long)
    parts = []
    for offset in range(neighbours + 1):
        at = (index - offset).clamp(min=0)
        for layer in sharer_layers:
            keys, values = sharer_kv[layer]
            for tensor in (keys, values):
                picked = tensor[row].index_select(1, at.to(tensor.device))  # [H, T, D]
                parts.append(picked.transpose(0, 1).reshape(len(alignment.sharer_index), -1).float().cpu())
    pieces = torch.tensor([[float(r == n - 1), 1.0 / n, (r + 1) / n] for r, n in alignment.pieces], dtype=torch.float32)
    parts.append(pieces.reshape(len(alignment.sharer_index), ALIGNMENT_FEATURES))
    return torch.cat(parts, dim=1)


def targets(receiver_kv: list[tuple[torch.Tensor, torch.Tensor]], alignment: TranslationAlignment, row: int = 0) -> torch.Tensor:
    """[translated tokens, O]: the receiver's own position-free keys and values at the translated
    tokens, every layer, (K, V) per layer with heads flattened (what the map predicts)."""
    positions = torch.arange(alignment.own_count, len(alignment.receiver_ids))
    parts = []
    for keys, values in receiver_kv:
        for tensor in (keys, values):
            picked = tensor[row].index_select(1, positions.to(tensor.device))
            parts.append(picked.transpose(0, 1).reshape(positions.numel(), -1).float().cpu())
    return torch.cat(parts, dim=1)
