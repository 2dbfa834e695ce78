"""Rotary position embeddings, undone and redone with each model's own rotary module.

Keys sit in a KV cache after RoPE: rotated by their position. To move a key from one model (or
position) to another, undo the rotation at the position it had (``undo_rotation``) and apply it at
the position it gets (``apply_rotation``). The tables (``rotary_tables``, ``RopeTables``) come
from the model's own rotary module rather than being recomputed, so rope scaling and Gemma 3's
per-layer-type theta hold. Used by the C2C fuser (``rope="aware"``) and the oracle study.
"""

from __future__ import annotations

import inspect

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in the rotate_half convention: x·cos + rotate_half(x)·sin (cos, sin broadcast)."""
    return x * cos + rotate_half(x) * sin


def undo_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The inverse of ``apply_rotation`` (also when the tables carry an attention scaling)."""
    return (x * cos - rotate_half(x) * sin) / (cos * cos + sin * sin)


def _layer_types(loaded) -> list[str]:
    return list(loaded.facts.layer_types)


class RopeTables:
    """cos / sin of each model's own rotary module at the fused tokens' positions, per layer type.

    Shaped [1, 1, T, D] (broadcast over batch and heads), float32. Taken from the model's rotary
    module rather than recomputed, so rope scaling and Gemma 3's per-layer-type theta hold.
    """

    def __init__(self, receiver, sharer, receiver_positions: list[int], sharer_positions: list[int]):
        self._models = {"receiver": receiver, "sharer": sharer}
        self._positions = {"receiver": receiver_positions, "sharer": sharer_positions}
        self._tables: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def _get(self, role: str, layer: int):
        loaded = self._models[role]
        layer_type = _layer_types(loaded)[layer] if loaded is not None else "full_attention"
        key = (role, layer_type)
        if key not in self._tables:
            self._tables[key] = rotary_tables(loaded, self._positions[role], layer_type)
        return self._tables[key]

    def receiver(self, layer: int):
        return self._get("receiver", layer)

    def sharer(self, layer: int):
        return self._get("sharer", layer)


def rotary_tables(loaded, positions: list[int], layer_type: str = "full_attention"):
    """(cos, sin) [1, 1, T, D] from the model's rotary module at ``positions``."""
    decoder = loaded.model.model
    rotary = decoder.rotary_emb
    device = loaded.device
    ids = torch.as_tensor(positions, dtype=torch.long, device=device)[None]
    probe = torch.zeros(1, dtype=torch.float32, device=device)
    with torch.no_grad():
        if "layer_type" in inspect.signature(rotary.forward).parameters:
            cos, sin = rotary(probe, ids, layer_type=layer_type)
        else:
            cos, sin = rotary(probe, ids)
    return cos.float()[:, None], sin.float()[:, None]
