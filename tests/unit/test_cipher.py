"""CIPHER (kvviz/handoffs/cipher.py) on the tiny models: at temperature 0 the message is the text
handoff's greedy tokens as their own embeddings, and the receiver reads them exactly as it reads
those tokens; above 0 each vector is a blend; the run's report; when it does not apply."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvviz.app.methods import cipher as cipher_page
from kvviz.app.methods import registry as methods
from kvviz.core.plotkit import bar_counts
from kvviz.core.prompts import build_segments
from kvviz.core.results import GenerationSettings, HandoffRequest, HandoffResult
from kvviz.engine.runner import run_handoff
from kvviz.handoffs import registry
from kvviz.handoffs.cipher import message as cipher_message
from kvviz.handoffs.common import read_prompt
from kvviz.handoffs.text import sharer_message_segments
from kvviz.runtime.cache import KVState
from kvviz.runtime.decode import generate, prefill
from tests.conftest import tiny_pair

pytestmark = pytest.mark.usefixtures("one_thread")

CONTEXT, QUERY = "The secret code word is pineapple.", "What is the secret code word?"


def request(temperature: float = 1.0, message_tokens: int = 6) -> HandoffRequest:
    base = HandoffRequest(query=QUERY, context=CONTEXT, generation=GenerationSettings(max_new_tokens=5),
                          options={"text": {"message_tokens": message_tokens}})
    return registry.get("cipher").with_options(base, {"temperature": temperature})


def test_at_temperature_zero_the_message_is_the_greedy_tokens_own_embeddings():
    pair = tiny_pair("llama")
    sharer = pair.sharer
    prompt_ids = sharer_message_segments(pair, request()).input_ids
    message = cipher_message.write_message(sharer, prompt_ids, 0.0, 6)
    state = KVState()
    first, _ = prefill(sharer, state, prompt_ids)
    greedy = generate(sharer, state, first, GenerationSettings(max_new_tokens=6), max_new_tokens=6)
    assert message.likeliest_ids == greedy.token_ids  # what the text handoff's sharer writes
    embeddings = sharer.model.get_input_embeddings()(torch.tensor(greedy.token_ids))
    assert torch.equal(message.vectors, embeddings)
    assert message.nearest_ids == message.likeliest_ids
    assert all(step["top_probability"] == 1.0 and step["entropy"] == 0.0 for step in message.steps)


def test_the_receiver_reads_one_hot_vectors_exactly_as_the_tokens(tiny):
    receiver = tiny.receiver
    message = cipher_message.write_message(tiny.sharer, sharer_message_segments(tiny, request()).input_ids, 0.0, 5)
    prompt, attention = cipher_message.read_message(receiver, request(), message.vectors)
    before, after, _, _ = cipher_message.receiver_pieces(receiver, request())
    by_tokens = read_prompt(receiver, before + message.likeliest_ids + after)
    assert torch.allclose(prompt.next_token.logits, by_tokens.next_token.logits, atol=1e-5)
    assert prompt.state.next_position == len(before) + len(message.likeliest_ids) + len(after)
    answer = generate(receiver, prompt.state, prompt.next_token, GenerationSettings(max_new_tokens=5))
    expected = generate(receiver, by_tokens.state, by_tokens.next_token, GenerationSettings(max_new_tokens=5))
    assert answer.token_ids == expected.token_ids
    # per receiver layer, the share of attention the tokens after the slot give the message
    assert len(attention) == receiver.facts.num_layers and all(0.0 < mass < 1.0 for mass in attention)


def test_an_empty_message_leaves_the_receiver_alone(tiny):
    empty = torch.zeros(0, tiny.receiver.facts.hidden_size)
    prompt, attention = cipher_message.read_message(tiny.receiver, request(), empty)
    alone = read_prompt(tiny.receiver, build_segments(tiny.receiver.tokenizer, QUERY).input_ids)
    assert torch.equal(prompt.next_token.logits, alone.next_token.logits) and attention == []


def test_above_zero_each_vector_is_a_blend_of_embeddings():
    pair = tiny_pair("gemma")
    message = cipher_message.write_message(pair.sharer, sharer_message_segments(pair, request()).input_ids, 1.0, 4)
    assert message.vectors.shape[1] == pair.sharer.facts.hidden_size
    for step in message.steps:
        assert 0.0 < step["top_probability"] < 1.0 and step["entropy"] > 0.0
        assert step["cosine_nearest"] <= 1.0 + 1e-6


def test_the_run_reports_the_vectors_their_reading_and_the_costs(tiny):
    result = run_handoff("cipher", tiny, request(temperature=0.5))
    assert result.applicable, result.reason
    count = result.tokens["message"]
    assert 1 <= count <= 6 and len(result.details["steps"]) == count
    assert result.bytes_communicated == count * tiny.sharer.facts.hidden_size * 4  # float32
    assert result.communication == "embeddings" and result.details["temperature"] == 0.5
    assert result.seen["message"] == result.details["nearest_message"]
    assert f"[{count} vectors, read as nearest tokens:" in result.seen["receiver"]
    assert result.timings["sharer_prefill"] > 0 and result.timings["sharer_decode"] > 0
    assert result.first_token_seconds >= result.timings["sharer_decode"]
    assert methods.page_of("cipher").notes(result.to_dict())[0].startswith(f"message: {count} vectors")
    prompt = registry.get("cipher").receiver_prompt(tiny, request(temperature=0.5), result)
    assert int(prompt.next_token.logits.argmax()) == result.answer_ids[0]
    assert [r["layer"] for r in result.layers] == list(range(tiny.receiver.facts.num_layers))
    figure = cipher_page.figure(result.to_dict())
    assert bar_counts(figure) == {"top_probability": count}
    assert figure.layout.height == cipher_page.FIGURE_HEIGHT == cipher_page.figure(None).layout.height


def test_not_applicable_without_a_shared_embedding_space():
    pair = tiny_pair("llama")
    other = dataclasses.replace(pair.sharer.facts, tokenizer_hash="another")
    reason = run_handoff("cipher", dataclasses.replace(pair, sharer=dataclasses.replace(pair.sharer, facts=other)),
                         request()).reason
    assert "share a tokenizer and an embedding width" in reason and "another tokenizer" in reason
    wider = dataclasses.replace(pair.sharer.facts, hidden_size=96)
    reason = registry.get("cipher").applicable(dataclasses.replace(pair, sharer=dataclasses.replace(pair.sharer, facts=wider)),
                                               request())
    assert "width 96" in reason
    off = HandoffResult.not_applicable("cipher", "tiny", reason).to_dict()
    assert "did not run" in cipher_page.figure(off).layout.annotations[0].text
