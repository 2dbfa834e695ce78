"""Invariants of the handoff engine on tiny random models (no weights needed).

If one of these breaks, every plot in the app is silently wrong.
"""

from __future__ import annotations

import json

import pytest
import torch

from kvviz.core.prompts import build_segments
from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine.runner import run_handoff
from kvviz.handoffs import common, text
from kvviz.handoffs.kvcomm import handoff as kvcomm
from kvviz.handoffs.kvcomm.options import KVCommOptions
from kvviz.runtime import cache as kv
from kvviz.runtime.attention import AttentionPlan, positional_mask
from kvviz.runtime.decode import full_logits, prefill
from tests.conftest import tiny_pair
from tests.tiny_models import tiny_llama

CONTEXT = "The secret code word is pineapple. Uma is at the Mahaffie House. " * 2  # longer than the window
QUERY = "What is the secret code word?"


def request(**kvcomm_options) -> HandoffRequest:
    return HandoffRequest(
        query=QUERY,
        context=CONTEXT,
        generation=GenerationSettings(max_new_tokens=6),
        options={"kvcomm": KVCommOptions(**kvcomm_options).to_dict()},
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


def context_hidden_logits(model, context_ids, query_ids, selected, sink_tokens=1, bidirectional_query=False):
    """An independent reference for KVComm's splice (no kvviz cache, plan or positions).

    One stock forward over context + question, with a per-layer 4D mask: every token sees the
    earlier tokens (within the window in sliding layers), except that in the layers not in
    ``selected`` the question's tokens do not see the context beyond its first ``sink_tokens``.
    Same model as sender and receiver, so the context rows are the sender's prefill.
    ``bidirectional_query``: in those layers the question's tokens also see later question tokens
    (the reference code's mask quirk).
    """
    n_context, total = len(context_ids), len(context_ids) + len(query_ids)
    positions = torch.arange(total)
    difference = positions[:, None] - positions[None, :]
    facts = model.facts
    hooks = []
    for index, layer in enumerate(model.model.model.layers):
        allowed = difference >= 0
        if facts.layer_types[index] == "sliding_attention":
            allowed &= difference < facts.sliding_window
        if index not in selected:
            allowed[n_context:, sink_tokens:n_context] = False
            if bidirectional_query:
                allowed[n_context:, n_context:] = True

        def use_mask(module, args, kwargs, mask=allowed[None, None]):
            assert "attention_mask" in kwargs, "the decoder layer no longer passes attention_mask by keyword"
            return args, {**kwargs, "attention_mask": mask}

        hooks.append(layer.self_attn.register_forward_pre_hook(use_mask, with_kwargs=True))
    try:
        with torch.no_grad():
            logits = model.model(input_ids=torch.tensor([context_ids + query_ids])).logits[0].float()
    finally:
        for hook in hooks:
            hook.remove()
    return logits[n_context:]


def spliced_logits(model, context_ids, query_ids, selected):
    """kvviz's KVComm: the sender prefills the context, the receiver reads the question on the splice."""
    state = kv.splice_prefix(_prefilled(model, context_ids).cache, model.facts.num_layers, set(selected))
    return full_logits(model, state, query_ids)


def _prefilled(model, token_ids):
    state = kv.KVState()
    prefill(model, state, token_ids, need_logits=False)
    return state


def test_reference_construction_sees_the_whole_context_when_every_layer_is_selected(tiny):
    """The reference above, checked against the plain forward it must reduce to."""
    model = tiny.receiver
    segments = build_segments(model.tokenizer, QUERY, CONTEXT)
    everything = set(range(model.facts.num_layers))
    reference = context_hidden_logits(model, segments.context_ids, segments.query_ids, everything)
    plain = full_forward_logits(model, segments.input_ids)[len(segments.context_ids) :]
    assert torch.allclose(reference, plain, atol=1e-5)


def test_kvcomm_splice_equals_the_reference_for_mixed_selections(tiny):
    model = tiny.receiver
    segments = build_segments(model.tokenizer, QUERY, CONTEXT)
    num_layers = model.facts.num_layers
    selections = [{0}, {0, 2}, set(range(1, num_layers, 2)), {num_layers - 1}, set(range(num_layers - 1))]
    skyline = full_forward_logits(model, segments.input_ids)[len(segments.context_ids) :]
    for selected in selections:
        reference = context_hidden_logits(model, segments.context_ids, segments.query_ids, selected)
        spliced = spliced_logits(model, segments.context_ids, segments.query_ids, selected)
        assert (reference - spliced).abs().max() < 1e-5, f"selection {sorted(selected)}"
        assert (reference - skyline).abs().max() > 1e-3, f"selection {sorted(selected)} should hide something"


def test_kvcomm_with_no_layer_sees_only_the_sink(tiny):
    """Nothing shared: each layer holds the sink only, the question's positions continue after |C|,
    and the logits are the reference's with the context hidden in every layer."""
    model = tiny.receiver
    first = build_segments(model.tokenizer, QUERY, CONTEXT)
    state = kv.splice_prefix(_prefilled(model, first.context_ids).cache, model.facts.num_layers, selected=set())
    for layer in range(model.facts.num_layers):
        assert kv.layer_length(state.cache, layer) == 1  # the sink only
    assert state.next_position == len(first.context_ids)  # query positions still continue after |C|
    spliced = full_logits(model, state, first.query_ids)
    reference = context_hidden_logits(model, first.context_ids, first.query_ids, selected=set())
    assert (spliced - reference).abs().max() < 1e-5
    # ...so another context of the same length and first token gives the same logits
    other = build_segments(model.tokenizer, QUERY, "The hidden code word is a banana. Carol is at the old lighthouse. " * 2)
    n = min(len(first.context_ids), len(other.context_ids))
    assert first.context_ids[0] == other.context_ids[0]
    logits = [spliced_logits(model, segments.context_ids[:n], segments.query_ids, set()) for segments in (first, other)]
    assert torch.allclose(logits[0], logits[1], atol=1e-6)


@pytest.fixture
def first_logits(monkeypatch):
    """The logits each handoff's decode starts from, recorded per run: [kvcomm runs], [others]."""
    recorded = {"kvcomm": [], "single": []}

    def recording(name, generate):
        def wrapped(loaded, state, first, *args, **kwargs):
            recorded[name].append(first.logits.clone())
            return generate(loaded, state, first, *args, **kwargs)

        return wrapped

    monkeypatch.setattr(kvcomm, "generate", recording("kvcomm", kvcomm.generate))
    monkeypatch.setattr(common, "generate", recording("single", common.generate))
    return recorded


def test_kvcomm_ratio_zero_runs_and_differs_from_skyline_logits(tiny, first_logits):
    """The handoffs themselves, with the first logits each decode starts from."""
    result = run_handoff("kvcomm", tiny, request(ratio=0.0))
    skyline = run_handoff("skyline", tiny, request())
    assert result.applicable and skyline.applicable
    assert result.details["selected_layers"] == []
    assert all(record["sent"] == "sink" for record in result.layers)
    [kvcomm_logits], [skyline_logits] = first_logits["kvcomm"], first_logits["single"]
    assert (kvcomm_logits - skyline_logits).abs().max() > 1e-3
    # and the handoff's logits are the sink-only reference's, not noise
    model = tiny.receiver
    segments = build_segments(model.tokenizer, QUERY, CONTEXT)
    reference = context_hidden_logits(model, segments.context_ids, segments.query_ids, selected=set())[-1]
    assert (kvcomm_logits[0] - reference).abs().max() < 1e-5


def test_reference_mask_differs_from_the_causal_mask_exactly_among_query_tokens_of_sink_layers():
    context_length, query_length = 6, 4
    plan_layers = {0: torch.arange(context_length), 1: torch.arange(1)}  # layer 0 sent, layer 1 sink only
    query_positions = torch.arange(context_length, context_length + query_length)

    def mask(reference: bool, layer: int, key_length: int) -> torch.Tensor:
        plan = AttentionPlan(prefix_positions=plan_layers, reference_mask=reference)
        keys = plan.key_positions(layer, key_length, int(query_positions[-1]), "cpu")
        return positional_mask(query_positions, keys)[0, 0]

    full = context_length + query_length
    assert torch.equal(mask(True, 0, full), mask(False, 0, full))  # a sent layer: no difference
    causal, quirk = mask(False, 1, 1 + query_length), mask(True, 1, 1 + query_length)
    expected = torch.zeros(query_length, 1 + query_length, dtype=torch.bool)
    for query in range(query_length):
        for own in range(query_length):
            expected[query, 1 + own] = own > query  # a later question token
    assert torch.equal(causal != quirk, expected)
    assert quirk.all()  # every question token sees the sink and every question token


def test_reference_mask_reproduces_the_reference_codes_prefill():
    """Tiny Llama (no sliding windows: with them the quirk also hides the sink, see attention.py)."""
    model = tiny_llama()
    segments = build_segments(model.tokenizer, QUERY, CONTEXT)
    selected = {0, 2}
    state = kv.splice_prefix(_prefilled(model, segments.context_ids).cache, model.facts.num_layers, selected)
    state.reference_mask = True
    quirk = full_logits(model, state, segments.query_ids)
    reference = context_hidden_logits(model, segments.context_ids, segments.query_ids, selected, bidirectional_query=True)
    assert (quirk - reference).abs().max() < 1e-5
    assert (quirk - spliced_logits(model, segments.context_ids, segments.query_ids, selected)).abs().max() > 1e-3
    # every layer sent: nothing is cropped, the two masks agree
    everything = set(range(model.facts.num_layers))
    state = kv.splice_prefix(_prefilled(model, segments.context_ids).cache, model.facts.num_layers, everything)
    state.reference_mask = True
    assert torch.allclose(full_logits(model, state, segments.query_ids), spliced_logits(model, segments.context_ids, segments.query_ids, everything), atol=1e-5)


def test_kvcomm_reference_mask_option_reaches_the_attention(first_logits):
    pair = tiny_pair("llama")
    causal = run_handoff("kvcomm", pair, request(ratio=0.5))
    quirk = run_handoff("kvcomm", pair, request(ratio=0.5, reference_mask=True))
    assert quirk.applicable and quirk.details["reference_mask"] is True and causal.details["reference_mask"] is False
    assert quirk.details["selected_layers"] == causal.details["selected_layers"]
    assert (first_logits["kvcomm"][0] - first_logits["kvcomm"][1]).abs().max() > 1e-3


def test_reference_mask_refuses_a_context_longer_than_a_sliding_window():
    result = run_handoff("kvcomm", tiny_pair("gemma"), request(ratio=0.5, reference_mask=True))
    assert not result.applicable and "sliding-window" in result.reason


def test_text_handoff_with_empty_message_equals_receiver_alone(tiny):
    alone = run_handoff("receiver", tiny, request())
    relayed = text.run(tiny, request(), common.HandoffIO(), message_override="")
    assert relayed.seen["receiver"] == alone.seen["receiver"]
    assert relayed.answer_ids == alone.answer_ids
    assert relayed.bytes_communicated == 0


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


def test_first_token_time_covers_the_critical_path(tiny):
    results = {name: run_handoff(name, tiny, request()) for name in ("receiver", "skyline", "text", "kvcomm", "sharer")}
    for name in ("receiver", "skyline"):
        assert results[name].receiver_first_token_seconds == results[name].first_token_seconds > 0
    assert results["sharer"].receiver_first_token_seconds is None
    kvcomm_result, text_result = results["kvcomm"], results["text"]
    timings = kvcomm_result.timings
    assert kvcomm_result.receiver_first_token_seconds > timings["transfer"] + timings["receiver_prefill"]
    assert kvcomm_result.first_token_seconds == pytest.approx(timings["sharer_prefill"] + kvcomm_result.receiver_first_token_seconds)
    sharer_side = text_result.timings["sharer_prefill"] + text_result.timings["sharer_decode"]
    assert text_result.first_token_seconds == pytest.approx(sharer_side + text_result.receiver_first_token_seconds)
    assert text_result.receiver_first_token_seconds > text_result.timings["receiver_prefill"]


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
    calibrated = request(calibration="sample", calibration_sample=("A context.", "A question?"), alpha="paper")
    assert HandoffRequest.from_dict(json.loads(json.dumps(calibrated.to_dict()))) == calibrated


def test_decode_steps_without_a_mask_equal_the_masked_path(tiny, monkeypatch):
    """A decode step under a plan skips the mask when its token may see every key; the logits must
    equal those of the masked path, through and past the tiny Gemma's sliding window of 8."""
    from kvviz.runtime.attention import AttentionPlan

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
    from kvviz.runtime.attention import AttentionPlan

    plan = AttentionPlan(prefix_positions={0: torch.arange(5)})
    # layer 0: prefix keys at 0..4, then 3 own keys at 8, 9, 10 (query at 10)
    assert plan.sees_every_key(0, 8, 10, None)
    assert plan.sees_every_key(0, 8, 10, 11)
    assert not plan.sees_every_key(0, 8, 10, 10)  # key 0 is 10 positions back: outside a window of 10
    # layer 1 holds own keys only: 6 keys ending at the query position 10 (positions 5..10)
    assert plan.sees_every_key(1, 6, 10, 6) and not plan.sees_every_key(1, 6, 10, 5)


def test_prefill_from_vectors_equals_prefill_from_tokens(tiny):
    """Feeding a prompt's own embeddings as vectors is the same forward as feeding its ids."""
    from kvviz.runtime.decode import prefill_vectors

    model = tiny.receiver
    segments = build_segments(model.tokenizer, "What is the code?", "The code is 4471.")
    by_ids, by_vectors = kv.KVState(), kv.KVState()
    expected, _ = prefill(model, by_ids, segments.input_ids)
    embeddings = model.model.get_input_embeddings()(torch.tensor(segments.input_ids))
    got = prefill_vectors(model, by_vectors, embeddings)
    assert torch.allclose(got.logits, expected.logits, atol=1e-5) and by_vectors.next_position == by_ids.next_position
    with pytest.raises(ValueError, match="vectors"):
        prefill_vectors(model, kv.KVState(), embeddings[:, :3])
