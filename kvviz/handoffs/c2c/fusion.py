"""The one C2C fusion pipeline: what the handoff, the trainer and the evaluator all run.

For one aligned prompt (``kvviz.handoffs.c2c.align.TokenAlignment``):

1. the sharer prefills its prompt (template prefix, any private context, one token per receiver
   message token) - skipped for a control fuser, whose sharer input is zeros;
2. the receiver prefills its prompt except the last token;
3. the fuser rewrites the receiver's KV at the message tokens in every layer
   (``K' = K_r + g·w·K_proj``), with the rotary tables of both models when it projects
   position-free keys (``rope="aware"``).

The receiver then runs its last prompt token on the fused state (``FusedState.state``): the
handoff decodes from there, the trainer and the evaluator score a response.

``sharer`` chooses what the fuser reads: ``"right"`` (the sharer's cache for this prompt),
``"zero"`` (the sharer's KV replaced by zeros, as the control reads it) or a ``SharerKV`` prepared
elsewhere (another example's context: the communication measure's control).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from kvviz.runtime import cache as kv
from kvviz.runtime.decode import SharedPrompts, prefill, read_prompt_once
from kvviz.runtime.rope import RopeTables


@dataclass
class SharerKV:
    """The sharer's cache layers and which of its tokens line up with the fused receiver tokens."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    positions: list[int]  # indices into the cache
    rope_positions: list[int]  # the positions those tokens had (for the rotary tables)
    seconds: float = 0.0


@dataclass
class FusedState:
    state: kv.KVState  # the receiver, ready for its last prompt token
    records: list  # LayerRecord per receiver layer
    bytes_read: int  # bytes of sharer KV the fuser read
    fusion_seconds: float


def sharer_kv(pair, alignment, grad: bool = False) -> SharerKV:
    """Prefill the sharer on the aligned prompt (no gradients: the sharer is frozen)."""
    started = time.perf_counter()
    state = kv.KVState(next_position=alignment.sharer_start_position)
    with torch.no_grad() if not grad else nullcontext():
        prefill(pair.sharer, state, alignment.sharer_ids, need_logits=False)
    layers = [kv.layer_kv(state.cache, i) for i in range(kv.num_layers(state.cache))]
    positions = list(alignment.sharer_positions)
    return SharerKV(
        layers=layers,
        positions=positions,
        rope_positions=[p + alignment.sharer_start_position for p in positions],
        seconds=time.perf_counter() - started,
    )


def resampled(source: SharerKV, count: int) -> SharerKV:
    """Another example's sharer KV stretched or cut to ``count`` fused tokens (evenly spaced)."""
    if not source.positions:
        raise ValueError("the other example has no fused tokens")
    picks = [round(i * (len(source.positions) - 1) / max(count - 1, 1)) for i in range(count)]
    return SharerKV(
        layers=source.layers,
        positions=[source.positions[i] for i in picks],
        rope_positions=[source.rope_positions[i] for i in picks],
    )


def bytes_read(sharer: SharerKV, layer_map: list[int]) -> int:
    """Bytes of the sharer KV the fuser reads: the mapped layers at the fused tokens."""
    total = 0
    for layer in sorted({s for s in layer_map if s >= 0}):
        keys, values = sharer.layers[layer]
        per_token = keys[..., :1, :].numel() * keys.element_size() + values[..., :1, :].numel() * values.element_size()
        total += per_token * len(sharer.positions)
    return total


def receiver_prefix(pair, alignment, timer=None, prompts: SharedPrompts | None = None) -> kv.KVState:
    """The receiver's state after its prompt minus the last token (no gradients; read once per run
    with ``prompts``, the run's: C2C and its control read the same prompt; timed as the receiver's
    prefill on ``timer``)."""
    head = alignment.receiver_ids[:-1]
    if not head:
        return kv.KVState()
    return read_prompt_once(pair.receiver, head, timer, "receiver_prefill" if timer is not None else None, prompts).state


def fuse_prompt(pair, fuser, alignment, sharer="right", hard: bool | None = None, timer=None,
                prompts: SharedPrompts | None = None) -> FusedState:
    """The whole pipeline for one prompt. ``fuser``: a C2CFuser (or a DDP wrapper around one).

    Gradients flow into the fuser when called outside ``torch.no_grad`` (training); the frozen
    models run without them. ``timer``: a ``kvviz.runtime.measure.StageTimer`` for the handoff's stages;
    ``prompts``: the run's prompts read once (C2C and its control read the same receiver prompt).
    """
    core = getattr(fuser, "module", fuser)
    stage = timer.stage if timer is not None else (lambda name: nullcontext())
    shared = None
    if not core.config.control and sharer != "zero":
        if isinstance(sharer, SharerKV):
            shared = sharer
        else:
            with stage("sharer_prefill"):
                shared = sharer_kv(pair, alignment)
    state = receiver_prefix(pair, alignment, timer, prompts)
    started = time.perf_counter()
    head = alignment.receiver_ids[:-1]
    with stage("transfer"):
        if head and alignment.num_fused:
            receiver_layers = [kv.layer_kv(state.cache, i) for i in range(kv.num_layers(state.cache))]
            sharer_positions = shared.positions if shared is not None else alignment.sharer_positions
            rope_s = shared.rope_positions if shared is not None else [
                p + alignment.sharer_start_position for p in alignment.sharer_positions
            ]
            rope = None
            if core.config.rope == "aware":
                rope = RopeTables(pair.receiver, pair.sharer, list(alignment.receiver_positions), rope_s)
            fused, records = fuser(
                receiver_layers,
                shared.layers if shared is not None else None,
                alignment.receiver_positions,
                sharer_positions,
                hard,
                rope,
            )
            state = kv.KVState(cache=kv.from_tensors(fused), next_position=state.next_position)
        else:
            facts = pair.receiver.facts
            empty = [(torch.zeros(1, facts.num_kv_heads, 0, facts.head_dim),) * 2] * facts.num_layers
            _, records = core.fuse(empty, None, [], [], hard=True)
    seconds = time.perf_counter() - started
    sent = bytes_read(shared, core.config.layer_map) if shared is not None and alignment.num_fused else 0
    return FusedState(state=state, records=records, bytes_read=sent, fusion_seconds=seconds)
