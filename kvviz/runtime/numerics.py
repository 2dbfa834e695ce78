"""The numerics of the decoder stack: how its matrix products are computed on this machine (issue 42).

A *numeric mode* is chosen once per process, when a model loads (``kvviz.runtime.models.load_model``),
from ``KVVIZ_NUMERICS`` (``kvviz.core.policy.numerics_setting``) and what the CPU has:

* ``fp32``: the weights as loaded; prompt passes through the transformers forward (MKL), decode steps
  through the weights packed once for oneDNN (``kvviz.runtime.step``). Everywhere; what ``auto`` gives
  on a CPU without native bfloat16.
* ``bf16``: every linear layer of the decoder stack keeps its weights in bfloat16, packed once for
  oneDNN (``PackedLinear``); a product rounds its input rows to bfloat16, accumulates in fp32 and
  gives its output back in fp32. Everything between the products stays fp32: the embedding, the norms,
  rotary, attention, the KV cache (so every byte count kvviz reports is unchanged), the residual
  stream, and the output head (its greedy choice stays the exact argmax of its fp32 logits,
  ``kvviz.runtime.head``). Prompt passes and decode steps both use these products. Needs bfloat16
  dot products in the CPU (AVX-512-BF16 or AMX-BF16): elsewhere oneDNN emulates them, slower than fp32.
* ``auto`` (the default, ``policy.DEFAULT_NUMERICS``): ``bf16`` where the CPU has native bfloat16 dot
  products, else ``fp32``.

Why bf16 and not int8 (``PYTHONPATH=. python research/numerics.py kernels``, one thread, one pass over
Gemma-3-270M's stack matrices; docs/SPEED.md section 13): 16 ms for six rows in bf16 against 26 ms
fp32 oneDNN and 59 ms fp32 MKL; int8 weight-only (``_weight_int8pack_mm``) 30 ms, int8 with per-row
int8 activations (``torch._int_mm``) 24 ms; for a 128-token prompt pass 133 ms bf16 against 299 ms
MKL fp32 (int8 per row 95 ms, but with every activation rounded to 8 bits). The output head keeps
what measured best there too: an int4 scan for up to four rows and a bf16 scan above, then the
candidates rescored in fp32 (``research/numerics.py head``).

Batch invariance: a oneDNN bf16 product gives a row the same bits for every row count from 2 to 512
(from 1 on most shapes; ``research/numerics.py classes``), so the decode step's fixed-rows rule
(``kvviz.runtime.step``) keeps every sequence's tokens the same alone and in any batch and slot
(``tests/real_model/test_numerics.py``).

Training (a gradient through the stack, as C2C's fuser training needs) takes the same bfloat16 weights
through ``F.linear``, which autograd knows; oneDNN's packed product does not.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kvviz.core import policy

MODES = ("fp32", "bf16")
# CPU flags that give oneDNN native bfloat16 dot products (/proc/cpuinfo)
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux's /proc/cpuinfo; empty elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively through oneDNN (the ``bf16`` mode pays here)."""
    if not torch.backends.mkldnn.is_available() or not any(flag in cpu_flags() for flag in NATIVE_BF16_FLAGS):
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def mode_for(device: torch.device | str, dtype: torch.dtype, setting: str | None = None) -> str:
    """The numeric mode of a model loaded on ``device`` with ``dtype``: ``setting`` (else
    ``KVVIZ_NUMERICS``, else the default) resolved against this machine. A model that is not fp32 on
    the CPU (a GPU's bf16, ``--dtype bfloat16``) computes in its own dtype: ``fp32`` here means "as
    loaded". ``bf16`` asked for on a CPU without native bfloat16 is refused with what to do."""
    setting = setting or policy.numerics_setting()
    if torch.device(device).type != "cpu" or dtype != torch.float32:
        return "fp32"
    if setting == "auto":
        return "bf16" if native_bf16() else "fp32"
    if setting == "bf16" and not native_bf16():
        raise ValueError("KVVIZ_NUMERICS=bf16 needs a CPU with bfloat16 dot products (AVX-512-BF16 or AMX) and "
                         "oneDNN; this one has neither, so bf16 would be slower than fp32. Use KVVIZ_NUMERICS=auto "
                         "or fp32.")
    return setting


def describe(mode: str, dtype: torch.dtype) -> str:
    """What a mode computes, in words (the speed report, the docs)."""
    if mode == "bf16":
        return "bf16 weights in the decoder stack (oneDNN, fp32 accumulation), fp32 elsewhere"
    return f"{str(dtype).replace('torch.', '')} as loaded"


# --- products ----------------------------------------------------------------------------------


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (fp32 or bf16) packed once for oneDNN's product."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def packed_product(x: torch.Tensor, packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x @ weight.T`` [rows, out] through oneDNN for a weight packed in ``dtype``: bf16 rounds the
    input rows to bfloat16 and gives the output back in ``x``'s dtype."""
    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), packed, None, "none", [], "").to(x.dtype)
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


class PackedLinear(nn.Module):
    """A decoder-stack linear layer in the ``bf16`` mode: its weight rounded to bfloat16 (``weight``,
    what anything that reads the layer's weight sees) and packed once for oneDNN (what it multiplies).
    The bias, if any, stays fp32 and is added to the fp32 output."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.packed = pack(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:  # training: a product autograd knows
            return F.linear(x, self.weight.to(x.dtype), self.bias)
        rows = x.reshape(-1, self.in_features)
        out = packed_product(rows, self.packed, torch.bfloat16)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, bf16 oneDNN"


def apply(model: nn.Module, mode: str) -> int:
    """Put ``mode``'s products into the decoder stack of ``model`` (in place; ``fp32`` changes
    nothing). Returns how many linear layers changed."""
    if mode == "fp32":
        return 0
    if mode != "bf16":
        raise ValueError(f"unknown numeric mode {mode!r} (one of {', '.join(MODES)})")
    changed = 0
    for layer in model.model.layers:
        for name, child in list(layer.named_modules()):
            if type(child) is nn.Linear:
                parent_name, _, attribute = name.rpartition(".")
                setattr(layer.get_submodule(parent_name) if parent_name else layer, attribute, PackedLinear(child))
                changed += 1
    return changed


def stack_precision(linear: nn.Module) -> torch.dtype:
    """The dtype a decoder-stack linear layer multiplies in (bf16 for a ``PackedLinear``)."""
    return linear.weight.dtype
