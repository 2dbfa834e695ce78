"""The gated side memory (``kvviz.handoffs.translate.side``): a side-memory translator's branch beside
each receiver layer's attention. Tiny models; seconds."""

from __future__ import annotations

import torch

from kvviz.core.prompts import build_segments
from kvviz.handoffs.translate import align as tr_align
from kvviz.handoffs.translate import prefix as tr_prefix
from kvviz.handoffs.translate import side
from kvviz.handoffs.translate import translator as tr
from kvviz.runtime.attention import AttentionPlan
from kvviz.runtime.cache import KVState
from kvviz.runtime.decode import full_logits, prefill
from tests.unit.test_translator import CONTEXT, QUERY


def side_translator(pair, seed: int = 0) -> tr.KVTranslator:
    translator = tr.new_translator(pair.sharer.facts, pair.receiver.facts, pair.name, pair.sharer.tokenizer,
                                   sharer_layers=[0, 2, 3], rank=8, attach="side")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in (translator.down, translator.up):
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    return translator


def alone_logits(pair, query_ids):
    state = KVState()
    prefill(pair.receiver, state, side.alone_ids(pair.receiver), need_logits=False)
    return full_logits(pair.receiver, state, query_ids)


def side_logits(pair, translator, context, query_ids, gates=None):
    alignment = tr_align.align_context(pair.receiver.tokenizer, pair.sharer.tokenizer, context)
    with torch.no_grad():
        prefix, _, _ = tr_prefix.translate(pair, translator, alignment, gates=gates)
        with prefix.reading(pair.receiver):
            return full_logits(pair.receiver, prefix.state, query_ids)


def test_a_side_branch_at_gate_zero_is_the_receiver_alone_exactly(mixed_tiny_pair):
    """Gate 0 (a new side translator's, or every layer closed): the receiver alone, bit for bit;
    an open gate changes the answer's logits, and another context changes them differently."""
    pair = mixed_tiny_pair
    translator = side_translator(pair)
    query_ids = build_segments(pair.receiver.tokenizer, QUERY).query_ids
    alone = alone_logits(pair, query_ids)
    assert float(translator.side_gates().detach().abs().max()) == 0.0  # a new branch starts closed
    assert torch.equal(side_logits(pair, translator, CONTEXT, query_ids), alone)
    with torch.no_grad():
        translator.side_gate_logits.fill_(1.5)
    opened = side_logits(pair, translator, CONTEXT, query_ids)
    assert (opened - alone).abs().max() > 1e-3
    closed = side_logits(pair, translator, CONTEXT, query_ids, gates=[0] * pair.receiver.facts.num_layers)
    assert torch.equal(closed, alone)
    other = side_logits(pair, translator, "The bakery on Elm Street sells rye bread on Fridays.", query_ids)
    assert (other - opened).abs().max() > 1e-4
    # the hooks are gone after reading: the receiver is itself again
    assert torch.equal(alone_logits(pair, query_ids), alone)


def test_the_branch_asks_the_layers_own_queries_at_skylines_distances(mixed_tiny_pair):
    """The branch's queries are the layer's own (after q_norm and RoPE, as the attention plan keeps
    them), and a translated token sits before the question at the distance it has in Skyline's prompt."""
    pair = mixed_tiny_pair
    receiver = pair.receiver
    query_ids = build_segments(receiver.tokenizer, QUERY).query_ids
    alignment = tr_align.align_context(receiver.tokenizer, pair.sharer.tokenizer, CONTEXT)
    alone = side.alone_ids(receiver)
    at = side.positions(alignment, len(alone))
    skyline_query = len(alignment.receiver_ids)
    assert at[-1] == len(alone) - 1 and skyline_query - (alignment.own_count + 3) == len(alone) - at[3]
    seen = {}

    def keep(module, args, kwargs, output):
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        cos, sin = kwargs["position_embeddings"] if "position_embeddings" in kwargs else args[1]
        batch, length, _ = hidden.shape
        query = module.q_proj(hidden).view(batch, length, -1, module.head_dim).transpose(1, 2)
        seen[module.layer_idx] = side.apply_rotation(module.q_norm(query), cos[:, None], sin[:, None])

    handles = [layer.self_attn.register_forward_hook(keep, with_kwargs=True) for layer in receiver.model.model.layers]
    plan = AttentionPlan(keep_queries=True)
    state = KVState()
    prefill(receiver, state, alone, need_logits=False)
    try:
        with torch.no_grad():
            receiver.model.model(input_ids=torch.tensor([query_ids]), cache=state.cache, use_cache=True,
                                 position_ids=state.positions(len(query_ids), "cpu"), kvviz_plan=plan)
    finally:
        for handle in handles:
            handle.remove()
    for layer, query in plan.queries.items():
        assert torch.allclose(seen[layer], query, atol=1e-5)


def test_a_side_translator_saves_its_gates_and_loads_as_one(mixed_tiny_pair, tmp_path):
    pair = mixed_tiny_pair
    translator = side_translator(pair)
    with torch.no_grad():
        translator.side_gate_logits.fill_(0.7)
    folder = translator.save(tmp_path / "side", dtype=torch.float16)
    loaded = tr.load_translator(folder, pair.sharer.facts, pair.receiver.facts, pair.name)
    assert loaded.side and torch.equal(loaded.side_gate_logits, translator.side_gate_logits)
    query_ids = build_segments(pair.receiver.tokenizer, QUERY).query_ids
    assert (side_logits(pair, loaded, CONTEXT, query_ids) - alone_logits(pair, query_ids)).abs().max() > 1e-3


def test_the_handoff_says_it_does_not_run_a_side_translator(mixed_tiny_pair, tmp_path):
    """The page's handoff decodes through the batched step, which has no side branch: a side-memory
    translator is refused with the reason, not run as a splice."""
    from tests.unit.test_translator import run_translation

    pair = mixed_tiny_pair
    folder = side_translator(pair).save(tmp_path / "side")
    result = run_translation(pair, folder)
    assert not result.applicable and "side branch" in result.reason
