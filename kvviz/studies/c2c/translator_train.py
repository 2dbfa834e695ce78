"""Stage 2 of the KV translator, the research objectives (``research/translator_stage2.py``): training
through the frozen receiver (``kvviz.handoffs.translate.translator``) on private-context examples, both
models frozen. The objective ``python -m kvviz train-translator`` trains with is the receiver side
(``kvviz.studies.c2c.translator_loss``); these two came before it:

* **attention outputs** (local, cheap): the receiver reads the whole Skyline prompt once (context,
  question, gold answer; no gradients) and each layer's queries at the question and answer
  tokens are kept (``AttentionPlan.keep_queries``). For every layer, the same queries attend once
  over the receiver's own keys and values (the teacher) and once with the translated ones in the
  context's slots (the student; per-token weights and the soft gate enter as score biases); the
  loss is the squared difference of the two attention outputs after the layer's output projection
  (``o_proj``: what enters the residual stream), relative to the teacher's. No gradient crosses
  the receiver, so the teacher's tensors can be computed once and reused for many epochs
  (``teacher_example``).
* **answer NLL** (end to end): the translated prefix with soft gates, then the receiver reads
  the question and is scored on the gold answer; the gradient flows back through the frozen
  receiver into the translator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.core.prompts import build_segments
from kvviz.handoffs.translate import align as tr_align
from kvviz.handoffs.translate import prefix as tr_prefix
from kvviz.handoffs.translate import translator as tr
from kvviz.runtime import cache as kv
from kvviz.runtime.attention import AttentionPlan


@dataclass
class TeacherExample:
    """What the attention-output loss needs of one example (float16 on disk, float32 in use)."""

    features: torch.Tensor  # [T, F] the sharer's features at the translated tokens
    queries: list[torch.Tensor]  # per layer [H_q, P, D]: queries at the question + answer tokens
    keys: list[torch.Tensor]  # per layer [H_kv, N + P, D]: the receiver's own keys, as cached
    values: list[torch.Tensor]  # per layer [H_kv, N + P, D]
    own_count: int  # leading context-free tokens (<bos>Context:)
    context_length: int  # N: the context segment's tokens (own + translated)
    answer_tokens: int  # the last ``answer_tokens`` of the P positions are the answer's

    def to_tensors(self, prefix: str) -> dict:
        out = {f"{prefix}.features": self.features.half().contiguous(),
               f"{prefix}.meta": torch.tensor([self.own_count, self.context_length, self.answer_tokens])}
        for layer, (q, k, v) in enumerate(zip(self.queries, self.keys, self.values)):
            out[f"{prefix}.q{layer}"] = q.half().contiguous()
            out[f"{prefix}.k{layer}"] = k.half().contiguous()
            out[f"{prefix}.v{layer}"] = v.half().contiguous()
        return out

    @classmethod
    def from_tensors(cls, tensors: dict, prefix: str, layers: int) -> "TeacherExample":
        own, length, answer = (int(x) for x in tensors[f"{prefix}.meta"])
        return cls(
            features=tensors[f"{prefix}.features"].float(),
            queries=[tensors[f"{prefix}.q{i}"].float() for i in range(layers)],
            keys=[tensors[f"{prefix}.k{i}"].float() for i in range(layers)],
            values=[tensors[f"{prefix}.v{i}"].float() for i in range(layers)],
            own_count=own, context_length=length, answer_tokens=answer,
        )


@torch.no_grad()
def teacher_example(pair, translator_config, context: str, question: str, answer_ids: list[int]) -> TeacherExample:
    """Run the receiver once over Skyline's prompt plus the gold answer, and the sharer over the
    context; keep what the attention-output loss needs."""

    receiver, sharer = pair.receiver, pair.sharer
    alignment = tr_align.align_context(receiver.tokenizer, sharer.tokenizer, context, translator_config.sharer_start)
    segments = build_segments(receiver.tokenizer, question, context)
    sharer_kv = tr_align.read_kv(sharer, [alignment.sharer_ids])
    features = tr_align.features(sharer_kv, alignment, translator_config.sharer_layers, translator_config.neighbours)
    tail = segments.query_ids + answer_ids[:-1]
    ids = segments.context_ids + tail
    plan = AttentionPlan(keep_queries=True)
    state = kv.KVState()
    receiver.model.model(input_ids=torch.tensor([ids], device=receiver.device), cache=state.cache, use_cache=True,
                         position_ids=state.positions(len(ids), receiver.device), kvviz_plan=plan)
    n = len(segments.context_ids)
    layers = kv.num_layers(state.cache)
    return TeacherExample(
        features=features,
        queries=[plan.queries[i][0, :, n:].float().cpu() for i in range(layers)],
        keys=[kv.layer_kv(state.cache, i)[0][0].float().cpu() for i in range(layers)],
        values=[kv.layer_kv(state.cache, i)[1][0].float().cpu() for i in range(layers)],
        own_count=alignment.own_count, context_length=n, answer_tokens=len(answer_ids),
    )


def _attend(query, keys, values, scaling: float, bias=None, query_start: int = 0):
    """Causal attention of queries at positions query_start.. over keys at 0..; [H_q, P, D]."""
    groups = query.shape[0] // keys.shape[0]
    keys = keys.repeat_interleave(groups, dim=0)
    values = values.repeat_interleave(groups, dim=0)
    scores = query @ keys.transpose(1, 2) * scaling  # [H_q, P, K]
    positions = torch.arange(keys.shape[1])
    visible = positions[None, :] <= (query_start + torch.arange(query.shape[1]))[:, None]
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) @ values


class AttentionLoss:
    """The attention-output loss of a translator against a receiver (its layers' output maps)."""

    def __init__(self, receiver):
        layers = receiver.model.model.layers
        self.o_proj = [layer.self_attn.o_proj.weight.detach().float() for layer in layers]
        self.scaling = [float(layer.self_attn.scaling) for layer in layers]
        self.receiver = receiver

    def __call__(self, translator: tr.KVTranslator, example: TeacherExample, answer_weight: float = 1.0):
        """(loss summed over layers, per-layer values): soft gates, the translator's weights."""
        keys_hat, values_hat, weights = translator(example.features)
        gates = torch.sigmoid(translator.gate_logits)
        own, n = example.own_count, example.context_length
        translated = list(range(own, n))
        total, per_layer = 0.0, []
        for layer in range(len(self.o_proj)):
            q, k, v = example.queries[layer], example.keys[layer], example.values[layer]
            rotated = tr_align.rotated(self.receiver, keys_hat[layer][None], layer, translated)[0]
            student_k = torch.cat([k[:, :own], rotated, k[:, n:]], dim=1)
            student_v = torch.cat([v[:, :own], values_hat[layer], v[:, n:]], dim=1)
            bias = torch.zeros(k.shape[1])
            bias = torch.cat([bias[:own], torch.log(weights[layer].clamp_min(1e-6)) + torch.log(gates[layer].clamp_min(1e-6)),
                              bias[n:]])
            student = _attend(q, student_k, student_v, self.scaling[layer], bias, n)
            teacher = _attend(q, k, v, self.scaling[layer], None, n)
            heads, p, d = student.shape
            out_s = student.transpose(0, 1).reshape(p, heads * d) @ self.o_proj[layer].T
            out_t = teacher.transpose(0, 1).reshape(p, heads * d) @ self.o_proj[layer].T
            position_weight = torch.ones(p)
            position_weight[p - example.answer_tokens:] = answer_weight
            err = (((out_s - out_t) ** 2).sum(-1) * position_weight).sum() / position_weight.sum()
            scale = (out_t ** 2).sum(-1).mean().clamp_min(1e-6)
            value = err / scale
            per_layer.append(float(value.detach()))
            total = total + value
        return total, per_layer


def answer_nll(pair, translator: tr.KVTranslator, context: str, question: str, answer_ids: list[int]):
    """(summed gold-answer NLL, tokens) with the translated prefix and soft gates, differentiable
    in the translator (the receiver is frozen; its graph carries the gradient to the prefix)."""

    receiver = pair.receiver
    alignment = tr_align.align_context(receiver.tokenizer, pair.sharer.tokenizer, context, translator.config.sharer_start)
    prefix, _, _ = tr_prefix.translate(pair, translator, alignment, hard=False)
    query_ids = build_segments(receiver.tokenizer, question).query_ids
    with prefix.reading(receiver):
        return tr_prefix.nll_after(receiver, prefix.state, query_ids, answer_ids), len(answer_ids)
