"""The paper's projector, one per receiver layer and per K / V (REFERENCE §1): ``[sharer ; receiver]``
-> a projection in the receiver's KV width and one weight per receiver KV head, built from
``Block``s (``x + Dropout(W2 · GELU(W1 · RMSNorm(x)))``); and the shape helpers and gate noise the
fuser (``kvviz.handoffs.c2c.fuser``) runs it with.
"""

from __future__ import annotations

import torch
from torch import nn

class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    """x + Dropout(W2 · GELU(W1 · RMSNorm(x))), bias-free; W1: width -> inner, W2: inner -> width."""

    def __init__(self, width: int, dropout: float, inner: int | None = None):
        super().__init__()
        inner = inner or width
        self.norm = RMSNorm(width)
        self.up = nn.Linear(width, inner, bias=False)
        self.down = nn.Linear(inner, width, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.dropout(self.down(nn.functional.gelu(self.up(self.norm(x)))))


class Projector(nn.Module):
    """One receiver layer's K (or V) path: [sharer ; receiver] -> (projection, head weights)."""

    def __init__(
        self, in_width: int, width: int, out_width: int, heads: int, dropout: float,
        inner: int | None = None, bias: bool = False, proj_blocks: int = 1,
    ):
        super().__init__()
        self.inp = nn.Linear(in_width, width, bias=bias)
        self.trunk = Block(width, dropout, inner)
        self.proj_block = Block(width, dropout, inner)
        if proj_blocks > 1:
            self.proj_extra = nn.ModuleList(Block(width, dropout, inner) for _ in range(proj_blocks - 1))
        self.proj_out = nn.Linear(width, out_width, bias=bias)
        self.weight_block = Block(width, dropout, width)
        self.weight_out = nn.Linear(width, heads, bias=bias)

    def forward(self, sharer: torch.Tensor, receiver: torch.Tensor):
        x = self.trunk(self.inp(torch.cat([sharer, receiver], dim=-1)))
        y = self.proj_block(x)
        for block in getattr(self, "proj_extra", ()):
            y = block(y)
        projection = self.proj_out(y)
        weights = torch.sigmoid(self.weight_out(self.weight_block(x)))
        return projection, weights


def flatten_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, H, T, D] -> [B, T, H*D]."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


def unflatten_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, T, H*D] -> [B, H, T, D]."""
    b, t, hd = x.shape
    return x.reshape(b, t, heads, hd // heads).transpose(1, 2)


def gumbel_noise(shape, device, dtype) -> torch.Tensor:
    """One Gumbel(0, 1) draw per element, as the reference's gate noise."""
    uniform = torch.rand(shape, device=device, dtype=dtype).clamp(1e-9, 1 - 1e-9)
    return -torch.log(-torch.log(uniform))
