"""Reading and editing the hidden states that enter a model's decoder layers: what AC takes from the
sender (its state entering layer k at the last context token) and merges into the receiver (its
state entering layer j at the last prompt token), by f: ``replace``, ``sum`` or ``mean``.

How the merge reaches layer j: a forward pre-hook on the decoder layer. The model is shared by
every thread of the server, so the hook is installed once per layer and does nothing unless the
thread running the forward armed it (``on_layer_inputs``, a context manager that disarms on exit,
error or not): concurrent runs never see each other's edits, and hooks are never added or removed
while another thread may be iterating them."""

from __future__ import annotations

import contextlib
import threading
from typing import Callable

import torch

from kvviz.handoffs.registry import ReceiverPrompt
from kvviz.runtime.cache import KVState
from kvviz.runtime.decode import SharedPrompts, prefill, read_prompt_once
from kvviz.runtime.measure import StageTimer
from kvviz.runtime.models import LoadedModel

MERGES = ("replace", "sum", "mean")


_armed = threading.local()  # per thread: {decoder layer module: edit}


_install_lock = threading.Lock()


def _dispatch(module, args, kwargs):
    """The one pre-hook on a decoder layer: runs the edit this thread armed for it, if any."""
    edit = (getattr(_armed, "edits", None) or {}).get(module)
    if edit is None:
        return None
    hidden = args[0] if args else kwargs["hidden_states"]
    changed = edit(hidden)
    if changed is None:
        return None
    if args:
        return (changed, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": changed}


def decoder_layers(model: LoadedModel):
    return model.model.get_decoder().layers


@contextlib.contextmanager
def on_layer_inputs(model: LoadedModel, edits: dict[int, Callable[[torch.Tensor], torch.Tensor | None]]):
    """Inside the block, forwards made by this thread call ``edits[layer](hidden)`` on the hidden
    states ``[batch, tokens, width]`` entering those decoder layers; an edit returns a replacement
    or None (read only). Other threads are never affected; the edits end with the block."""
    layers = decoder_layers(model)
    armed = {}
    for layer, edit in edits.items():
        module = layers[layer]
        with _install_lock:
            if not getattr(module, "_kvviz_input_hook", False):
                module.register_forward_pre_hook(_dispatch, with_kwargs=True)
                module._kvviz_input_hook = True
        armed[module] = edit
    previous = getattr(_armed, "edits", None)
    _armed.edits = armed
    try:
        yield
    finally:
        _armed.edits = previous


def layer_index(layer: int, num_layers: int) -> int:
    """A layer number (negative counts from the end) as 0..num_layers-1."""
    if not -num_layers <= layer < num_layers:
        raise ValueError(f"layer {layer} does not exist in a model with {num_layers} layers")
    return layer % num_layers


def merge(receiver: torch.Tensor, sender: torch.Tensor, f: str) -> torch.Tensor:
    if f == "replace":
        return sender.clone()
    if f == "sum":
        return receiver + sender
    if f == "mean":
        return 0.5 * (receiver + sender)
    raise ValueError(f"AC merge must be one of {', '.join(MERGES)}, not {f!r}")


def _last_token_reader(store: dict, layer: int):
    def read(hidden):
        store[layer] = hidden[0, -1].detach().clone()

    return read


def read_layer_inputs(model: LoadedModel, token_ids: list[int], timer: StageTimer | None = None,
                      prompts: SharedPrompts | None = None) -> list[torch.Tensor]:
    """Prefill ``token_ids``; the hidden state entering each decoder layer at the last token (read
    once per run: KVComm's sender reads the same context; timed as the sharer's prefill)."""
    return read_prompt_once(model, token_ids, timer, "sharer_prefill" if timer is not None else None, prompts).layer_inputs


@torch.no_grad()
def receive(model: LoadedModel, token_ids: list[int], activation: torch.Tensor, j: int, f: str):
    """The receiver reads its prompt with ``activation`` merged into layer j's input at the last
    token. Returns the receiver after its prompt and the states that entered each layer there
    (layer j's before the merge)."""
    store: dict[int, torch.Tensor] = {}

    def merge_into_j(hidden):
        store[j] = hidden[0, -1].detach().clone()
        changed = hidden.clone()
        changed[:, -1, :] = merge(hidden[:, -1, :], activation.to(hidden.device, hidden.dtype), f)
        return changed

    edits = {layer: _last_token_reader(store, layer) for layer in range(model.facts.num_layers)}
    edits[j] = merge_into_j
    state = KVState()
    with on_layer_inputs(model, edits):
        next_token, _ = prefill(model, state, token_ids)
    prompt = ReceiverPrompt(model=model, state=state, next_token=next_token, last_token=token_ids[-1])
    return prompt, [store[layer] for layer in range(model.facts.num_layers)]
