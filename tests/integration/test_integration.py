"""The real embedded pair: conversion cache, generation, and the engine invariants on real weights.

Slow (the first run converts both GGUF files, about a minute); CI runs them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from kvviz.core.prompts import build_segments
from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine.runner import run_handoff
from kvviz.handoffs.kvcomm.options import KVCommOptions
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import full_logits, prefill
from kvviz.runtime.models import converted_dir, is_prepared

pytestmark = [pytest.mark.integration, pytest.mark.real_model]

UMA_CONTEXT = "Uma is at the Mahaffie House."
UMA_QUERY = "Which country is Uma located in?"


def test_prepare_is_idempotent_and_models_lists_facts(embedded_pair):
    assert is_prepared("smollm2-135m") and is_prepared("gemma3-270m")
    done = subprocess.run([sys.executable, "-m", "kvviz", "prepare", "--pair", "embedded"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "smollm2-135m: already prepared in " + str(converted_dir("smollm2-135m")) in done.stdout
    listing = subprocess.run([sys.executable, "-m", "kvviz", "models", "--json"], capture_output=True, text=True, check=True)
    facts = {row["model"]: row for row in json.loads(listing.stdout)["models"]}
    smol, gemma = facts["smollm2-135m"], facts["gemma3-270m"]
    assert (smol["num_layers"], smol["num_heads"], smol["num_kv_heads"], smol["head_dim"]) == (30, 9, 3, 64)
    assert (gemma["num_layers"], gemma["num_heads"], gemma["num_kv_heads"], gemma["head_dim"]) == (18, 4, 1, 256)
    assert smol["has_chat_template"] and not gemma["has_chat_template"]


def test_smollm2_knows_the_capital_of_france(embedded_pair):
    request = HandoffRequest(query="What is the capital of France?", generation=GenerationSettings(max_new_tokens=16))
    result = run_handoff("sharer", embedded_pair, request)  # the sharer is SmolLM2-135M-Instruct
    assert "Paris" in result.answer, result.answer


# How far a cached prefill's logits may be from the full forward's, per numeric mode: fp32 to rounding;
# bf16 rounds each product's input rows to bfloat16, so the attention's other shape (cached keys against
# one causal pass) moves a logit by up to ~0.4 of ~40 here, the same argmax everywhere, where a cache
# one token off moves them by 5.7-26 and changes the argmax.
PREFILL_TOLERANCE = {"fp32": 2e-4, "bf16": 1.0}


@pytest.mark.parametrize("mode", ["fp32", "bf16"])
@pytest.mark.parametrize("role", ["sharer", "receiver"])
def test_cached_prefill_equals_full_forward_on_real_models(embedded_pair, role, mode):
    from kvviz.engine.runner import load_pair
    from kvviz.runtime import numerics

    if mode == "bf16" and not numerics.native_bf16():
        pytest.skip("this CPU has no native bfloat16 products (the bf16 mode is refused here)")
    pair = embedded_pair if embedded_pair.receiver.numerics == mode else load_pair("embedded", "cpu", numeric_mode=mode)
    model = getattr(pair, role)
    segments = build_segments(model.tokenizer, UMA_QUERY, UMA_CONTEXT)
    with torch.no_grad():
        reference = model.model(input_ids=torch.tensor([segments.input_ids])).logits[0, len(segments.context_ids) :]
    state = kv.KVState()
    prefill(model, state, segments.context_ids, need_logits=False)
    cached = full_logits(model, state, segments.query_ids)
    assert (cached - reference).abs().max() < PREFILL_TOLERANCE[mode]
    assert torch.equal(cached.argmax(-1), reference.argmax(-1))


def test_kvcomm_all_layers_equals_skyline_and_none_differs(embedded_pair):
    settings = GenerationSettings(max_new_tokens=8)
    context, query = "The secret code word is pineapple.", "What is the secret code word?"
    base = dict(query=query, context=context, generation=settings)
    all_layers = tuple(range(embedded_pair.receiver.facts.num_layers))
    skyline = run_handoff("skyline", embedded_pair, HandoffRequest(**base))
    everything = run_handoff("kvcomm", embedded_pair, HandoffRequest(**base, options={"kvcomm": KVCommOptions(strategy="explicit", layers=all_layers).to_dict()}))
    nothing = run_handoff("kvcomm", embedded_pair, HandoffRequest(**base, options={"kvcomm": KVCommOptions(ratio=0.0).to_dict()}))
    assert "pineapple" in skyline.answer.lower(), skyline.answer
    assert everything.answer_ids == skyline.answer_ids
    assert nothing.answer_ids != skyline.answer_ids


def test_cli_run_must_show_command():
    done = subprocess.run(
        [sys.executable, "-m", "kvviz", "run", "--pair", "embedded", "--context", UMA_CONTEXT, "--query", UMA_QUERY,
         "--handoffs", "receiver,skyline,text,kvcomm", "--max-new-tokens", "12", "--json"],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr
    results = {r["handoff"]: r for r in json.loads(done.stdout)["results"]}
    assert list(results) == ["receiver", "skyline", "text", "kvcomm"]
    for result in results.values():
        assert result["applicable"], result["reason"]
        assert result["answer"] and result["answer_ids"]
        assert result["timings"]["total"] > 0 and result["flops"]["receiver"] > 0
        assert set(result["seen"]) >= {"receiver"}
    assert results["text"]["seen"]["message"] and results["text"]["bytes_communicated"] > 0
    assert results["kvcomm"]["bytes_communicated"] > 0 and len(results["kvcomm"]["layers"]) == 18


def test_cli_runs_ac_and_cipher_with_their_per_layer_records():
    """Issue 11's must-show command: both new handoffs through the CLI on the real pair that
    shares an embedding space."""
    done = subprocess.run(
        [sys.executable, "-m", "kvviz", "run", "--pair", "embedded-gemma", "--context", UMA_CONTEXT, "--query", UMA_QUERY,
         "--handoffs", "ac,cipher", "--max-new-tokens", "8", "--message-tokens", "12", "--json"],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr
    results = {r["handoff"]: r for r in json.loads(done.stdout)["results"]}
    assert list(results) == ["ac", "cipher"]
    for result in results.values():
        assert result["applicable"], result["reason"]
        assert result["answer"] and result["bytes_communicated"] > 0
        assert len(result["layers"]) == 18  # Gemma-3-270M's layers
    assert results["ac"]["bytes_communicated"] == 640 * 4  # one float32 vector of the hidden size
    assert sum(r["injected"] for r in results["ac"]["layers"]) == 1
    assert results["cipher"]["seen"]["message"] and results["cipher"]["details"]["steps"]
