"""Invariants of the handoff engine on tiny random models (no weights needed).

If one of these breaks, every plot in the app is silently wrong.
"""

from __future__ import annotations

import math

import pytest
import torch

from kvviz import cache as kv
from kvviz.decode import full_logits, prefill
from kvviz.engine import run_handoff
from kvviz.handoffs import kvcomm, text
from kvviz.handoffs.kvcomm import layer_budget, select_layers
from kvviz.prompts import build_segments
from kvviz.results import GenerationSettings, HandoffRequest, KVCommOptions

CONTEXT = "The secret code word is pineapple. Uma is at the Mahaffie House. " * 2  # longer than the window
QUERY = "What is the secret code word?"


def request(**kvcomm_options) -> HandoffRequest:
    return HandoffRequest(
        query=QUERY,
        context=CONTEXT,
        generation=GenerationSettings(max_new_tokens=6),
        kvcomm=KVCommOptions(**kvcomm_options) if kvcomm_options else KVCommOptions(),
    )


def full_forward_logits(model, token_ids):
    """Stock transformers forward over the whole prompt, no kvviz cache or plan."""
    with torch.no_grad():
        return model.model(input_ids=torch.tensor([token_ids])).logits[0].float()


def test_cached_prefill_equals_full_forward(tiny):
    model = tiny.receiver
    segments = build_segments(model.tokenizer, QUERY, CONTEXT)
    reference = full_forward_logits(model, segments.input_ids)
    state = kv.KVState()
    prefill(model, state, segments.context_ids, need_logits=False)
    cached = full_logits(model, state, segments.query_ids)
    assert len(segments.context_ids) > 8, "the context must cross the tiny Gemma's sliding window"
    assert torch.allclose(cached, reference[len(segments.context_ids) :], atol=1e-4)


def test_positional_mask_equals_stock_mask_when_every_layer_is_spliced(tiny):
    """The plan path (our mask from positions) against transformers' own mask, sliding layers included."""
    model = tiny.receiver
    segments = build_segments(model.tokenizer, QUERY, CONTEXT)
    reference = full_forward_logits(model, segments.input_ids)
    sender = kv.KVState()
    prefill(model, sender, segments.context_ids, need_logits=False)
    state = kv.splice_prefix(sender.cache, model.facts.num_layers, set(range(model.facts.num_layers)))
    assert state.plan() is not None
    spliced = full_logits(model, state, segments.query_ids)
    assert torch.allclose(spliced, reference[len(segments.context_ids) :], atol=1e-4)


def test_kvcomm_with_every_layer_equals_skyline(tiny):
    all_layers = tuple(range(tiny.receiver.facts.num_layers))
    skyline = run_handoff("skyline", tiny, request())
    shared = run_handoff("kvcomm", tiny, request(strategy="explicit", layers=all_layers))
    assert shared.applicable, shared.reason
    assert shared.answer_ids == skyline.answer_ids
    assert shared.answer == skyline.answer


def test_kvcomm_with_no_layer_sees_only_the_sink(tiny):
    """Nothing shared: the answer depends on the context only through its first token."""
    model = tiny.receiver
    first = build_segments(model.tokenizer, QUERY, CONTEXT)
    other_context = "The hidden code word is a banana. Carol is at the old lighthouse. " * 2
    second = build_segments(model.tokenizer, QUERY, other_context)
    n = min(len(first.context_ids), len(second.context_ids))
    logits = []
    for segments in (first, second):
        sender = kv.KVState()
        prefill(model, sender, segments.context_ids[:n], need_logits=False)
        state = kv.splice_prefix(sender.cache, model.facts.num_layers, selected=set())
        for layer in range(model.facts.num_layers):
            assert kv.layer_length(state.cache, layer) == 1  # the sink only
        assert state.next_position == n  # query positions still continue after |C|
        logits.append(full_logits(model, state, segments.query_ids))
    assert torch.allclose(logits[0], logits[1], atol=1e-6)
    # ...and that differs from Skyline, which reads the whole context
    skyline = full_forward_logits(model, first.input_ids)[len(first.context_ids) :]
    sink_only = full_logits(model, kv.splice_prefix(_prefilled(model, first.context_ids).cache, model.facts.num_layers, set()), first.query_ids)
    assert (sink_only - skyline).abs().max() > 1e-3


def _prefilled(model, token_ids):
    state = kv.KVState()
    prefill(model, state, token_ids, need_logits=False)
    return state


def test_kvcomm_ratio_zero_runs_and_differs_from_skyline_logits(tiny):
    result = run_handoff("kvcomm", tiny, request(ratio=0.0))
    assert result.applicable
    assert result.details["selected_layers"] == []
    assert not any(record["selected"] for record in result.layers)


def test_text_handoff_with_empty_message_equals_receiver_alone(tiny):
    alone = run_handoff("receiver", tiny, request())
    relayed = text.run(tiny, request(), message_override="")
    assert relayed.seen["receiver"] == alone.seen["receiver"]
    assert relayed.answer_ids == alone.answer_ids
    assert relayed.bytes_communicated == 0


@pytest.mark.parametrize("ratio", [0.0, 0.3, 0.5, 0.7, 1.0])
@pytest.mark.parametrize("strategy", ["kvcomm", "attention", "prior", "contiguous", "random"])
def test_exactly_m_layers_selected_with_one_record_per_layer(tiny, ratio, strategy):
    result = run_handoff("kvcomm", tiny, request(ratio=ratio, strategy=strategy))
    num_layers = tiny.receiver.facts.num_layers
    assert [record["layer"] for record in result.layers] == list(range(num_layers))
    selected = [record["layer"] for record in result.layers if record["selected"]]
    assert len(selected) == math.ceil(ratio * num_layers - 1e-9)
    assert selected == result.details["selected_layers"]
    if selected:
        assert 0 in selected  # layer 0 is always one of the M layers (the default)
    if strategy == "contiguous" and len(selected) > 2:
        rest = selected[1:]
        assert rest == list(range(rest[0], rest[0] + len(rest)))


def test_selection_rules():
    scores = [0.0, 0.9, 0.1, 0.8, 0.2, 0.7, 0.3, 0.6, 0.4, 0.5]
    top = select_layers(scores, KVCommOptions(ratio=0.4), 10)
    assert top == [0, 1, 3, 5]  # layer 0 forced, then the best three: non-contiguous
    block = select_layers(scores, KVCommOptions(ratio=0.4, strategy="contiguous"), 10)
    assert block[0] == 0 and block[1:] == [1, 2, 3]
    free = select_layers(scores, KVCommOptions(ratio=0.4, always_send_layer0=False), 10)
    assert free == [1, 3, 5, 7]
    assert layer_budget(0.3, 30) == 9 and layer_budget(0.3, 18) == 6
    with pytest.raises(ValueError, match="between 0 and 1"):
        layer_budget(1.5, 10)
    with pytest.raises(ValueError, match="do not exist"):
        select_layers(scores, KVCommOptions(strategy="explicit", layers=(0, 12)), 10)


def test_random_selection_depends_only_on_the_seed():
    scores = [0.5] * 30
    first = select_layers(scores, KVCommOptions(ratio=0.5, strategy="random", seed=7), 30)
    again = select_layers(scores, KVCommOptions(ratio=0.5, strategy="random", seed=7), 30)
    other = select_layers(scores, KVCommOptions(ratio=0.5, strategy="random", seed=8), 30)
    assert first == again
    assert first != other


def test_scores_prior_and_alpha():
    raw = [0.1, 0.5, 0.3, 0.9, 0.2]
    attention_only = kvcomm.layer_scores(raw, KVCommOptions(strategy="attention"), "gemma3_text")
    assert attention_only["alpha"] == 1.0 and attention_only["score"] == attention_only["attention_norm"]
    assert min(attention_only["attention_norm"]) == 0.0 and max(attention_only["attention_norm"]) == 1.0
    prior_only = kvcomm.layer_scores(raw, KVCommOptions(strategy="prior", sigma=1.0), "llama")
    assert prior_only["score"].index(1.0) == 2  # the middle layer
    assert kvcomm.layer_scores(raw, KVCommOptions(), "llama")["alpha"] == 1.0
    assert kvcomm.layer_scores(raw, KVCommOptions(), "qwen3")["alpha"] == 0.8


def test_timings_are_positive_and_add_up(tiny):
    for name in ("receiver", "skyline", "text", "kvcomm"):
        result = run_handoff(name, tiny, request())
        assert result.applicable, result.reason
        stages = {k: v for k, v in result.timings.items() if k != "total"}
        assert all(v >= 0 for v in stages.values())
        assert result.timings["receiver_prefill"] > 0 and result.timings["receiver_decode"] > 0
        # stages never overlap; the total spans them plus tiny gaps between them
        assert sum(stages.values()) <= result.timings["total"] + 1e-6
        assert result.timings["total"] - sum(stages.values()) < 0.05 + 0.2 * result.timings["total"]
        assert result.first_token_seconds > 0
        assert result.flops["receiver"] > 0


def test_kvcomm_bytes_scale_with_selected_layers(tiny):
    num_layers = tiny.receiver.facts.num_layers
    sizes = {}
    for count in (1, 2, num_layers):
        result = run_handoff("kvcomm", tiny, request(strategy="explicit", layers=tuple(range(count))))
        sizes[count] = result.bytes_communicated
    per_layer = sizes[2] - sizes[1]
    assert per_layer > 0
    assert sizes[num_layers] - sizes[1] == per_layer * (num_layers - 1)


def test_kvcomm_calibration_is_cached_and_recorded(tiny):
    first = run_handoff("kvcomm", tiny, request())
    second = run_handoff("kvcomm", tiny, request(ratio=0.3))
    assert second.details["calibration"]["cached"] is True
    assert first.details["calibration"]["query"] == kvcomm.CALIBRATION_QUERY
    raw = [record["attention_raw"] for record in second.layers]
    assert all(0.0 <= value <= 1.0 for value in raw) and max(raw) > 0


def test_kvcomm_not_applicable_across_architectures(mixed_tiny_pair):
    result = run_handoff("kvcomm", mixed_tiny_pair, request())
    assert not result.applicable
    assert "architecture" in result.reason


def test_skyline_and_kvcomm_need_a_context(tiny):
    no_context = HandoffRequest(query=QUERY, generation=GenerationSettings(max_new_tokens=4))
    assert not run_handoff("skyline", tiny, no_context).applicable
    assert "context" in run_handoff("kvcomm", tiny, no_context).reason


def test_sampling_is_seeded(tiny):
    def sample(seed):
        settings = GenerationSettings(max_new_tokens=8, greedy=False, temperature=1.5, seed=seed)
        return run_handoff("receiver", tiny, HandoffRequest(query=QUERY, generation=settings)).answer_ids

    assert sample(3) == sample(3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"query": "   "}, "empty"),
        ({"query": "x" * 5000}, "limit"),
        ({"query": "ok", "context": "y" * 20000}, "context"),
    ],
)
def test_bad_requests_get_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HandoffRequest(**kwargs)


def test_request_round_trips_through_plain_data():
    original = request(strategy="explicit", layers=(0, 2))
    assert HandoffRequest.from_dict(original.to_dict()) == original


def test_decode_steps_without_a_mask_equal_the_masked_path(tiny, monkeypatch):
    """A decode step under a plan skips the mask when its token may see every key; the logits must
    equal those of the masked path, through and past the tiny Gemma's sliding window of 8."""
    from kvviz.attention import AttentionPlan

    model = tiny.receiver
    segments = build_segments(model.tokenizer, QUERY, CONTEXT)

    def decode_logits() -> list[torch.Tensor]:
        sender = kv.KVState()
        prefill(model, sender, segments.context_ids, need_logits=False)
        state = kv.splice_prefix(sender.cache, model.facts.num_layers, {0, 1})
        step, _ = prefill(model, state, segments.query_ids)
        logits = []
        for _ in range(12):
            logits.append(step.logits)
            step, _ = prefill(model, state, [step.greedy_token()])
        return logits

    skipped = decode_logits()
    monkeypatch.setattr(AttentionPlan, "sees_every_key", lambda *args: False)
    masked = decode_logits()
    for fast, slow in zip(skipped, masked):
        assert torch.allclose(fast, slow, atol=1e-5)


def test_sees_every_key_respects_the_sliding_window():
    from kvviz.attention import AttentionPlan

    plan = AttentionPlan(prefix_positions={0: torch.arange(5)})
    # layer 0: prefix keys at 0..4, then 3 own keys at 8, 9, 10 (query at 10)
    assert plan.sees_every_key(0, 8, 10, None)
    assert plan.sees_every_key(0, 8, 10, 11)
    assert not plan.sees_every_key(0, 8, 10, 10)  # key 0 is 10 positions back: outside a window of 10
    # layer 1 holds own keys only: 6 keys ending at the query position 10 (positions 5..10)
    assert plan.sees_every_key(1, 6, 10, 6) and not plan.sees_every_key(1, 6, 10, 5)


def test_prefill_from_vectors_equals_prefill_from_tokens(tiny):
    """Feeding a prompt's own embeddings as vectors is the same forward as feeding its ids."""
    from kvviz.decode import prefill_vectors

    model = tiny.receiver
    segments = build_segments(model.tokenizer, "What is the code?", "The code is 4471.")
    by_ids, by_vectors = kv.KVState(), kv.KVState()
    expected, _ = prefill(model, by_ids, segments.input_ids)
    embeddings = model.model.get_input_embeddings()(torch.tensor(segments.input_ids))
    got = prefill_vectors(model, by_vectors, embeddings)
    assert torch.allclose(got.logits, expected.logits, atol=1e-5) and by_vectors.next_position == by_ids.next_position
    with pytest.raises(ValueError, match="vectors"):
        prefill_vectors(model, kv.KVState(), embeddings[:, :3])
