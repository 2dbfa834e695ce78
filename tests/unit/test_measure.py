"""FLOPs estimates: the attention term counts the keys each query can see, sliding windows included."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvviz.runtime.measure import decode_flops, forward_flops, visible_key_pairs
from tests.tiny_models import tiny_gemma


def brute_force_pairs(new_tokens: int, past_tokens: int, window: int | None) -> int:
    total = 0
    for query in range(past_tokens, past_tokens + new_tokens):
        keys = range(query + 1)
        total += sum(1 for key in keys if window is None or query - key < window)
    return total


@pytest.mark.parametrize("new_tokens, past_tokens", [(1, 0), (5, 0), (8, 0), (20, 0), (3, 4), (3, 30), (12, 5), (1, 100)])
@pytest.mark.parametrize("window", [None, 1, 8])
def test_visible_key_pairs_count_what_a_causal_mask_lets_through(new_tokens, past_tokens, window):
    assert visible_key_pairs(new_tokens, past_tokens, window) == brute_force_pairs(new_tokens, past_tokens, window)


def test_sliding_layers_attend_within_their_window():
    facts = tiny_gemma().facts  # 6 layers, 4 of them sliding with a window of 8
    assert facts.sliding_window == 8 and facts.layer_types.count("sliding_attention") == 4
    everything_full = replace(facts, layer_types=("full_attention",) * facts.num_layers, sliding_window=None)
    per_pair = 4.0 * facts.num_heads * facts.head_dim
    short, long = 6, 64
    # within the window the two agree; past it the sliding layers stop growing
    assert forward_flops(facts, short, 0) == forward_flops(everything_full, short, 0)
    saved = forward_flops(everything_full, long, 0) - forward_flops(facts, long, 0)
    assert saved == per_pair * 4 * (brute_force_pairs(long, 0, None) - brute_force_pairs(long, 0, 8))
    # per-layer past lengths (KVComm: the context in some layers, the sink in the others)
    per_layer = [40, 1, 40, 1, 1, 40]
    expected_pairs = sum(
        brute_force_pairs(5, past, 8 if kind == "sliding_attention" else None)
        for past, kind in zip(per_layer, facts.layer_types)
    )
    assert forward_flops(facts, 5, per_layer) - forward_flops(facts, 5, [0] * 6) == pytest.approx(
        per_pair * (expected_pairs - sum(brute_force_pairs(5, 0, 8 if k == "sliding_attention" else None) for k in facts.layer_types))
    )
    assert decode_flops(facts, 3, per_layer) == sum(
        forward_flops(facts, 1, [past + step for past in per_layer], logits_tokens=1) for step in range(3)
    )
    with pytest.raises(ValueError, match="6 layers"):
        forward_flops(facts, 5, [1, 2])
