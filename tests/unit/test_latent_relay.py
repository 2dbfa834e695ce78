"""The latent relay (kvviz/handoffs/latent_relay.py) on the tiny models: with no latent step it is
KVComm with every layer, which is Skyline; each control does what it says; the latent steps feed
the aligned final state back; the alignment map is LatentMAS's least squares; the report, when it
does not apply, and its figure."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from kvviz.app.methods import latent_relay as latent_relay_page
from kvviz.app.methods import registry as methods
from kvviz.core.prompts import build_segments
from kvviz.core.results import GenerationSettings, HandoffRequest, HandoffResult
from kvviz.engine.runner import run_handoff
from kvviz.handoffs import registry
from kvviz.handoffs.latent_relay import thinking as latent_relay_thinking
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import prefill, prefill_vectors
from kvviz.studies.bench.run import expand_variants
from tests.conftest import tiny_pair

pytestmark = pytest.mark.usefixtures("one_thread")

# longer than the tiny Gemma's sliding window of 8, so latent positions sit past it
CONTEXT = "The secret code word is pineapple. Uma is at the Mahaffie House."
QUERY = "What is the secret code word?"


def request(**options) -> HandoffRequest:
    base = HandoffRequest(query=QUERY, context=CONTEXT, generation=GenerationSettings(max_new_tokens=6))
    return registry.get("latent_relay").with_options(base, options)


def test_no_latent_step_is_kvcomm_with_every_layer_is_skyline(tiny):
    relay = run_handoff("latent_relay", tiny, request(steps=0))
    kvcomm_all = run_handoff("kvcomm", tiny, registry.get("kvcomm").with_options(request(), {"ratio": 1.0}))
    skyline = run_handoff("skyline", tiny, request())
    assert relay.applicable, relay.reason
    assert relay.answer_ids == kvcomm_all.answer_ids == skyline.answer_ids
    assert relay.bytes_communicated == kvcomm_all.bytes_communicated  # the whole context, every layer
    assert all(r["attention_on_latent"] == 0.0 for r in relay.layers)


def test_no_transfer_is_the_receiver_alone_at_the_senders_cost(tiny):
    relay = run_handoff("latent_relay", tiny, request(steps=3, control="no_transfer"))
    alone = run_handoff("receiver", tiny, request())
    assert relay.answer_ids == alone.answer_ids and relay.seen["receiver"] == alone.seen["receiver"]
    assert relay.bytes_communicated == 0 and relay.communication == "none"
    assert len(relay.details["steps"]) == 3 and relay.timings["sharer_decode"] > 0  # the sender still thought
    assert all(r["attention_on_latent"] is None for r in relay.layers)


def test_latent_steps_feed_the_aligned_final_state_back():
    """Step by step by hand: read the context, map the final hidden state, feed it as the next
    input; the relay's cache holds exactly those keys and values after the context's."""
    sender = tiny_pair("gemma").same_shape_sender
    context_ids = build_segments(sender.tokenizer, QUERY, CONTEXT).context_ids
    alignment = latent_relay_thinking.computed_map(sender)
    thought = latent_relay_thinking.think(sender, context_ids, 2, alignment)
    state = kv.KVState()
    next_token, _ = prefill(sender, state, context_ids)
    for _ in range(2):
        vector, _ = alignment.apply(next_token.hidden[0])
        assert float(vector.norm()) == pytest.approx(alignment.target_norm, rel=1e-5)
        next_token = prefill_vectors(sender, state, vector[None])
    for layer in range(sender.facts.num_layers):
        ours, theirs = kv.layer_kv(thought.state.cache, layer), kv.layer_kv(state.cache, layer)
        assert ours[0].shape[-2] == len(context_ids) + 2
        assert torch.allclose(ours[0], theirs[0], atol=1e-6) and torch.allclose(ours[1], theirs[1], atol=1e-6)
    assert thought.state.next_position == len(context_ids) + 2


def test_latent_steps_reach_the_receiver_and_cost_their_bytes(tiny):
    none = run_handoff("latent_relay", tiny, request(steps=0))
    three = run_handoff("latent_relay", tiny, request(steps=3))
    per_token = none.bytes_communicated // none.tokens["context"]
    assert three.bytes_communicated == none.bytes_communicated + 3 * per_token
    assert three.tokens["vectors"] == 3 and three.details["seconds_per_latent_step"] > 0
    assert any(r["attention_on_latent"] > 0 for r in three.layers)
    for record in three.layers:
        assert 0 <= record["attention_on_latent"] <= 1 and 0 <= record["attention_on_context"] <= 1
        assert record["attention_on_latent"] + record["attention_on_context"] <= 1 + 1e-6
    state = registry.get("latent_relay").receiver_prompt(tiny, request(steps=3), three)
    assert int(state.next_token.logits.argmax()) == three.answer_ids[0]


def untied(model):
    """A copy of ``model`` whose output head is its own (random) matrix, not the input embeddings."""
    copied = copy.deepcopy(model)
    head = copied.model.get_output_embeddings()
    generator = torch.Generator().manual_seed(1)
    head.weight = torch.nn.Parameter(torch.randn(head.weight.shape, generator=generator) * 0.05, requires_grad=False)
    return dataclasses.replace(copied, name=f"{model.name}-untied")


def test_the_alignment_map_is_the_least_squares_map_from_outputs_to_inputs():
    """(W_out^T W_out + 1e-5 I) M = W_out^T W_in (at the embedding layer's scale), and the latent
    vector has the mean input-embedding norm."""
    for kind in ("llama", "gemma"):
        model = untied(tiny_pair(kind).receiver)
        alignment = latent_relay_thinking.computed_map(model)
        embedding = model.model.get_input_embeddings()
        w_in = embedding.weight.float() * float(getattr(embedding, "embed_scale", 1.0))
        w_out = model.model.get_output_embeddings().weight.float()
        lhs = (w_out.T @ w_out + latent_relay_thinking.RIDGE * torch.eye(w_out.shape[1])) @ alignment.matrix
        assert torch.allclose(lhs, w_out.T @ w_in, atol=1e-3 * float((w_out.T @ w_in).abs().max()))
        assert alignment.target_norm == pytest.approx(float(w_in.norm(dim=1).mean()), rel=1e-5)
        assert alignment.distance_from_identity > 0.1  # an untied head gives a real map


def test_with_tied_embeddings_the_map_is_a_scaled_identity_so_the_identity_control_answers_alike(tiny):
    assert latent_relay_thinking.computed_map(tiny.same_shape_sender).distance_from_identity < 1e-3
    method = run_handoff("latent_relay", tiny, request(steps=3))
    identity = run_handoff("latent_relay", tiny, request(steps=3, control="identity_map"))
    assert identity.details["alignment"]["map"] == "identity"
    assert identity.answer_ids == method.answer_ids
    nearest = lambda result: [s["nearest"][0]["token"] for s in result.details["steps"]]  # noqa: E731
    assert nearest(identity) == nearest(method)


def test_the_random_map_keeps_the_spectrum_and_changes_the_directions():
    model = untied(tiny_pair("llama").receiver)
    computed = latent_relay_thinking.computed_map(model)
    random_map = latent_relay_thinking.alignment_map(model, "random_map", seed=0)
    assert random_map.kind == "random" and random_map.target_norm == computed.target_norm
    assert torch.allclose(torch.linalg.svdvals(random_map.matrix), torch.linalg.svdvals(computed.matrix), rtol=1e-4, atol=1e-5)
    assert (random_map.matrix - computed.matrix).norm() > 0.5 * computed.matrix.norm()
    assert torch.equal(latent_relay_thinking.alignment_map(model, "random_map", seed=0).matrix, random_map.matrix)
    assert not torch.equal(latent_relay_thinking.alignment_map(model, "random_map", seed=1).matrix, random_map.matrix)
    identity = latent_relay_thinking.alignment_map(model, "identity_map", seed=0)
    hidden = torch.randn(model.facts.hidden_size)
    vector, _ = identity.apply(hidden)
    assert torch.allclose(vector, hidden / hidden.norm() * identity.target_norm, atol=1e-5)


def test_each_step_reports_its_nearest_tokens_labelled_as_such(tiny):
    result = run_handoff("latent_relay", tiny, request(steps=4))
    steps = result.details["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    for step in steps:
        cosines = [n["cosine"] for n in step["nearest"]]
        assert len(cosines) == latent_relay_thinking.NEAREST and cosines == sorted(cosines, reverse=True)
        assert all(-1.0001 <= c <= 1.0001 for c in cosines)
    assert steps[0]["cosine_to_previous"] is None and steps[1]["cosine_to_previous"] is not None
    assert "read as nearest tokens" in result.seen["latent"] and CONTEXT not in result.seen["receiver"]
    assert result.timings["sharer_prefill"] > 0 and result.flops["sharer"] > 0 and result.flops["receiver"] > 0
    lines = methods.page_of("latent_relay").notes(result.to_dict())
    assert lines[0].startswith("4 latent steps, computed map") and "nearest tokens" in lines[1]


def test_not_applicable_without_a_context_or_a_same_shape_sender(mixed_tiny_pair):
    handoff = registry.get("latent_relay")
    pair = tiny_pair("llama")
    assert "private context" in run_handoff("latent_relay", pair, HandoffRequest(query=QUERY)).reason
    reason = handoff.applicable(mixed_tiny_pair, request())
    assert "same-shape sender" in reason and "KV shape" in reason
    assert handoff.applicable(pair, request()) is None
    with pytest.raises(ValueError):
        handoff.with_options(HandoffRequest(query=QUERY, context=CONTEXT), {"steps": 17})
    with pytest.raises(ValueError, match="not one of"):
        handoff.with_options(HandoffRequest(query=QUERY, context=CONTEXT), {"control": "telepathy"})


def test_the_latent_steps_count_before_the_answer_in_the_prompt_budget():
    """Each latent step adds a position to the receiver's prefix, as a message token would."""
    from kvviz.handoffs.registry import tokens_before_answer

    assert registry.get("latent_relay").tokens_before_answer(request(steps=7)) == 7
    assert tokens_before_answer(request(steps=16), ["receiver", "latent_relay"]) == 16


def test_bench_variants_name_the_steps_and_the_control():
    variants = expand_variants(["latent_relay"], {"latent_relay": {"steps": "0,4", "control": "off,random_map"}})
    assert [v.label for v in variants] == ["latent_relay@0", "latent_relay@4", "latent_relay-random_map@0",
                                           "latent_relay-random_map@4"]
    assert [v.label for v in expand_variants(["latent_relay"])] == ["latent_relay@2", "latent_relay@4", "latent_relay@8"]


def test_the_figure_shows_each_step_and_each_layer(tiny):
    layers = tiny.receiver.facts.num_layers
    figure = latent_relay_page.figure(run_handoff("latent_relay", tiny, request(steps=3)).to_dict())
    traces = {t["meta"]["series"]: t for t in figure.to_dict()["data"]}
    assert len(traces["nearest_cosine"]["y"]) == 3 and all(traces["nearest_cosine"]["text"])
    assert len(traces["attention_on_latent"]["y"]) == layers == len(traces["attention_on_context"]["y"])
    assert "nearest tokens, not words the sender wrote" in figure.layout.annotations[0].text
    heights = {figure.layout.height}
    for result in (run_handoff("latent_relay", tiny, request(steps=0)),
                   run_handoff("latent_relay", tiny, request(steps=2, control="no_transfer")),
                   HandoffResult.not_applicable("latent_relay", "p", "needs a context"), None):
        other = latent_relay_page.figure(None if result is None else result.to_dict())
        heights.add(other.layout.height)
        texts = " ".join(a.text for a in other.layout.annotations)
        if result is None:
            assert "Run a preset" in texts
        elif not result.applicable:
            assert "did not run: needs a context" in texts
        elif result.details["latent_steps"] == 0:
            assert "N = 0" in texts
        else:
            assert "no transfer" in texts
    assert heights == {latent_relay_page.FIGURE_HEIGHT}
