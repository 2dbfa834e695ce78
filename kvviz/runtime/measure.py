"""Timers, GPU memory and compute estimates used by every handoff (one way of measuring for all).

On a GPU, kernels run asynchronously: a wall-clock reading taken right after a forward would miss
work still queued. Every timer here reads ``clock()``, which first waits for every GPU this
process has used (``synchronize``); on a CPU it is ``time.perf_counter()``.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from typing import Sequence

import torch

from kvviz.core.facts import ModelFacts
from kvviz.core.results import STAGES


def synchronize() -> None:
    """Wait until every GPU this process has used has finished its queued work (no-op on CPU and
    in a process that never touched CUDA, such as a ZeroGPU Space's main process)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)


def clock() -> float:
    """Seconds for timing model work: ``time.perf_counter()`` after the GPUs caught up."""
    synchronize()
    return time.perf_counter()


def cuda_devices(devices) -> list[torch.device]:
    """The distinct CUDA devices among ``devices``, in index order."""
    found = {torch.device(d) for d in devices if torch.device(d).type == "cuda"}
    return sorted(found, key=lambda d: d.index or 0)


class PeakGpuMemory:
    """``torch.cuda.max_memory_allocated`` during a block, per CUDA device among ``devices``
    (weights included: the most the allocator held at once). Does nothing off CUDA."""

    def __init__(self, devices):
        self.devices = cuda_devices(devices)
        self.peak_bytes: dict[str, int] = {}

    def __enter__(self):
        if self.devices:
            synchronize()
            for device in self.devices:
                torch.cuda.reset_peak_memory_stats(device)
        return self

    def __exit__(self, *exc):
        if self.devices:
            synchronize()
            self.peak_bytes = {str(device): int(torch.cuda.max_memory_allocated(device)) for device in self.devices}
        return False


class StageTimer:
    """Accumulates wall-clock seconds per stage; ``total`` spans the first start to the last stop.
    Readings are taken with ``clock()`` (GPU work finished).

    Time to first token, one definition for every handoff: the decode loop calls
    ``mark_first_token`` when the answer's first token is chosen; ``first_token_seconds`` is then
    the time spent inside stages up to that mark (every stage a handoff times is on its critical
    path: the sharer's prefill and message, the transfer or fusion, the receiver's prefill, choosing
    the first token; work outside stages, such as instrumentation, is not). The receiver's side,
    ``receiver_first_token_seconds``, leaves out the sharer's stages; None when the answer is the
    sharer's own (no receiver)."""

    def __init__(self):
        self.seconds = {stage: 0.0 for stage in STAGES}
        self._first_start: float | None = None
        self._last_stop: float | None = None
        self._open: tuple[str, float] | None = None  # the stage running now, and since when
        self._first_token: dict[str, float] | None = None  # seconds per stage up to the first token
        self._answer_stage: str | None = None  # the stage the first token was chosen in

    @contextmanager
    def stage(self, name: str):
        if name not in self.seconds:
            raise KeyError(f"unknown stage '{name}'")
        started = clock()
        if self._first_start is None:
            self._first_start = started
        self._open = (name, started)
        try:
            yield
        finally:
            stopped = clock()
            self.seconds[name] += stopped - started
            self._last_stop = stopped
            self._open = None

    def mark_first_token(self) -> None:
        """The answer's first token is chosen now (called once, by ``kvviz.runtime.decode.generate``)."""
        if self._first_token is not None:
            return
        upto = dict(self.seconds)
        if self._open is not None:
            name, started = self._open
            upto[name] += clock() - started
        self._first_token = upto
        self._answer_stage = self._open[0] if self._open is not None else None

    @property
    def first_token_seconds(self) -> float | None:
        """Seconds inside stages from the question to the answer's first token (None: no mark)."""
        return None if self._first_token is None else sum(self._first_token.values())

    @property
    def receiver_first_token_seconds(self) -> float | None:
        """``first_token_seconds`` without the sharer's stages; None when the sharer answered."""
        if self._first_token is None or self._answer_stage == "sharer_decode":
            return None
        return sum(seconds for stage, seconds in self._first_token.items() if not stage.startswith("sharer_"))

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds

    def as_dict(self) -> dict[str, float]:
        timings = dict(self.seconds)
        if self._first_start is not None and self._last_stop is not None:
            timings["total"] = self._last_stop - self._first_start
        else:
            timings["total"] = sum(self.seconds.values())
        return timings


def spread(values: list[float | None]) -> dict:
    """Median, min and max of repeated measurements (None values left out), and how many."""
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def visible_key_pairs(new_tokens: int, past_tokens: int, window: int | None = None) -> float:
    """Query-key pairs a causal layer scores when ``new_tokens`` follow ``past_tokens`` keys.

    Query i (0-based among the new tokens) sees past_tokens + i + 1 keys, at most ``window`` of
    them in a sliding-window layer (Gemma 3: 15 of its 18 layers attend within 512 tokens).
    """
    if new_tokens <= 0:
        return 0.0
    first, last = past_tokens + 1, past_tokens + new_tokens  # keys seen by the first and last query
    if window is None or last <= window:
        return (first + last) * new_tokens / 2
    if first >= window:
        return float(window * new_tokens)
    return (first + window) * (window - first + 1) / 2 + (last - window) * window


def _per_layer(past_tokens: int | Sequence[int], num_layers: int) -> list[int]:
    if isinstance(past_tokens, int):
        return [past_tokens] * num_layers
    if len(past_tokens) != num_layers:
        raise ValueError(f"past_tokens has {len(past_tokens)} entries for a model with {num_layers} layers")
    return list(past_tokens)


def forward_flops(facts: ModelFacts, new_tokens: int, past_tokens: int | Sequence[int], logits_tokens: int = 0) -> float:
    """Approximate FLOPs of feeding ``new_tokens`` after cached keys.

    ``past_tokens``: the cached keys, one count for every layer or a list per layer (KVComm's
    receiver holds the context in some layers and only the sink in others). 2 FLOPs per weight per
    token for the matrix multiplies (embeddings excluded), plus the attention scores and weighted
    sum (2 x 2 x heads x head_dim per visible query-key pair per layer, sliding windows honoured),
    plus the output head for the positions whose logits are computed.
    """
    if new_tokens <= 0:
        return 0.0
    embedding = facts.vocab_size * facts.hidden_size
    weights = max((facts.num_parameters or 0) - embedding, 0)
    dense = 2.0 * weights * new_tokens
    pairs = 0.0
    for layer, past in enumerate(_per_layer(past_tokens, facts.num_layers)):
        sliding = layer < len(facts.layer_types) and facts.layer_types[layer] == "sliding_attention"
        pairs += visible_key_pairs(new_tokens, past, facts.sliding_window if sliding else None)
    attention = 4.0 * facts.num_heads * facts.head_dim * pairs
    head = 2.0 * embedding * logits_tokens
    return dense + attention + head


def decode_flops(facts: ModelFacts, generated: int, past_tokens: int | Sequence[int]) -> float:
    """FLOPs of generating ``generated`` tokens one at a time after ``past_tokens`` (as above)."""
    past = _per_layer(past_tokens, facts.num_layers)
    total = 0.0
    for step in range(generated):
        total += forward_flops(facts, 1, [count + step for count in past], logits_tokens=1)
    return total


def answer_flops(facts: ModelFacts, prompt_tokens: int, generated: int, past_tokens: int | Sequence[int] = 0) -> tuple[float, float]:
    """(before the first answer token, in all): a model reads its prompt of ``prompt_tokens`` after
    ``past_tokens`` cached keys, with the first token's logits, then generates ``generated`` tokens."""
    prompt = forward_flops(facts, prompt_tokens, past_tokens, 1)
    after_prompt = [count + prompt_tokens for count in _per_layer(past_tokens, facts.num_layers)]
    return prompt, prompt + decode_flops(facts, generated, after_prompt)


def read_once(tensors: Sequence[torch.Tensor]) -> None:
    """Read every byte of ``tensors`` once (a sum over each one's bytes seen as fp32 words: the same
    work per byte at every precision, where a sum in an int8 tensor's own dtype is compute-bound):
    the memory traffic of a pass over weights with no compute to speak of. A tensor whose bytes do not
    split into 4-byte words, or that is not dense, is summed in its own dtype."""
    for tensor in tensors:
        flat = tensor.detach().reshape(-1) if tensor.layout == torch.strided else None
        if flat is not None and flat.is_contiguous() and (flat.numel() * flat.element_size()) % 4 == 0:
            flat.view(torch.float32).sum()
        elif flat is not None:
            flat.sum()


def bytes_of(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
