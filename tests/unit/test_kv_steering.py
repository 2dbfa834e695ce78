"""KV steering (kvviz/handoffs/kv_steering.py) on the tiny models: with zero coefficients it is the
receiver alone; the vectors are the mean contrastive difference at the second to last token; the
edit is exactly c times the vector at one position in the steered layers; no sharer runs; the
user's own pairs; when it does not apply; its figure."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from kvviz.app.methods import kv_steering as kv_steering_page
from kvviz.app.methods import registry as methods
from kvviz.core.prompts import build_segments
from kvviz.core.results import GenerationSettings, HandoffRequest, HandoffResult
from kvviz.engine.runner import run_handoff
from kvviz.handoffs import registry
from kvviz.handoffs.common import read_prompt
from kvviz.handoffs.kv_steering import handoff as kv_steering
from kvviz.handoffs.kv_steering import vectors as kv_steering_vectors
from kvviz.handoffs.kv_steering.vectors import Demo
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import prefill
from kvviz.studies.bench.run import expand_variants
from tests.conftest import tiny_pair

pytestmark = pytest.mark.usefixtures("one_thread")

QUERY = "What is the capital of France?"
TWO_PAIRS = "Who wrote the letter? | Tomas. | Nobody knows.\nThe code is 7. | What is the code? | 7. | No idea."


def request(context: str | None = None, **options) -> HandoffRequest:
    base = HandoffRequest(query=QUERY, context=context, generation=GenerationSettings(max_new_tokens=6))
    return registry.get("kv_steering").with_options(base, options)


def test_zero_coefficients_are_the_receiver_alone(tiny):
    steered = run_handoff("kv_steering", tiny, request(values=0.0, keys=0.0))
    alone = run_handoff("receiver", tiny, request())
    assert steered.applicable, steered.reason
    assert steered.answer_ids == alone.answer_ids and steered.answer == alone.answer
    assert steered.details["answer_changed"] is False and steered.details["first_token_kl"] == pytest.approx(0.0, abs=1e-6)
    assert all(r["value_edit_norm"] == 0.0 and r["key_edit_norm"] == 0.0 for r in steered.layers)


def test_a_real_edit_moves_the_first_token_and_is_reported_against_the_receiver_alone(tiny):
    strong = run_handoff("kv_steering", tiny, request(values=8.0, keys=1.0, first_layer=0))
    alone = run_handoff("receiver", tiny, request())
    assert strong.details["first_token_kl"] > 1e-6  # the tiny Llama's output is nearly flat: small but real
    assert strong.details["receiver_alone_answer"] == alone.answer
    assert strong.details["answer_changed"] == (strong.answer_ids != alone.answer_ids)
    top = strong.details["first_token_top"]
    assert len(top) == kv_steering.TOP_TOKENS and top[0]["id"] == strong.answer_ids[0]
    prompt = registry.get("kv_steering").receiver_prompt(tiny, request(values=8.0, keys=1.0, first_layer=0), strong)
    assert int(prompt.next_token.logits.argmax()) == strong.answer_ids[0]
    unedited = read_prompt(tiny.receiver, build_segments(tiny.receiver.tokenizer, QUERY).input_ids)
    assert (prompt.next_token.logits - unedited.next_token.logits).abs().max() > 1e-3


def stock_kv_at(model, token_ids, position):
    """Keys and values per layer at ``position`` from a plain transformers forward (no kvviz cache)."""
    cache = DynamicCache()
    with torch.no_grad():
        model.model.model(input_ids=torch.tensor([token_ids]), cache=cache, use_cache=True)
    return [(layer.keys[0, :, position, :], layer.values[0, :, position, :]) for layer in cache.layers]


def test_the_vectors_are_the_mean_contrastive_difference_at_the_second_to_last_token(tiny):
    model = tiny.receiver
    demos = kv_steering_vectors.parse_my_pairs(TWO_PAIRS)
    prompts = kv_steering_vectors.contrastive_prompts(model.tokenizer, demos)
    decode = model.tokenizer.decode
    positive, negative = prompts[0]
    assert "7." in decode(positive) and "No idea." in decode(negative)  # the other demo, answered both ways
    assert "Tomas." not in decode(positive)  # a demo never shows its own answer
    question = build_segments(model.tokenizer, demos[0].question).query_ids
    assert positive[-len(question):] == negative[-len(question):] == question
    vectors, cached = kv_steering_vectors.steering_vectors(model, demos)
    assert vectors.pairs == 2 and kv_steering_vectors.steering_vectors(model, demos)[1] is True
    for layer in range(model.facts.num_layers):
        expected_keys = sum(stock_kv_at(model, p, -2)[layer][0] - stock_kv_at(model, n, -2)[layer][0] for p, n in prompts) / 2
        expected_values = sum(stock_kv_at(model, p, -2)[layer][1] - stock_kv_at(model, n, -2)[layer][1] for p, n in prompts) / 2
        assert torch.allclose(vectors.keys[layer], expected_keys, atol=1e-5)
        assert torch.allclose(vectors.values[layer], expected_values, atol=1e-5)


def test_the_edit_is_c_times_the_vector_at_one_position_in_the_steered_layers_only(tiny):
    model = tiny.receiver
    prompt_ids = build_segments(model.tokenizer, QUERY).input_ids
    vectors, _ = kv_steering_vectors.steering_vectors(model, kv_steering_vectors.BUILT_IN["answer_briefly"])
    plain = kv.KVState()
    prefill(model, plain, prompt_ids[:-1], need_logits=False)
    edited = kv.KVState()
    prefill(model, edited, prompt_ids[:-1], need_logits=False)
    records = kv_steering_vectors.steer(edited, vectors, [2, 3], c_keys=0.5, c_values=3.0)
    for layer in range(model.facts.num_layers):
        (k0, v0), (k1, v1) = kv.layer_kv(plain.cache, layer), kv.layer_kv(edited.cache, layer)
        assert torch.equal(k0[..., :-1, :], k1[..., :-1, :]) and torch.equal(v0[..., :-1, :], v1[..., :-1, :])
        if layer in (2, 3):
            assert torch.allclose(k1[0, :, -1] - k0[0, :, -1], 0.5 * vectors.keys[layer], atol=1e-6)
            assert torch.allclose(v1[0, :, -1] - v0[0, :, -1], 3.0 * vectors.values[layer], atol=1e-6)
            assert records[layer]["value_edit_norm"] == pytest.approx(3.0 * float(vectors.values[layer].norm()), rel=1e-5)
        else:
            assert torch.equal(k0, k1) and torch.equal(v0, v1) and not records[layer]["steered"]
        assert records[layer]["value_norm"] == pytest.approx(float(v0[0, :, -1].norm()), rel=1e-6)


def test_keys_only_leaves_the_values_alone():
    pair = tiny_pair("llama")
    result = run_handoff("kv_steering", pair, request(values=0.0, keys=1.0))
    assert all(r["value_edit_norm"] == 0.0 for r in result.layers)
    assert [r["layer"] for r in result.layers if r["key_edit_norm"] > 0] == list(range(1, pair.receiver.facts.num_layers))


def test_no_sharer_runs_and_nothing_is_sent(tiny):
    result = run_handoff("kv_steering", tiny, request(context="The capital of France is Lyon."))
    assert result.applicable and result.communication == "none" and result.bytes_communicated == 0
    assert list(result.flops) == ["receiver"]
    assert result.timings["sharer_prefill"] == result.timings["sharer_decode"] == result.timings["transfer"] == 0
    assert "Lyon" not in result.seen["receiver"]  # the receiver reads the question alone
    assert result.seen["receiver"] == build_segments(tiny.receiver.tokenizer, QUERY).text
    assert result.details["steered_layers"] == list(range(1, tiny.receiver.facts.num_layers))
    assert "no sharer" in methods.page_of("kv_steering").notes(result.to_dict())[0]


def test_the_users_own_pairs_are_read_or_refused_with_a_reason():
    demos = kv_steering_vectors.parse_my_pairs(TWO_PAIRS)
    assert demos == (Demo("Who wrote the letter?", "Tomas.", "Nobody knows."),
                     Demo("What is the code?", "7.", "No idea.", context="The code is 7."))
    pair = tiny_pair("llama")
    handoff = registry.get("kv_steering")
    assert handoff.applicable(pair, request(pairs="my_pairs", my_pairs=TWO_PAIRS)) is None
    assert "at least 2" in handoff.applicable(pair, request(pairs="my_pairs", my_pairs=""))
    assert "needs 3 fields" in handoff.applicable(pair, request(pairs="my_pairs", my_pairs="a | b\nc | d | e"))
    assert "non-empty" in handoff.applicable(pair, request(pairs="my_pairs", my_pairs="a | | c\nd | e | f"))
    too_many = "\n".join(f"q{i} | a | b" for i in range(kv_steering_vectors.MAX_PAIRS + 1))
    assert "limit" in handoff.applicable(pair, request(pairs="my_pairs", my_pairs=too_many))
    assert "does not exist" in handoff.applicable(pair, request(first_layer=4))
    result = run_handoff("kv_steering", pair, request(pairs="my_pairs", my_pairs=TWO_PAIRS))
    assert result.applicable and result.details["vectors"]["pairs"] == 2


def test_bench_variants_name_the_pairs_and_the_value_coefficient():
    variants = expand_variants(["kv_steering"], {"kv_steering": {"pairs": "use_the_context", "values": "4,8"}})
    assert [v.label for v in variants] == ["kv_steering-use_the_context@4", "kv_steering-use_the_context@8"]
    assert [v.label for v in expand_variants(["kv_steering"])] == ["kv_steering-answer_briefly@4",
                                                                   "kv_steering-use_the_context@4"]


def test_the_figure_shows_the_edit_per_layer_and_the_first_token_against_the_receiver_alone(tiny):
    result = run_handoff("kv_steering", tiny, request(values=6.0, keys=0.5)).to_dict()
    figure = kv_steering_page.figure(result)
    traces = {t["meta"]["series"]: t for t in figure.to_dict()["data"]}
    layers = tiny.receiver.facts.num_layers
    assert len(traces["value_edit_norm"]["y"]) == len(traces["key_edit_norm"]["y"]) == len(traces["value_norm"]["y"]) == layers
    assert traces["value_edit_norm"]["y"][0] == 0.0 and traces["value_edit_norm"]["y"][1] > 0
    assert list(traces["first_token_steered"]["x"]) == list(traces["first_token_alone"]["x"])
    assert "receiver alone" in figure.layout.title.text
    assert "key_edit_norm" not in {t["meta"]["series"] for t in kv_steering_page.figure(
        run_handoff("kv_steering", tiny, request()).to_dict()).to_dict()["data"]}  # c_k = 0: no key bars
    empty = kv_steering_page.figure(HandoffResult.not_applicable("kv_steering", "p", "no pairs").to_dict())
    assert "did not run: no pairs" in empty.layout.annotations[0].text
    assert {figure.layout.height, empty.layout.height, kv_steering_page.figure(None).layout.height} == {kv_steering_page.FIGURE_HEIGHT}


def test_the_receiver_alone_prompt_reads_the_same_as_the_split_prefill(tiny):
    """The edit path prefills all but the last token, then the last: with no edit that equals one
    prefill of the whole prompt (what makes zero coefficients the receiver alone)."""
    model = tiny.receiver
    prompt_ids = build_segments(model.tokenizer, QUERY).input_ids
    vectors, _ = kv_steering_vectors.steering_vectors(model, kv_steering_vectors.BUILT_IN["use_the_context"])
    values = {"keys": 0.0, "values": 0.0, "first_layer": 0}
    split, _ = kv_steering_vectors.read_steered(model, prompt_ids, vectors, values)
    whole = read_prompt(model, prompt_ids)
    assert torch.allclose(split.next_token.logits, whole.next_token.logits, atol=1e-5)
