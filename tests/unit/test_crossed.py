"""What crossed (kvviz.runtime.crossed): the per-token attention onto the sent tokens and the
logit lens, recorded in the run through the one attention capture, on the tiny models.

The attention a run records (prefill for the first answer token, the batched decode step for the
others) must equal an eager full forward's attention over prompt + answer, row by row; the logit
lens at the last layer must equal the model's own next-token probability; recording must change no
answer and stay off when the request does not ask."""

from __future__ import annotations

import copy

import pytest
import torch

from kvviz.core.prompts import build_segments
from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine.runner import run_handoff
from kvviz.runtime import crossed
from kvviz.runtime.cache import KVState
from kvviz.runtime.decode import lens_at_first_content_token, prefill
from tests.conftest import tiny_pair

pytestmark = pytest.mark.usefixtures("one_thread")

CONTEXT = "The secret code word is pineapple."
QUERY = "What is the secret code word?"


def request(inspect: dict | None = None, tokens: int = 8) -> HandoffRequest:
    return HandoffRequest(query=QUERY, context=CONTEXT, generation=GenerationSettings(max_new_tokens=tokens), inspect=inspect)


@pytest.fixture(scope="module", params=["llama", "gemma"])
def pair(request):
    return tiny_pair(request.param)


def eager_attentions(loaded, token_ids: list[int]) -> list[torch.Tensor]:
    """Every layer's attention [heads, queries, keys] of a plain eager forward over ``token_ids``."""
    model = copy.deepcopy(loaded.model)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        output = model(input_ids=torch.tensor([token_ids]), output_attentions=True)
    return [layer[0].float() for layer in output.attentions]


def test_recorded_rows_equal_an_eager_forward_and_sum_to_at_most_one(pair):
    result = run_handoff("skyline", pair, request({}))
    data = result.token_attention
    assert data["sent_positions"] and data["nothing_sent"] is None
    prompt = build_segments(pair.receiver.tokenizer, QUERY, CONTEXT).input_ids
    answer = data["answer_ids"]
    assert answer == result.answer_ids and data["captured"] == min(len(answer), crossed.MAX_TOKENS)
    reference = eager_attentions(pair.receiver, prompt + answer)
    sent = data["sent_positions"]
    for token in range(data["captured"]):
        query_position = len(prompt) - 1 + token  # the position whose output chose this token
        for layer in range(data["layers"]):
            for head in range(data["heads"]):
                recorded = torch.tensor(data["attention"][token][layer][head])
                expected = reference[layer][head, query_position, sent]
                assert torch.allclose(recorded, expected, atol=1e-3), (token, layer, head)
                # the stored numbers are rounded to DIGITS decimals: each may be off by half a unit
                rounding = (len(sent) + 1) * 0.5 * 10 ** -crossed.DIGITS + 1e-6
                total = float(recorded.sum()) + data["other"][token][layer][head]
                assert abs(total - 1) <= rounding


def test_unrounded_rows_sum_to_one_over_all_keys(pair):
    """The capture itself (before the result rounds it): every head's row sums to 1 over its keys."""
    from kvviz.runtime.attention import AttentionRows
    from kvviz.runtime.cache import KVState

    state = KVState()
    state.token_rows = AttentionRows(limit=4)
    prompt = build_segments(pair.receiver.tokenizer, QUERY, CONTEXT).input_ids
    prefill(pair.receiver, state, prompt)
    prefill(pair.receiver, state, prompt[:1])
    assert len(state.token_rows.rows) == 2
    for row in state.token_rows.rows:
        assert sorted(row) == list(range(pair.receiver.facts.num_layers))
        for probabilities, positions in row.values():
            assert probabilities.shape == (pair.receiver.facts.num_heads, positions.numel())
            assert torch.allclose(probabilities.sum(-1), torch.ones(probabilities.shape[0]), atol=1e-5)


def test_kvcomm_rows_hold_only_the_sink_in_layers_it_did_not_send(pair):
    options = {"kvcomm": {"ratio": 0.5, "strategy": "prior"}}
    result = run_handoff("kvcomm", pair, HandoffRequest(query=QUERY, context=CONTEXT, options=options, inspect={}))
    data = result.token_attention
    assert data["sent_layers"] == sorted(result.details["selected_layers"])
    assert set(data["sent_layers"]) != set(range(data["layers"]))
    for token_rows in data["attention"]:
        for layer, heads in enumerate(token_rows):
            for row in heads:
                assert sum(row) <= 1 + len(row) * 0.5 * 10 ** -crossed.DIGITS
                if layer not in data["sent_layers"]:
                    assert all(value == 0 for value in row[1:])  # only the sink (position 0) is there


def test_logit_lens_at_the_last_layer_is_the_models_own_probability(pair):
    result = run_handoff("skyline", pair, request({"gold": "pineapple"}))
    lens = result.logit_lens
    receiver = pair.receiver
    prompt = build_segments(receiver.tokenizer, QUERY, CONTEXT).input_ids
    from kvviz.runtime.cache import KVState

    first, _ = prefill(receiver, KVState(), prompt)
    own = torch.softmax(first.logits[0], dim=-1)
    assert len(lens["layers"]) == receiver.facts.num_layers
    assert lens["answer_probability"][-1] == pytest.approx(float(own[result.answer_ids[0]]), abs=1e-5)
    assert lens["gold_token"] and lens["gold_probability"][-1] == pytest.approx(
        float(own[receiver.tokenizer.convert_tokens_to_ids(receiver.tokenizer.tokenize(lens["gold_token"]))[0]]), abs=1e-5)


@pytest.mark.parametrize("name", ["skyline", "kvcomm", "receiver", "text", "cipher", "latent_relay"])
def test_recording_changes_no_answer_and_is_off_unless_asked(pair, name):
    plain = run_handoff(name, pair, request(None))
    recorded = run_handoff(name, pair, request({}))
    assert plain.answer_ids == recorded.answer_ids
    assert plain.token_attention == {} and plain.logit_lens == {}
    assert recorded.token_attention["answer_ids"] == recorded.answer_ids
    if name == "receiver":
        assert recorded.token_attention["nothing_sent"] and recorded.token_attention["attention"] == []
    else:
        assert recorded.token_attention["sent_tokens"]


def test_request_inspect_round_trips():
    original = request({"gold": "pineapple"})
    assert HandoffRequest.from_dict(original.to_dict()) == original
    assert HandoffRequest.from_dict(request(None).to_dict()).inspect is None


def test_the_models_own_forward_records_the_same_rows_as_the_batched_step(pair, monkeypatch):
    batched = run_handoff("skyline", pair, request({})).token_attention
    monkeypatch.setenv("KVVIZ_BATCHED_DECODE", "0")
    plain = run_handoff("skyline", pair, request({})).token_attention
    assert plain["answer_ids"] == batched["answer_ids"] and plain["captured"] == batched["captured"]
    assert torch.allclose(torch.tensor(plain["attention"]), torch.tensor(batched["attention"]), atol=1e-3)


def test_the_sharer_alone_says_nothing_was_sent(pair):
    result = run_handoff("sharer", pair, request({}))
    assert result.token_attention["nothing_sent"] and result.token_attention["attention"] == []


def test_a_runs_lenses_equal_each_handoffs_own(pair):
    from kvviz.engine.stream import results

    together = results(pair, request({"gold": "pineapple"}), ["skyline", "kvcomm", "receiver"])
    for result in together:
        alone = run_handoff(result.handoff, pair, request({"gold": "pineapple"}))
        assert result.logit_lens["layers"] == alone.logit_lens["layers"]
        assert result.logit_lens["answer_probability"] == pytest.approx(alone.logit_lens["answer_probability"], abs=1e-5)
        assert result.logit_lens["gold_probability"] == pytest.approx(alone.logit_lens["gold_probability"], abs=1e-5)


def test_a_streamed_run_sends_each_lens_after_the_handoffs(pair, monkeypatch):
    from kvviz.engine import stream
    from kvviz.engine.events import Done, Lens

    events = [event for batch in stream.run(pair.name, request({}), ["skyline", "receiver"], loaded=pair) for event in batch]
    kinds = [type(event) for event in events]
    assert kinds.count(Lens) == 2 and kinds.index(Lens) > max(i for i, k in enumerate(kinds) if k is Done)
    lenses = {event.handoff: event.logit_lens for event in events if isinstance(event, Lens)}
    assert set(lenses) == {"skyline", "receiver"} and all(len(data["layers"]) == pair.receiver.facts.num_layers
                                                          for data in lenses.values())


def test_the_lens_follows_the_first_content_token_not_a_leading_space(pair):
    """An answer that starts with a whitespace-only token: the lens moves to the position that chose
    the first content token, and there equals each layer's output of a plain forward over the prompt
    and the leading space (the last layer: the model's own next-token distribution)."""
    loaded = pair.receiver
    tokenizer = loaded.tokenizer
    space = tokenizer(" ", add_special_tokens=False)["input_ids"]
    word = tokenizer("pineapple", add_special_tokens=False)["input_ids"][:1]
    assert crossed.first_content_index(tokenizer, space + word) == len(space)
    prompt = build_segments(tokenizer, QUERY, CONTEXT).input_ids
    state = KVState()
    first, _ = prefill(loaded, state, prompt)
    inspection = crossed.Inspection(answer_ids=space + word, model=loaded, lens_hidden=torch.zeros(1),
                                    prompt=(state.copy(), first.hidden))
    lens_at_first_content_token(inspection)
    assert inspection.lens_index == len(space)
    with torch.no_grad():
        full = loaded.model.model(input_ids=torch.tensor([prompt + space]), output_hidden_states=True)
    expected = crossed.layer_outputs(loaded, full)
    assert torch.allclose(inspection.lens_hidden, expected, atol=1e-4)
    assert crossed.lens_tokens(inspection)[0] == word[0]
    plain = crossed.Inspection(answer_ids=word + space, model=loaded, lens_hidden=torch.zeros(1), prompt=(state.copy(), first.hidden))
    lens_at_first_content_token(plain)
    assert plain.lens_index == 0 and plain.lens_hidden.shape == (1,)  # an answer that starts with content: unchanged


@pytest.mark.parametrize("parts", [["attention"], ["lens"], ["scores"], ["lens", "scores"]])
def test_a_recording_holds_only_the_parts_asked_for_and_changes_no_answer(pair, parts):
    """``inspect["parts"]``: what the caller shows, and nothing else, is computed (issue 42: each part
    costs its own work); the answers stay those of a run that records nothing."""
    from kvviz.engine.runner import RunContext

    run = RunContext()  # one run: C2C's receiver beside its control, so that "scores" has a pair to score
    asked = request({"parts": parts})
    results = {name: run_handoff(name, pair, asked, run=run) for name in ("receiver", "skyline")}
    plain = {name: run_handoff(name, pair, request()) for name in results}
    for name, result in results.items():
        assert result.answer_ids == plain[name].answer_ids
        assert bool(result.token_attention) == ("attention" in parts), name
        assert bool(result.logit_lens) == ("lens" in parts), name
        assert set(result.details["crossed_seconds"]) == {"lens_position", "attention_and_lens", "scoring"}
    assert bool(results["skyline"].token_change) == ("scores" in parts)  # Skyline beside the receiver alone, its control


def test_a_part_kvviz_does_not_record_is_refused(pair):
    result = run_handoff("receiver", pair, request({"parts": ["attention", "everything"]}))
    assert not result.applicable and "inspect parts must be among attention, lens, scores; got everything" in result.reason
