"""The one attention function every kvviz model runs with.

Normal runs (one model, one contiguous cache) use transformers' own SDPA path with the mask the
model built, so results equal the stock implementation.

Cache handoffs break an assumption of that path: after KVComm, layer 3 may hold the sender's 40
context keys while layer 4 holds only the 1-token attention sink, yet the receiver's query tokens
sit at positions 40, 41, ... in every layer. transformers builds one mask from layer 0's length,
which gives a wrong causal alignment in the shorter layers (the KVComm reference code's quirk).
A handoff therefore passes an ``AttentionPlan`` (keyword ``kvviz_plan``) naming, per layer, the
positions of the foreign prefix keys; this function then builds the mask from real positions:
a key is visible when its position is <= the query's position (and inside the sliding window for
sliding layers). The plan can also capture attention mass on the prefix, which KVComm's layer
selection needs (TransformerLens style: one capture mechanism, a stable name per value).

``AttentionRows`` is the same mechanism per answer token (what crossed, ``kvviz.runtime.crossed``): a forward
given one (keyword ``kvviz_rows``) records, for its last query token, every head's attention
probabilities over every key of every layer, by the keys' real positions. The decode step
(``kvviz.runtime.step``) honours the same object on a sequence's ``KVState.token_rows``. Recording never
changes the attention output: the probabilities are computed beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

ATTENTION_NAME = "kvviz"
_registered = False


@dataclass
class AttentionPlan:
    """Per-layer facts the mask needs when layers hold different numbers of prefix keys.

    prefix_positions[l]: positions of the keys at the front of layer l's cache that came from
    another model (or another run). Keys after them are the receiver's own, contiguous, ending at
    the current query position. Layers not listed hold only contiguous own keys.
    """

    prefix_positions: dict[int, torch.Tensor] = field(default_factory=dict)
    # When set, record per layer the attention mass that the query tokens put on prefix keys,
    # skipping the first `capture_skip` prefix keys (the attention sink).
    capture: bool = False
    capture_skip: int = 1
    captured_mass: dict[int, float] = field(default_factory=dict)
    # Reproduce the KVComm reference code's mask (off by default): transformers builds one mask for
    # the longest layer and crops it to each layer's length, which treats key i as if it sat at
    # position i. In a layer holding only the sink, every query token then sees every other query
    # token during a prefill (bidirectional); layers holding the whole context are unaffected. In a
    # sliding-window layer it also measures the window from key indices, so a context longer than
    # the window leaves some query with no key at all (an error here).
    reference_mask: bool = False
    # Additive attention-score bias per layer for its prefix keys ([n_prefix] tensor, log-weights:
    # 0 takes a key as it is, a large negative number hides it). A KV translator's per-token
    # weight and soft per-layer gate (kvviz.handoffs.translate.translator) enter the receiver's attention here.
    prefix_bias: dict[int, torch.Tensor] = field(default_factory=dict)
    # When set, keep each layer's queries (after RoPE, detached): a translator's training compares
    # attention over translated keys with attention over the receiver's own, for the same queries.
    keep_queries: bool = False
    queries: dict[int, torch.Tensor] = field(default_factory=dict)

    def key_bias(self, layer: int, key_length: int, device, dtype) -> torch.Tensor | None:
        """[key_length] additive bias for every key of the layer (0 on its own keys), or None."""
        bias = self.prefix_bias.get(layer)
        if bias is None:
            return None
        own = key_length - bias.numel()
        return torch.cat([bias.to(device=device, dtype=dtype), torch.zeros(own, device=device, dtype=dtype)])

    def sees_every_key(self, layer: int, key_length: int, query_position: int, sliding_window: int | None) -> bool:
        """Whether one query at ``query_position`` may attend to every key of the layer: true on
        a decode step unless the oldest key has left the sliding window."""
        if not sliding_window:
            return True
        prefix = self.prefix_positions.get(layer)
        own_count = key_length - (0 if prefix is None else prefix.numel())
        oldest = query_position - own_count + 1
        if prefix is not None and prefix.numel():
            oldest = min(oldest, int(prefix.min()))
        return query_position - oldest < sliding_window

    def key_positions(self, layer: int, key_length: int, last_query_position: int, device) -> torch.Tensor:
        if self.reference_mask:
            return torch.arange(key_length, device=device)
        prefix = self.prefix_positions.get(layer)
        prefix_length = 0 if prefix is None else prefix.numel()
        own_count = key_length - prefix_length
        if own_count < 0:
            raise ValueError(f"layer {layer}: {key_length} keys but {prefix_length} prefix positions")
        own = torch.arange(last_query_position - own_count + 1, last_query_position + 1, device=device)
        if prefix is None:
            return own
        return torch.cat([prefix.to(device), own])


class AttentionRows:
    """Attention rows of some query tokens, one row per token: for each layer, the probabilities
    [heads, keys] (float32, on the CPU) and the keys' positions [keys]. ``limit`` bounds the rows
    kept (later tokens are not recorded)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.rows: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = []
        self._current: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def full(self) -> bool:
        return len(self.rows) >= self.limit

    def record(self, layer: int, probabilities: torch.Tensor, key_positions: torch.Tensor) -> None:
        if not self.full:  # kept on its device until the token is done (one wait for a GPU per token)
            self._current[layer] = (probabilities.detach().float(), key_positions.detach())

    def commit(self) -> None:
        """The current token's layers are all recorded: they become one row (on the CPU)."""
        if self._current and not self.full:
            self.rows.append({layer: (p.cpu(), k.cpu()) for layer, (p, k) in self._current.items()})
        self._current = {}


def query_probabilities(query: torch.Tensor, keys: torch.Tensor, scaling: float, visible: torch.Tensor | None,
                        softcap: float | None = None) -> torch.Tensor:
    """One query's attention probabilities: query [heads, dim], keys [kv_heads, keys, dim] (grouped
    heads share their KV head), visible [keys] bool or None -> [heads, keys] float32."""
    groups = query.shape[0] // keys.shape[0]
    scores = torch.einsum("hd,hkd->hk", query.float(), keys.float().repeat_interleave(groups, dim=0)) * scaling
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if visible is not None:
        scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.softmax(scores, dim=-1)


def positional_mask(query_positions, key_positions, sliding_window=None) -> torch.Tensor:
    """Boolean [1, 1, q, k] mask: True where the query may attend to the key."""
    difference = query_positions[:, None] - key_positions[None, :]
    allowed = difference >= 0
    if sliding_window:
        allowed &= difference < sliding_window
    return allowed[None, None]


def kvviz_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    rows: AttentionRows | None = kwargs.pop("kvviz_rows", None)
    if rows is not None:
        output = _attention(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        _record_last_row(module, query, key, scaling, rows, **kwargs)
        return output
    return _attention(module, query, key, value, attention_mask, dropout, scaling, **kwargs)


def _record_last_row(module, query, key, scaling, rows: AttentionRows, **kwargs) -> None:
    """Record the last query token's attention probabilities at this layer (its keys by position)."""
    plan: AttentionPlan = kwargs.get("kvviz_plan") or AttentionPlan()
    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        raise ValueError("Recording attention rows needs explicit position_ids on every forward call.")
    last_position = int(position_ids[0, -1])
    key_positions = plan.key_positions(module.layer_idx, key.shape[2], last_position, key.device)
    visible = positional_mask(position_ids[0, -1:].to(key.device), key_positions, kwargs.get("sliding_window"))[0, 0, 0]
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    probabilities = query_probabilities(query[0, :, -1], key[0], scaling, visible, kwargs.get("softcap"))
    rows.record(module.layer_idx, probabilities, key_positions)


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plan: AttentionPlan | None = kwargs.pop("kvviz_plan", None)
    if plan is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)

    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        raise ValueError("A kvviz attention plan needs explicit position_ids on every forward call.")
    query_positions = position_ids[0].to(query.device)
    layer = module.layer_idx
    if plan.keep_queries:
        plan.queries[layer] = query.detach()
    last_position = int(query_positions[-1])
    sliding_window = kwargs.pop("sliding_window", None)
    bias = plan.key_bias(layer, key.shape[2], query.device, query.dtype)
    if (
        query.shape[2] == 1 and not plan.capture and bias is None
        and plan.sees_every_key(layer, key.shape[2], last_position, sliding_window)
    ):
        # a decode step whose token may see its whole cache: no mask to build
        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
    key_positions = plan.key_positions(layer, key.shape[2], last_position, query.device)
    mask = positional_mask(query_positions, key_positions, sliding_window)
    if plan.reference_mask and not bool(mask.any(-1).all()):
        raise ValueError(
            f"The reference-code mask hides every key from a query in layer {layer}: the context is longer than "
            "this sliding-window layer's window, where the reference code's quirk is undefined. Use the causal mask."
        )
    if plan.capture:
        return _eager_with_capture(module, query, key, value, mask, scaling, plan, kwargs.get("softcap"), bias)
    if bias is not None:  # an additive float mask: the bias where a key is visible
        mask = torch.where(mask, bias, torch.finfo(query.dtype).min)
    return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling, **kwargs)


def _eager_with_capture(module, query, key, value, mask, scaling, plan: AttentionPlan, softcap=None, bias=None):
    """Plain attention that also records the mass the queries put on the prefix keys."""
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probabilities = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    prefix = plan.prefix_positions.get(module.layer_idx)
    if prefix is not None:
        start, end = min(plan.capture_skip, prefix.numel()), prefix.numel()
        # mean over batch, heads and query tokens of the mass on the (non-sink) prefix keys
        plan.captured_mass[module.layer_idx] = float(probabilities[..., start:end].sum(-1).mean())
    output = torch.matmul(probabilities, value).transpose(1, 2).contiguous()
    return output, probabilities


def register() -> None:
    """Register the kvviz attention (and its mask builder) with transformers, once."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, kvviz_attention)
    # Without a mask function under the same name the model passes no mask at all (REFERENCE §3).
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    _registered = True
