"""A cache layer with spare room (phase-A prototype of what kvviz/runtime/cache.py gets in phase B).

transformers' ``DynamicLayer`` appends by ``torch.cat`` of the whole layer, so every decode token
copies the layer's cache. ``GrowingLayer`` keeps keys and values in buffers with spare room along
the token axis (grown by doubling) and exposes the filled part as views: appending one token writes
one slot. Everything that reads ``layer.keys`` / ``layer.values`` keeps working; code that assigns
them (``kvviz.runtime.cache.place`` moving a layer to another device) is noticed at the next append, which
then rebuilds the buffer from the assigned tensors.

    PYTHONPATH=. python research/growing_cache.py        # checks against DynamicLayer and times a step
    PYTHONPATH=. python research/growing_cache.py 1024   # the same after a 1024-token prompt
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    SPARE = 32  # extra token slots when a buffer is (re)made

    def lazy_initialization(self, key_states, value_states):
        super().lazy_initialization(key_states, value_states)
        self._buffer = None  # [2, batch, heads, capacity, head_dim]

    def _owned(self) -> bool:
        buffer = getattr(self, "_buffer", None)
        return buffer is not None and self.keys is not None and self.keys.data_ptr() == buffer[0].data_ptr() \
            and self.keys.shape[:2] == buffer.shape[1:3] and self.keys.device == buffer.device

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        length = 0 if self.keys is None or self.keys.numel() == 0 else self.keys.shape[-2]
        if not self._owned() or length + new > self._buffer.shape[3]:
            capacity = max(2 * (length + new), length + new + self.SPARE)
            batch, heads, _, dim = key_states.shape
            buffer = key_states.new_empty(2, batch, heads, capacity, dim)
            if length:
                buffer[0, :, :, :length] = self.keys
                buffer[1, :, :, :length] = self.values
            self._buffer = buffer
        self._buffer[0, :, :, length : length + new] = key_states
        self._buffer[1, :, :, length : length + new] = value_states
        self.keys = self._buffer[0, :, :, : length + new]
        self.values = self._buffer[1, :, :, : length + new]
        return self.keys, self.values


def growing_cache() -> DynamicCache:
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    return cache


def main():
    from kvviz.runtime import cache as kv
    from kvviz.runtime.decode import prefill
    from kvviz.runtime.models import load_model
    from kvviz.runtime.step import DecodeStep
    from kvviz.studies.model_speed import prompt_ids

    torch.set_num_threads(1)
    for name in ("gemma3-270m", "smollm2-135m"):
        loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
        prompt = prompt_ids(loaded, 32)
        plain, growing = kv.KVState(), kv.KVState(cache=growing_cache())
        a, _ = prefill(loaded, plain, prompt)
        b, _ = prefill(loaded, growing, prompt)
        same_prefill = torch.equal(a.hidden, b.hidden)
        step = DecodeStep(loaded)
        token = a.greedy_token()
        equal, times = 0, {"DynamicLayer (torch.cat)": [], "GrowingLayer (in place)": []}
        for i in range(24):
            t = time.thread_time(); x = step.step([plain], [token])[0]; times["DynamicLayer (torch.cat)"].append(time.thread_time() - t)
            t = time.thread_time(); y = step.step([growing], [token])[0]; times["GrowingLayer (in place)"].append(time.thread_time() - t)
            equal += torch.equal(x, y)
            token = int(torch.argmax(loaded.head.logits(x[None]), -1)[0])
        print(f"{name}: prefill equal {same_prefill}; decode steps bitwise equal {equal}/24; cache lengths "
              f"{kv.layer_length(plain.cache, 0)} / {kv.layer_length(growing.cache, 0)}; step ms (thread CPU, min):",
              {k: round(1000 * min(v), 1) for k, v in times.items()})



def long_context(tokens: int = 1024):
    """The same comparison after a ``tokens``-token prompt (HotpotQA-sized contexts)."""
    from kvviz.runtime import cache as kv
    from kvviz.runtime.decode import prefill
    from kvviz.runtime.models import load_model
    from kvviz.runtime.step import DecodeStep
    from kvviz.studies.model_speed import prompt_ids

    torch.set_num_threads(1)
    for name in ("gemma3-270m", "smollm2-135m"):
        loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
        prompt = prompt_ids(loaded, tokens)
        plain, growing = kv.KVState(), kv.KVState(cache=growing_cache())
        a, _ = prefill(loaded, plain, prompt)
        prefill(loaded, growing, prompt)
        step = DecodeStep(loaded)
        token = a.greedy_token()
        times = {"DynamicLayer (torch.cat)": [], "GrowingLayer (in place)": []}
        for _ in range(12):
            t = time.thread_time(); step.step([plain], [token]); times["DynamicLayer (torch.cat)"].append(time.thread_time() - t)
            t = time.thread_time(); step.step([growing], [token]); times["GrowingLayer (in place)"].append(time.thread_time() - t)
        print(f"{name} after {tokens} tokens: step ms (thread CPU, min of 12):", {k: round(1000 * min(v), 1) for k, v in times.items()})


if __name__ == "__main__":
    import sys

    long_context(int(sys.argv[1])) if len(sys.argv) > 1 else main()
