"""The result contract, for every registered handoff: what the page, the plots, the benchmark and the
API read from any result (one parametrised test, no handoff special-cased in its checks)."""

from __future__ import annotations

import json

import pytest

from kvviz.core.results import STAGES, HandoffResult
from kvviz.engine.runner import run_handoff
from kvviz.handoffs import registry
from tests.conftest import tiny_pair, untrained_checkpoints

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pair():
    """A tiny pair every handoff can run on (one architecture: same-shape sender, shared tokenizer)."""
    return tiny_pair("gemma")


@pytest.fixture(scope="module")
def request_for_all(pair, tmp_path_factory):
    """A private-context request with every handoff's options at their defaults, and an untrained
    fuser pair (C2C and its control) and KV translator saved for the tiny pair so that they run too."""
    return registry.build_request("What is the secret code word?", "The secret code word is pineapple.", 4,
                                  options=untrained_checkpoints(pair, tmp_path_factory.mktemp("fusers")))


@pytest.mark.parametrize("name", [handoff.name for handoff in registry.all_handoffs()])
def test_every_handoff_keeps_the_result_contract(name, pair, request_for_all):
    result = run_handoff(name, pair, request_for_all)
    assert result.handoff == name and result.pair == pair.name
    assert result.applicable, result.reason  # every handoff runs on this pair and request
    # timings: the shared stages and the total, none negative, the stages within the total
    assert set(result.timings) == set(STAGES) | {"total"}
    assert all(seconds >= 0 for seconds in result.timings.values())
    assert sum(result.timings[stage] for stage in STAGES) <= result.timings["total"] + 1e-6
    # one time to first token: after the question, within the run; the receiver's side within it
    assert 0 < result.first_token_seconds <= result.timings["total"] + 1e-6
    if result.receiver_first_token_seconds is not None:
        assert 0 < result.receiver_first_token_seconds <= result.first_token_seconds + 1e-9
    # what crossed, what it cost
    assert result.bytes_communicated >= 0 and result.communication
    assert result.flops and all(value >= 0 for value in result.flops.values())
    assert set(result.flops_to_first_token) <= set(result.flops)
    assert all(result.flops_to_first_token[model] <= result.flops[model] + 1e-6 for model in result.flops_to_first_token)
    assert result.tokens.get("generated", 0) == len(result.answer_ids)
    # per-layer records: one per layer, each naming its layer, in order
    layers = [record["layer"] for record in result.layers]
    assert layers == sorted(layers) and len(set(layers)) == len(layers)
    assert all(isinstance(record, dict) for record in result.layers)
    # plain data that survives JSON both ways (the API, the exports, ZeroGPU's workers)
    again = HandoffResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result
