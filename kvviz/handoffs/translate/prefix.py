"""The receiver's state before its question, from translated KV.

Layout (what the receiver's cache holds before its question, per receiver layer):

    <bos> Context :   | translated tokens of " <context>\\n\\n"  | Question: ... Answer:
    receiver's own KV | the translator's keys and values         | the receiver reads these
    (context-free)    | at positions 3 .. N-1                    | at positions N, N+1, ...

This is Skyline's prompt, token for token (``kvviz.core.prompts.build_segments``): put the receiver's
own KV of the context in the translated slots (the *oracle*) and the handoff is Skyline exactly. The
translated KV is placed with explicit positions, the way KVComm places a sender's cache
(``kvviz.runtime.cache.KVState``). A closed layer holds only the receiver's attention sink, placed just
before the question, so that it reads the question exactly as the receiver alone does (all gates
closed = the receiver alone). While training, the gate is soft: ``log sigmoid(logit)`` is added to
every translated token's score.

A side-memory translator (``kvviz.handoffs.translate.side``) leaves the receiver's own prompt as it is
(the receiver alone's) and hands the translated KV to a gated branch beside each layer's attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.handoffs.translate import side
from kvviz.handoffs.translate.align import TranslationAlignment, features, read_kv, rotated, unrotated
from kvviz.handoffs.translate.translator import KVTranslator, TranslatorConfig
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import forward_kwargs, prefill

CLOSED = -30.0  # a bias this low hides a key (exp(-30) ~ 1e-13)



@dataclass
class Prefix:
    """The receiver's state before its question, and what each layer took."""

    state: kv.KVState
    gates: list[float]  # per receiver layer: 1 open, 0 closed (soft while training)
    weights: list[list[float]]  # per layer, per translated token (empty for a closed layer)
    translated_tokens: int
    positions: int  # the question's first position
    memory: side.SideMemory | None = None  # a side-memory translator's branch memory (the state is the receiver alone's)

    def reading(self, receiver):
        """A context inside which the receiver's forwards read this prefix (arms a side memory's branch)."""
        return side.reading(receiver, self.memory)


_own_kv: dict[tuple, list[tuple[torch.Tensor, torch.Tensor]]] = {}


@torch.no_grad()
def own_kv(receiver, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The receiver's own KV of its context-free tokens (``<bos>Context:``), as cached (rotated at
    positions 0..), computed once per receiver and token ids."""
    key = (id(receiver.model), tuple(ids))
    if key not in _own_kv:

        state = kv.KVState()
        prefill(receiver, state, ids, need_logits=False)
        _own_kv[key] = [tuple(t.clone() for t in kv.layer_kv(state.cache, i)) for i in range(kv.num_layers(state.cache))]
    return _own_kv[key]


def build_prefix(receiver, alignment: TranslationAlignment, keys, values, weights, gates, rotate: bool = True) -> Prefix:
    """The receiver's state from translated position-free ``keys`` / ``values`` ([L, H, T, D], or
    as-cached keys when ``rotate`` is False: the oracle), ``weights`` [L, T] (None: all 1) and
    ``gates`` [L] (hard 0/1, or soft values in (0, 1) while training: the log enters the scores).
    """
    own = own_kv(receiver, alignment.receiver_ids[: alignment.own_count])
    total = len(alignment.receiver_ids)
    translated_positions = list(range(alignment.own_count, total))
    layers, prefix_positions, biases = [], {}, {}
    gate_values, weight_values = [], []
    for layer, (own_keys, own_values) in enumerate(own):
        gate = gates[layer]
        hard_closed = not torch.is_tensor(gate) and float(gate) <= 0.0
        if hard_closed:
            # the sink alone, moved to just before the question: the layer reads it as when alone
            sink = unrotated(receiver, own_keys[..., :1, :], layer, [0])
            layers.append((rotated(receiver, sink, layer, [total - 1]).to(own_keys.dtype), own_values[..., :1, :]))
            prefix_positions[layer] = torch.tensor([total - 1])
            gate_values.append(0.0)
            weight_values.append([])
            continue
        layer_keys = keys[layer][None]
        if rotate:
            layer_keys = rotated(receiver, layer_keys, layer, translated_positions)
        layers.append((
            torch.cat([own_keys, layer_keys.to(own_keys.dtype)], dim=2),
            torch.cat([own_values, values[layer][None].to(own_values.dtype)], dim=2),
        ))
        prefix_positions[layer] = torch.arange(total)
        bias = torch.zeros(len(translated_positions))
        if weights is not None:
            bias = torch.log(weights[layer].clamp_min(1e-6))
        if torch.is_tensor(gate):
            bias = bias + torch.log(gate.clamp_min(1e-6))
        if weights is not None or torch.is_tensor(gate):
            biases[layer] = torch.cat([torch.zeros(alignment.own_count, dtype=bias.dtype, device=bias.device), bias])
        gate_values.append(float(gate.detach()) if torch.is_tensor(gate) else float(gate))
        weight_values.append([] if weights is None else [float(w) for w in weights[layer].detach()])
    state = kv.KVState(cache=kv.from_tensors(layers), next_position=total, prefix_positions=prefix_positions, prefix_bias=biases)
    return Prefix(state, gate_values, weight_values, alignment.translated_count, total)


def translate(pair, translator: KVTranslator, alignment: TranslationAlignment, hard: bool = True, gates=None):
    """The sharer reads the context; the translator maps its KV; the receiver's prefix is built.

    Returns (Prefix, bytes of the sharer's KV read (``read_bytes``), translated KV bytes). Differentiable in the
    translator when called outside ``torch.no_grad`` (training, ``hard=False``: soft gates).
    ``gates``: override the gates (a list of 0/1 per receiver layer; tests and ablations).
    """
    sharer_kv = read_kv(pair.sharer, [alignment.sharer_ids])
    x = features(sharer_kv, alignment, translator.config.sharer_layers, translator.config.neighbours)
    keys, values, weights = translator(x.to(translator.up.device))
    if translator.side:
        prefix = side_prefix(pair.receiver, translator, alignment, keys, values, weights, hard, gates)
    elif gates is None:
        gates = translator.open_gates().float().tolist() if hard else torch.sigmoid(translator.gate_logits)
    if not translator.side:
        prefix = build_prefix(pair.receiver, alignment, keys, values, weights, gates)
    sent = read_bytes(translator.config, len(alignment.sharer_ids), pair.sharer.dtype)
    made = sum(len(w) for w in prefix.weights) * 2 * translator.config.kv_width * pair.receiver.model.dtype.itemsize
    return prefix, sent, made


def side_prefix(receiver, translator: KVTranslator, alignment: TranslationAlignment, keys, values, weights, hard: bool,
                gates=None) -> Prefix:
    """A side-memory translator's prefix: the receiver alone's state and the branch's memory
    (``gates``: 0/1 per receiver layer, multiplying the branch gates; tests and ablations)."""
    gate_values = translator.side_gates()
    if hard:
        gate_values = gate_values.detach()
    if gates is not None:
        gate_values = gate_values * torch.tensor([float(g) for g in gates], dtype=gate_values.dtype)[:, None]
    memory = side.side_memory(receiver, alignment, keys, values, weights, gate_values)
    ids = side.alone_ids(receiver)
    state = kv.KVState(cache=kv.from_tensors([(k.clone(), v.clone()) for k, v in own_kv(receiver, ids)]), next_position=len(ids))
    open_layers = [float(g.detach().abs().max()) for g in gate_values]
    weight_values = [[] if weights is None else [float(w) for w in weights[layer].detach()] for layer in range(len(keys))]
    return Prefix(state, open_layers, weight_values, alignment.translated_count, len(ids), memory)


def read_bytes(config: "TranslatorConfig", tokens: int, dtype) -> int:
    """Bytes of the sharer's KV the translator reads (what crosses): its layers, K and V, over the
    context's ``tokens`` sharer tokens."""
    return len(config.sharer_layers) * 2 * config.sharer["num_kv_heads"] * config.sharer["head_dim"] * tokens * dtype.itemsize


def kv_bytes(facts, tokens: int, dtype) -> int:
    """Bytes of a model's whole KV cache (every layer, K and V) over ``tokens`` tokens."""
    return facts.num_layers * 2 * facts.num_kv_heads * facts.head_dim * tokens * dtype.itemsize


@torch.no_grad()
def oracle_prefix(pair, alignment: TranslationAlignment, gates=None) -> Prefix:
    """The receiver's own KV of the context in the translated slots (it reads the context: a check
    of the splice, equal to Skyline when every gate is open)."""

    state = kv.KVState()
    prefill(pair.receiver, state, alignment.receiver_ids, need_logits=False)
    layers = [kv.layer_kv(state.cache, i) for i in range(kv.num_layers(state.cache))]
    keys = [k[0, :, alignment.own_count:] for k, _ in layers]
    values = [v[0, :, alignment.own_count:] for _, v in layers]
    gates = [1.0] * len(layers) if gates is None else gates
    return build_prefix(pair.receiver, alignment, keys, values, None, gates, rotate=False)


def nll_after(receiver, state: kv.KVState, query_ids: list[int], answer_ids: list[int]) -> torch.Tensor:
    """Summed NLL of ``answer_ids`` after the receiver reads ``query_ids`` on ``state``
    (differentiable in whatever built the state)."""

    tokens = query_ids + answer_ids[:-1]
    kwargs = forward_kwargs(receiver, state, len(tokens))
    hidden = receiver.model.model(input_ids=torch.tensor([tokens], device=receiver.device), **kwargs).last_hidden_state[0]
    state.next_position += len(tokens)
    logits = receiver.head.logits(hidden[len(query_ids) - 1:])
    return torch.nn.functional.cross_entropy(logits, torch.tensor(answer_ids, device=logits.device), reduction="sum")
