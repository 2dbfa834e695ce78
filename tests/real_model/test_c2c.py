"""The c2c handoff on the embedded pair: the two real tokenizers' token alignment (tokenizer files
only) and C2C with its control end to end (tests/unit/test_c2c.py runs the same on tiny models).
"""

from __future__ import annotations

import functools

import pytest

from kvviz.core.prompts import build_segments
from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine.runner import run_handoff
from kvviz.handoffs.c2c.align import align_prompt, describe, map_tokens, message_span
from tests.conftest import embedded_models_missing

HARD_TEXTS = [
    "Café crème, déjà vu, naïve façade — Zürich Straße, São Paulo, Kraków.",
    "Order #12345 costs $6,789.01 on 2024-03-15 at 07:45; π ≈ 3.14159, 1e-9.",
    "Emoji: 😀🎉👍🏽 and 🇫🇷 flags, ❤️ hearts, 日本語のテキスト, 한국어.",
    "def f(x):\n    return {'k': [x**2, x // 3]}  # code\n\tif a != b: print(f\"{a}\")",
]


def real_tokenizers():
    return _real_tokenizers()


@functools.lru_cache(maxsize=1)
def _real_tokenizers():
    from kvviz.runtime.models import converted_dir, is_prepared

    if not (is_prepared("smollm2-135m") and is_prepared("gemma3-270m")):
        embedded_models_missing("the embedded models are not prepared (python -m kvviz prepare)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(converted_dir("gemma3-270m")), AutoTokenizer.from_pretrained(converted_dir("smollm2-135m"))


@pytest.mark.real_model
@pytest.mark.parametrize("text", HARD_TEXTS)
def test_real_tokenizers_map_every_message_token_to_one_sharer_token(text):
    gemma, smollm = real_tokenizers()
    for receiver, sharer in ((gemma, smollm), (smollm, gemma)):
        alignment = align_prompt(receiver, sharer, text)
        span = message_span(receiver, text)
        assert not alignment.identical_tokenizers
        assert len(alignment.sharer_positions) == len(alignment.receiver_positions) == alignment.num_fused > 0
        # every message token (but the last prompt token) is fused; template tokens are not
        assert alignment.receiver_positions == list(range(span.start, min(span.end, len(span.input_ids) - 1)))
        message_text = receiver.decode(span.message_ids)
        assert "Question: " + text in message_text
        mapped = alignment.sharer_ids[len(alignment.sharer_ids) - alignment.num_fused :]
        assert all(isinstance(t, int) and 0 <= t < len(sharer) for t in mapped)
        # the sharer reads nearly the same text: many tokens map to exactly their own text (12 of
        # 25 for the emoji line, whose emoji SmolLM2 has no single tokens for)
        receiver_texts = [receiver.decode([t]) for t in span.message_ids[: alignment.num_fused]]
        same = sum(receiver.decode([r]) == sharer.decode([s]) for r, s in zip(span.message_ids, mapped))
        assert same >= 0.4 * len(receiver_texts)
        assert sharer.decode(alignment.sharer_ids[: alignment.sharer_positions[0]]) in sharer.decode(
            build_segments(sharer, text).input_ids
        )


@pytest.mark.real_model
def test_real_tokenizers_longest_piece():
    gemma, smollm = real_tokenizers()
    ids = gemma(" déjà", add_special_tokens=False)["input_ids"]
    assert len(ids) == 1  # one Gemma token, several SmolLM2 tokens
    [mapped] = map_tokens(gemma, smollm, ids)
    pieces = smollm(" déjà", add_special_tokens=False)["input_ids"]
    assert len(pieces) > 1 and mapped in pieces
    assert len(smollm.decode([mapped])) == max(len(smollm.decode([p])) for p in pieces)


@pytest.mark.real_model
def test_what_each_model_saw_says_which_tokens_reach_the_sharer_cut():
    """The C2C paper's "longest" alignment gives SmolLM2 ' lock' for Gemma's ' locker': the page
    says so instead of leaving "code for lock 12?" unexplained."""
    gemma, smollm = real_tokenizers()
    query = "What is the code for locker 12?"
    alignment = align_prompt(gemma, smollm, query, "The code for locker 12 is 4471.", receiver_sees_context=False)
    assert "for lock 12?" in smollm.decode(alignment.sharer_ids)
    text = describe(alignment, gemma, smollm, "longest")
    assert "' locker' read as ' lock'" in text and "longest piece" in text
    assert describe(align_prompt(gemma, gemma, query), gemma, gemma) == ""  # one tokenizer: nothing to explain


@pytest.mark.real_model
def test_embedded_pair_c2c_and_control_run(embedded_pair):
    result = run_handoff("c2c", embedded_pair, HandoffRequest(query="What is the capital of France?", generation=GenerationSettings(max_new_tokens=8)))
    if not result.applicable:
        pytest.skip(result.reason)
    assert len(result.layers) == 18 and result.communication == "kv" and result.bytes_communicated > 0
    control = run_handoff("c2c_control", embedded_pair, HandoffRequest(query="What is the capital of France?", generation=GenerationSettings(max_new_tokens=8)))
    assert control.applicable and control.details["control"]


@pytest.mark.parametrize("private", [False, True])
def test_natural_token_alignment_lets_the_sharer_read_its_own_tokens(private):
    gemma, smollm = real_tokenizers()
    query, context = "What is Raban Jeathyair's favourite colour?", "Raban Jeathyair's favourite colour is gold."
    longest = align_prompt(gemma, smollm, query, context, receiver_sees_context=not private)
    natural = align_prompt(gemma, smollm, query, context, receiver_sees_context=not private, token_alignment="natural")
    assert "Rab Jeathyair" in smollm.decode(longest.sharer_ids)  # the paper's re-encoding garbles the name
    assert smollm.decode(natural.sharer_ids).count("Raban Jeathyair") == 2  # the sharer reads it as written
    assert natural.receiver_ids == longest.receiver_ids and natural.receiver_positions == longest.receiver_positions
    assert natural.sharer_positions == sorted(natural.sharer_positions)
    for r, s in zip(natural.receiver_positions, natural.sharer_positions):
        piece = gemma.decode([natural.receiver_ids[r]])
        assert piece[-1] in smollm.decode([natural.sharer_ids[s]]), (piece, smollm.decode([natural.sharer_ids[s]]))


def test_fuse_template_pairs_the_receivers_tail_with_where_the_sharer_answers():
    gemma, smollm = real_tokenizers()
    query, context = "What is the code for locker 12?", "The code for locker 12 is 4471."
    plain = align_prompt(gemma, smollm, query, context, receiver_sees_context=False, token_alignment="natural")
    tail = align_prompt(gemma, smollm, query, context, receiver_sees_context=False, token_alignment="natural", fuse_template=True)
    added = tail.receiver_positions[plain.num_fused :]
    assert added and added[-1] == len(tail.receiver_ids) - 2  # up to the token before the last prompt token
    assert tail.sharer_positions[-1] == len(tail.sharer_ids) - 1  # with the sharer's last prompt token
    assert smollm.decode(tail.sharer_ids).endswith("<|im_start|>assistant\n")
    assert tail.receiver_positions[: plain.num_fused] == plain.receiver_positions
