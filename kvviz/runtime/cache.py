"""KV-cache operations: the one place that knows the transformers 5 cache layout.

A cache holds, per layer, keys and values of shape [batch, kv_heads, tokens, head_dim]
(``cache.layers[i].keys`` / ``.values``; keys are stored after RoPE). Handoffs never touch those
tensors directly: they copy, select, splice and measure caches through this module, and carry a
``KVState`` that remembers which keys came from elsewhere, at which positions, so that the
attention mask and the next token's position stay right when layers differ in length.

The layers of kvviz's caches keep spare room (``GrowingLayer``): a decode token is written into
place instead of copying the whole layer, as transformers' ``DynamicLayer`` does with ``torch.cat``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from kvviz.runtime.attention import AttentionPlan, AttentionRows


class GrowingLayer(DynamicLayer):
    """A cache layer whose keys and values live in a buffer with spare room along the token axis
    (grown by doubling): appending writes into the buffer, and ``keys`` / ``values`` are views of
    its filled part. Code that assigns ``keys`` / ``values`` itself (``place``, moving a layer to
    another device) is noticed at the next append, which then starts a new buffer from them."""

    SPARE = 32  # token slots beyond the first ones when a buffer is made

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self._buffer: torch.Tensor | None = None  # [2, batch, kv_heads, capacity, head_dim]

    def _holds_buffer(self) -> bool:
        buffer = self._buffer
        return (
            buffer is not None
            and self.keys.device == buffer.device
            and self.keys.data_ptr() == buffer[0].data_ptr()
            and self.keys.shape[:2] == buffer.shape[1:3]
        )

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        if not self._holds_buffer() or end > self._buffer.shape[3]:
            batch, heads, _, dim = key_states.shape
            buffer = key_states.new_empty(2, batch, heads, max(2 * end, end + self.SPARE), dim)
            if length:
                buffer[0, :, :, :length] = self.keys
                buffer[1, :, :, :length] = self.values
            self._buffer = buffer
        self._buffer[0, :, :, length:end] = key_states
        self._buffer[1, :, :, length:end] = value_states
        self.keys, self.values = self._buffer[0, :, :, :end], self._buffer[1, :, :, :end]
        return self.keys, self.values


def new_cache() -> DynamicCache:
    """An empty cache with plain (non-sliding) layers, each a ``GrowingLayer``.

    Sliding-window models get their window from the attention mask instead of from cache
    truncation, so that every layer keeps every key and positions stay explicit.
    """
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    return cache


def append_token(cache: DynamicCache, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Append one sequence's new keys and values [1, kv_heads, tokens, head_dim] to ``layer``;
    returns the layer's keys and values so far (views)."""
    return cache.update(keys, values, layer)


def num_layers(cache: DynamicCache) -> int:
    return len(cache.layers)


def layer_kv(cache: DynamicCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    entry = cache.layers[layer]
    return entry.keys, entry.values


def layer_length(cache: DynamicCache, layer: int) -> int:
    keys = cache.layers[layer].keys
    return 0 if keys is None or keys.numel() == 0 else keys.shape[-2]


def from_tensors(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """Build a cache from (keys, values) per layer."""
    cache = new_cache()
    for index, (keys, values) in enumerate(layers):
        cache.update(keys, values, index)
    return cache


def copy_cache(cache: DynamicCache) -> DynamicCache:
    """A deep copy: generation appends to the cache it is given, so every run gets its own."""
    return from_tensors([(k.clone(), v.clone()) for k, v in (layer_kv(cache, i) for i in range(num_layers(cache)))])


def slice_tokens(cache: DynamicCache, start: int, end: int | None = None) -> DynamicCache:
    """Keep tokens [start:end] of every layer."""
    return from_tensors(
        [(k[..., start:end, :].clone(), v[..., start:end, :].clone()) for k, v in (layer_kv(cache, i) for i in range(num_layers(cache)))]
    )


def place(cache: DynamicCache, devices: list[torch.device]) -> None:
    """Move each layer's keys and values to the device of the layer that reads them (in place).

    A model spread over several GPUs (``--device auto``) keeps each layer's cache on that layer's
    device; KV spliced in from another model, or fused by a C2C fuser, arrives on wherever it was
    made. ``kvviz.runtime.decode`` calls this before every forward, so every handoff's cache follows its
    receiving layers; layers already in place are not touched (on one device this moves nothing).
    """
    for index, device in enumerate(devices[: num_layers(cache)]):
        entry = cache.layers[index]
        if entry.keys is None or entry.keys.device == device:
            continue
        entry.keys, entry.values = entry.keys.to(device), entry.values.to(device)
        entry.device = device


def kv_bytes(cache: DynamicCache, layers: list[int] | None = None) -> int:
    """Bytes of keys and values held in the given layers (all layers by default)."""
    chosen = range(num_layers(cache)) if layers is None else layers
    total = 0
    for index in chosen:
        keys, values = layer_kv(cache, index)
        total += keys.numel() * keys.element_size() + values.numel() * values.element_size()
    return total


@dataclass
class KVState:
    """A cache plus what the receiver must know to keep attending correctly.

    ``prefix_positions`` marks, per layer, keys at the front of the cache that came from another
    model and the positions they stand for. ``next_position`` is the position of the next token
    the receiver will feed: after a spliced context of |C| tokens it is |C| + own tokens so far,
    whatever each layer's length is.
    """

    cache: DynamicCache = field(default_factory=new_cache)
    next_position: int = 0
    prefix_positions: dict[int, torch.Tensor] = field(default_factory=dict)
    reference_mask: bool = False  # KVComm's reference-code mask quirk (AttentionPlan.reference_mask)
    prefix_bias: dict[int, torch.Tensor] = field(default_factory=dict)  # AttentionPlan.prefix_bias
    # When set, every forward on this state (a decode step too) records its last token's attention
    # rows here (kvviz.runtime.attention.AttentionRows): the per-sequence flag the batched step honours.
    token_rows: AttentionRows | None = field(default=None, repr=False)

    def plan(self, capture: bool = False) -> AttentionPlan | None:
        """The attention plan for the next forward; None when layers are plain and contiguous."""
        if not self.prefix_positions and not capture:
            return None
        return AttentionPlan(
            prefix_positions=self.prefix_positions, capture=capture, reference_mask=self.reference_mask,
            prefix_bias=self.prefix_bias,
        )

    def positions(self, count: int, device) -> torch.Tensor:
        return torch.arange(self.next_position, self.next_position + count, device=device)[None]

    def copy(self) -> "KVState":
        """The same state with its own cache (what a forward appends to the copy leaves this one
        as it was); no recorded rows."""
        return KVState(cache=copy_cache(self.cache), next_position=self.next_position,
                       prefix_positions=self.prefix_positions, reference_mask=self.reference_mask,
                       prefix_bias=self.prefix_bias)


def splice_prefix(sender_cache: DynamicCache, num_receiver_layers: int, selected: set[int], sink_tokens: int = 1) -> KVState:
    """KVComm's handoff: the receiver's starting state built from the sender's context cache.

    Selected layers get every context key; the others keep only the first ``sink_tokens`` keys
    (the attention sink). Positions of the receiver's own tokens continue after the whole context
    in every layer, as in the paper.
    """
    if num_layers(sender_cache) != num_receiver_layers:
        raise ValueError(
            f"sender cache has {num_layers(sender_cache)} layers, receiver has {num_receiver_layers}"
        )
    context_length = layer_length(sender_cache, 0)
    layers, prefix_positions = [], {}
    for index in range(num_receiver_layers):
        keys, values = layer_kv(sender_cache, index)
        keep = context_length if index in selected else min(sink_tokens, context_length)
        layers.append((keys[..., :keep, :].clone(), values[..., :keep, :].clone()))
        prefix_positions[index] = torch.arange(keep, device=keys.device)
    return KVState(cache=from_tensors(layers), next_position=context_length, prefix_positions=prefix_positions)


def state_from_prefill(cache: DynamicCache, length: int) -> KVState:
    """The state after an ordinary prefill of ``length`` tokens (all layers contiguous)."""
    return KVState(cache=cache, next_position=length)
