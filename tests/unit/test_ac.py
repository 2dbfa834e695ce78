"""Activation Communication (kvviz/handoffs/ac.py) on the tiny models: the exact invariant (merging
the receiver's own state changes nothing), what the run reports, when it does not apply, and that
the per-thread hook leaks neither across threads nor past an error."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from kvviz.app.methods import ac as ac_page
from kvviz.app.methods import registry as methods
from kvviz.core.plotkit import bar_counts
from kvviz.core.prompts import build_segments
from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine.runner import run_handoff
from kvviz.handoffs import registry
from kvviz.handoffs.ac import merge as ac_merge
from kvviz.handoffs.common import read_prompt
from tests.conftest import tiny_pair

pytestmark = pytest.mark.usefixtures("one_thread")

CONTEXT, QUERY = "The secret code word is pineapple.", "What is the secret code word?"


def request(**options) -> HandoffRequest:
    base = HandoffRequest(query=QUERY, context=CONTEXT, generation=GenerationSettings(max_new_tokens=6))
    return registry.get("ac").with_options(base, options)


@pytest.mark.parametrize("f", ["replace", "mean"])
def test_merging_the_receivers_own_state_equals_the_receiver_alone(tiny, f):
    """Same model, the sender reading exactly the receiver's prompt, k = j: the merged vector is
    the one already there, so every logit is the receiver alone's."""
    model = tiny.receiver
    prompt_ids = build_segments(model.tokenizer, QUERY).input_ids
    alone = read_prompt(model, prompt_ids)
    for j in (0, model.facts.num_layers - 1):
        own = ac_merge.read_layer_inputs(model, prompt_ids)[j]
        merged, states = ac_merge.receive(model, prompt_ids, own, j, f)
        assert torch.equal(merged.next_token.logits, alone.next_token.logits)
        assert torch.equal(states[j], own)


def test_a_zero_vector_summed_in_changes_nothing_and_a_real_one_does(tiny):
    model = tiny.receiver
    prompt_ids = build_segments(model.tokenizer, QUERY).input_ids
    alone = read_prompt(model, prompt_ids).next_token.logits
    zero = torch.zeros(model.facts.hidden_size)
    assert torch.equal(ac_merge.receive(model, prompt_ids, zero, 1, "sum")[0].next_token.logits, alone)
    context_state = ac_merge.read_layer_inputs(model, build_segments(model.tokenizer, QUERY, CONTEXT).context_ids)[1]
    assert not torch.allclose(ac_merge.receive(model, prompt_ids, context_state, 1, "replace")[0].next_token.logits, alone)


def test_the_run_reports_the_vector_the_layers_and_the_costs(tiny):
    layers = tiny.receiver.facts.num_layers
    result = run_handoff("ac", tiny, request(k=1, j=-1, f="sum"))
    assert result.applicable, result.reason
    assert result.details["k"] == 1 and result.details["j"] == layers - 1 and result.details["f"] == "sum"
    assert result.bytes_communicated == tiny.receiver.facts.hidden_size * 4  # float32
    assert result.communication == "activation" and result.tokens["vectors"] == 1
    assert len(result.layers) == layers
    assert [r["layer"] for r in result.layers if r["taken"]] == [1]
    assert [r["layer"] for r in result.layers if r["injected"]] == [layers - 1]
    assert all(-1.0001 <= r["cosine"] <= 1.0001 for r in result.layers)
    assert result.timings["sharer_prefill"] > 0 and result.flops["receiver"] > 0
    assert "layer 1" in result.seen["activation"] and result.seen["receiver"].count(QUERY) == 1
    assert CONTEXT not in result.seen["receiver"]
    assert methods.page_of("ac").notes(result.to_dict()) == [f"sender layer 1 -> receiver layer {layers - 1} (sum)"]


def test_the_likelihood_state_is_the_one_the_run_answered_from(tiny):
    result = run_handoff("ac", tiny, request(k=2, j=2))
    prompt = registry.get("ac").receiver_prompt(tiny, request(k=2, j=2), result)
    assert int(prompt.next_token.logits.argmax()) == result.answer_ids[0]


def test_not_applicable_without_a_context_another_width_or_a_missing_layer():
    pair = tiny_pair("llama")
    handoff = registry.get("ac")
    assert "private context" in run_handoff("ac", pair, HandoffRequest(query=QUERY)).reason
    narrow = dataclasses.replace(pair.same_shape_sender, facts=dataclasses.replace(pair.same_shape_sender.facts, hidden_size=32))
    reason = handoff.applicable(dataclasses.replace(pair, same_shape_sender=narrow), request())
    assert "same hidden size" in reason and "32" in reason and "64" in reason
    assert "does not exist" in handoff.applicable(pair, request(j=40))
    assert run_handoff("ac", pair, request(k=-4)).applicable  # -L is layer 0


def test_concurrent_runs_never_see_each_others_merge():
    """AC on one thread while the receiver alone runs on another, on the same shared model: each
    gets exactly what it gets when it runs alone."""
    pair = tiny_pair("gemma")
    ac_request = request(k=3, j=2)
    alone_request = HandoffRequest(query=QUERY, generation=GenerationSettings(max_new_tokens=6))
    expected = {"ac": run_handoff("ac", pair, ac_request).answer_ids,
                "receiver": run_handoff("receiver", pair, alone_request).answer_ids}
    assert expected["ac"] != expected["receiver"]  # the merge changes the answer
    got: dict[str, list] = {"ac": [], "receiver": []}
    errors = []

    def worker(name, req):
        try:
            torch.set_num_threads(1)
            for _ in range(8):
                got[name].append(run_handoff(name, pair, req).answer_ids)
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=("ac", ac_request)),
               threading.Thread(target=worker, args=("receiver", alone_request))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert got["ac"] == [expected["ac"]] * 8 and got["receiver"] == [expected["receiver"]] * 8


def test_the_merge_ends_with_its_block_even_on_error():
    pair = tiny_pair("llama")
    model = pair.receiver
    prompt_ids = build_segments(model.tokenizer, QUERY).input_ids
    alone = read_prompt(model, prompt_ids).next_token.logits

    def explode(hidden):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with ac_merge.on_layer_inputs(model, {0: explode}):
            read_prompt(model, prompt_ids)
    assert torch.equal(read_prompt(model, prompt_ids).next_token.logits, alone)


def test_the_figure_marks_where_the_vector_was_taken_and_merged(tiny):
    result = run_handoff("ac", tiny, request(k=1, j=2)).to_dict()
    figure = ac_page.figure(result)
    layers = tiny.receiver.facts.num_layers
    assert bar_counts(figure) == {"cosine": layers}
    markers = {t["meta"]["series"]: list(t["x"]) for t in figure.to_dict()["data"] if t["type"] == "scatter"}
    assert markers["taken"] == [1] and markers["injected"] == [2]
    assert figure.layout.height == ac_page.FIGURE_HEIGHT == ac_page.figure(None).layout.height
    off = run_handoff("ac", tiny, HandoffRequest(query=QUERY)).to_dict()
    assert "AC did not run" in ac_page.figure(off).layout.annotations[0].text.replace("<br>", " ")
