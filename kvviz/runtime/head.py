"""The output head: logits of the next token, and a fast exact path for greedy decoding on CPU.

A decode step of Gemma-3-270M spends as long in its 262,144-word output head (a [262144 x 640]
matrix-vector product) as in its 18 decoder layers; on an AVX2 CPU the fp32 product runs far
below what the memory could stream. Greedy decoding only needs the *index* of the largest logit,
so on CPU the head is computed in two stages:

1. **Scan**: approximate logits for the whole vocabulary from a 4-bit copy of the head weights
   (groups of 32 weights share a scale and an offset; PyTorch's int4 weight-only kernel with
   bfloat16 activations). This reads 8x fewer bytes than fp32.
2. **Rescore**: the ``CANDIDATES`` best approximate tokens are scored exactly, with the real
   weights in fp32, and the best of them is the answer.

The result equals the argmax of the exact logits whenever the exact winner is among the
candidates. The scan's error is about 1-4 logits on the embedded models while the winner's
margin over the 256th token is far larger; as a guard, when the exact winner ranks in the last
quarter of the candidates (a sign that the scan was unusually far off) the full exact head is
computed instead. ``tests/unit/test_head.py`` checks equality on real decode states.

A batched decode step asks for several rows at once (``greedy_tokens``): one scan serves every row
(the int4 copy up to ``INT4_ROWS`` rows, a bfloat16 copy through oneDNN above, where the CPU has
it), then each row's candidates are rescored on their own, so a row's token does not depend on the
other rows.

Everything that needs the distribution itself (sampling, likelihood scoring, training) uses
``logits``: the model's own head, exactly as transformers computes it.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

CANDIDATES = 256
GROUP_SIZE = 32
# Up to this many rows the int4 scan is the cheaper one; above it, a bfloat16 copy where the CPU
# has oneDNN's bfloat16 product (research/head_m.py: int4 28.8 ms, bf16 20.8 ms for six rows of Gemma).
INT4_ROWS = 4
# Below this vocabulary size the full head is cheap: no scan index is built.
MIN_VOCABULARY_FOR_SCAN = 16384
# Rows quantised per chunk while building the index (bounds the temporary memory).
_BUILD_CHUNK_ROWS = 16384


class OutputHead:
    """Logits of the next token from a final hidden state ([1, hidden], after the final norm)."""

    def __init__(self, model: torch.nn.Module, allow_scan: bool = True, cache_folder: Path | None = None):
        """``cache_folder``: where the scan index is kept between processes (it takes seconds to
        build for a 262k vocabulary); None builds it in memory only."""
        self.linear = model.get_output_embeddings()
        self.softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
        self._allow_scan = allow_scan
        self._cache_folder = cache_folder
        self._scan_index: tuple | None = None
        self._scan_ready = False
        self._wide: tuple | None = None
        self._lock = threading.Lock()

    # --- exact ------------------------------------------------------------------------------

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Exact float32 logits [rows, vocabulary], as the model's own forward computes them."""
        return self._capped(self.linear(hidden)).float()

    def log_probabilities(self, hidden: torch.Tensor, token_ids: list[int]) -> list[float]:
        """``log_softmax(logits(row))[token]`` for each row of ``hidden`` [rows, width] and its token
        (``log_probability_table`` with one token per row)."""
        table = self.log_probability_table(hidden, torch.tensor(token_ids, device=hidden.device)[:, None])
        return table[:, 0].tolist()

    def log_probability_table(self, hidden: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """``log_softmax(logits(row))[tokens]`` [rows, k] for each row of ``hidden`` [rows, width]
        and its ``k`` tokens (``token_ids`` [rows, k]): each token's exact logit minus the row's
        log-sum-exp over the vocabulary. On a CPU with
        oneDNN's bfloat16 product and a large vocabulary, the log-sum-exp takes the ``CANDIDATES``
        likeliest tokens' logits exact and the rest of the vocabulary's from the head's bfloat16
        copy (about three times faster than fp32 for a run's rows; within 0.01 nat of it,
        ``tests/unit/test_head.py``); elsewhere it is the exact log-softmax."""
        chosen = token_ids.to(hidden.device)
        wide = self._wide_scan() if self._fast_log_sum_exp(hidden) else None
        if wide is None:
            return torch.log_softmax(self.logits(hidden), dim=-1).gather(1, chosen)
        weight = self.linear.weight
        own = self._capped(torch.einsum("rh,rkh->rk", hidden.to(weight.dtype), weight[chosen]).float())
        logits = self._capped(self._wide_product(hidden, wide).float())
        # the likeliest tokens hold nearly all the mass: their logits exact, the tail's from bfloat16
        best = torch.topk(logits, CANDIDATES, dim=-1).indices
        exact = torch.stack([F.linear(row[None].to(weight.dtype), weight.index_select(0, top))[0]
                             for row, top in zip(hidden, best)]).float()
        logits.scatter_(1, best, self._capped(exact))
        return own - torch.logsumexp(logits, dim=-1, keepdim=True)

    def _fast_log_sum_exp(self, hidden: torch.Tensor) -> bool:
        return (self._allow_scan and hidden.device.type == "cpu" and getattr(self.linear, "bias", None) is None
                and self.linear.weight.shape[0] >= MIN_VOCABULARY_FOR_SCAN)

    def _capped(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.tanh(logits / self.softcap) * self.softcap if self.softcap else logits

    # --- greedy -----------------------------------------------------------------------------

    def greedy_token(self, hidden: torch.Tensor) -> int:
        """``argmax(logits(hidden))`` for one position, through the fast scan where available."""
        return self.greedy_tokens(hidden)[0]

    def greedy_tokens(self, hidden: torch.Tensor) -> list[int]:
        """``argmax(logits(row))`` for each row of ``hidden`` [rows, width] (the rows of a batched
        decode step). One approximate scan serves every row; each row's candidates are then scored
        exactly on their own, so a row's answer does not depend on the other rows."""
        index = self.scan_index()
        rows = [hidden[row : row + 1] for row in range(hidden.shape[0])]
        if index is None:
            return [int(torch.argmax(self.logits(row), dim=-1)[0]) for row in rows]
        approximate = self._scan(hidden, index)
        best = torch.topk(approximate.float(), CANDIDATES, dim=-1).indices  # best first, per row
        return [self._rescore(row, candidates) for row, candidates in zip(rows, best)]

    def _scan(self, hidden: torch.Tensor, index) -> torch.Tensor:
        """Approximate logits [rows, vocabulary]: the int4 copy, or for more than ``INT4_ROWS`` rows
        a bfloat16 copy through oneDNN where this CPU has it (the int4 kernel slows down with rows)."""
        if hidden.shape[0] > INT4_ROWS:
            wide = self._wide_scan()
            if wide is not None:
                return self._wide_product(hidden, wide)
        packed, scales_and_zeros = index
        return torch.ops.aten._weight_int4pack_mm_for_cpu(hidden.to(torch.bfloat16), packed, GROUP_SIZE, scales_and_zeros)

    @staticmethod
    def _wide_product(hidden: torch.Tensor, wide) -> torch.Tensor:
        """Logits [rows, vocabulary] in bfloat16 from the packed copy (``_wide_scan``), no softcap."""
        return torch.ops.mkldnn._linear_pointwise(hidden.to(torch.bfloat16), wide, None, "none", [], "")

    def _wide_scan(self):
        """The bfloat16 copy of the head, packed for oneDNN (made on the first step with many rows),
        or None where oneDNN has no bfloat16 product on this CPU."""
        if self._wide is None:
            with self._lock:
                if self._wide is None:
                    try:
                        weight = self.linear.weight.detach().to(torch.bfloat16)
                        self._wide = (torch.ops.mkldnn._reorder_linear_weight(weight, None),)
                    except (RuntimeError, AttributeError):  # no AVX-512 (or no oneDNN): the int4 scan
                        self._wide = (None,)
        return self._wide[0]

    def _rescore(self, hidden: torch.Tensor, candidates: torch.Tensor) -> int:
        """The exact argmax among ``candidates`` (best first) for one row ``hidden`` [1, width]."""
        # the candidates' exact logits, computed as the full head computes them (the softcap
        # keeps the order, so it is not needed for the argmax)
        exact = F.linear(hidden, self.linear.weight.index_select(0, candidates))[0].float()
        winners = torch.nonzero(exact == exact.max()).flatten()
        if int(winners[0]) >= CANDIDATES * 3 // 4:
            return int(torch.argmax(self.logits(hidden), dim=-1)[0])
        # torch.argmax breaks ties by the lowest token id: do the same
        return int(candidates[winners].min())

    def scan_index(self):
        """The 4-bit copy of the head (built once, on first use), or None where it does not apply."""
        if self._scan_ready:
            return self._scan_index
        with self._lock:
            if not self._scan_ready:
                self._scan_index = self._build_scan_index() if self._allow_scan else None
                self._scan_ready = True
        return self._scan_index

    def _build_scan_index(self):
        weight = self.linear.weight
        vocabulary, width = weight.shape
        if (
            weight.device.type != "cpu"
            or vocabulary < MIN_VOCABULARY_FOR_SCAN
            or width % GROUP_SIZE
            or getattr(self.linear, "bias", None) is not None
        ):
            return None
        try:
            packed, scales_and_zeros = self._load_or_quantize(weight)
            # a smoke test: the kernel must exist and agree with the exact head on this CPU
            probe = torch.randn(1, width, dtype=torch.float32)
            approximate = torch.ops.aten._weight_int4pack_mm_for_cpu(
                probe.to(torch.bfloat16), packed, GROUP_SIZE, scales_and_zeros
            )[0].float()
            exact = F.linear(probe, weight.float())[0]
            if not torch.isfinite(approximate).all() or torch.corrcoef(torch.stack([approximate, exact]))[0, 1] < 0.99:
                return None
        except (RuntimeError, NotImplementedError):  # no int4 kernel for this CPU or build
            return None
        return packed, scales_and_zeros

    def _load_or_quantize(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from safetensors.torch import load_file, save_file

        path = None
        if self._cache_folder is not None:
            path = Path(self._cache_folder) / f"head-int4-{weight_fingerprint(weight)}.safetensors"
            if path.is_file():
                try:
                    stored = load_file(str(path))
                    return stored["packed"], stored["scales_and_zeros"]
                except Exception:  # a damaged cache file is rebuilt below
                    pass
        packed_chunks, scale_chunks = [], []
        with torch.no_grad():
            for start in range(0, weight.shape[0], _BUILD_CHUNK_ROWS):
                packed, scales_and_zeros = quantize_int4(weight[start : start + _BUILD_CHUNK_ROWS])
                packed_chunks.append(packed)
                scale_chunks.append(scales_and_zeros)
        packed = torch.cat(packed_chunks)
        scales_and_zeros = torch.cat(scale_chunks, dim=1).contiguous()
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                partial = path.with_suffix(".partial")
                save_file({"packed": packed, "scales_and_zeros": scales_and_zeros}, str(partial))
                partial.replace(path)
            except OSError:  # a read-only cache only costs the rebuild next time
                pass
        return packed, scales_and_zeros


def weight_fingerprint(weight: torch.Tensor) -> str:
    """A short content hash of a weight matrix (its shape, dtype and every 997th value), so that a
    cached index is never used for other weights. Cheap: it must not slow down every start."""
    sample = weight.detach().reshape(-1)[::997].float().cpu().contiguous()
    digest = hashlib.sha256(repr((tuple(weight.shape), str(weight.dtype))).encode())
    digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:16]


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit quantisation in groups of ``GROUP_SIZE`` along each row, packed for
    ``torch.ops.aten._weight_int4pack_mm_for_cpu``: returns (packed weight, scales and zeros
    [groups, rows, 2] in bfloat16), where a weight is ``(q - 8) * scale + zero``, q in 0..15."""
    rows, width = weight.shape
    grouped = weight.detach().float().reshape(rows, width // GROUP_SIZE, GROUP_SIZE)
    low, high = grouped.amin(dim=-1), grouped.amax(dim=-1)
    scale = ((high - low) / 15).clamp(min=1e-12)
    q = torch.clamp(torch.round((grouped - low[..., None]) / scale[..., None]), 0, 15).to(torch.int32)
    zero = low + 8 * scale
    scales_and_zeros = torch.stack([scale.T, zero.T], dim=-1).to(torch.bfloat16).contiguous()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(rows, width), 1)
    return packed, scales_and_zeros
