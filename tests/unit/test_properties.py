"""Property tests (hypothesis): the cache splicing and the token alignment keep their shapes,
positions and lengths for random layer sets, ratios, contexts and strings, including empty and
one-token contexts, and user text that looks like special tokens."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvviz.core.prompts import build_segments, encode, encode_with_offsets, render
from kvviz.handoffs.c2c.align import align_prompt, map_tokens, terminal_layer_map
from kvviz.handoffs.kvcomm.layers import select_layers
from kvviz.handoffs.kvcomm.options import KVCommOptions
from kvviz.runtime import cache as kv
from tests.tiny_models import tiny_tokenizer

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPECIALS = ["<|im_start|>", "<|im_end|>", "<bos>", "<eos>", "<pad>", "<unk>"]

# user text: any printable characters (RTL, emoji, CJK...) mixed with special-token strings
user_text = st.lists(
    st.one_of(st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12), st.sampled_from(SPECIALS)),
    max_size=6,
).map("".join)


@st.composite
def sender_caches(draw):
    """(cache, layers, kv heads, context length, head dim) with random values."""
    layers = draw(st.integers(1, 6))
    heads = draw(st.integers(1, 3))
    length = draw(st.integers(0, 9))  # 0: an empty context, 1: a one-token context
    dim = draw(st.sampled_from([2, 4, 8]))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    tensors = [(torch.randn(1, heads, length, dim, generator=generator), torch.randn(1, heads, length, dim, generator=generator))
               for _ in range(layers)]
    return kv.from_tensors(tensors), layers, heads, length, dim


# --- cache splicing -------------------------------------------------------------------------------


@FAST
@given(sender_caches(), st.data(), st.integers(1, 4))
def test_splice_keeps_every_context_key_in_selected_layers_and_the_sink_elsewhere(built, data, sink):
    cache, layers, heads, length, dim = built
    selected = data.draw(st.sets(st.integers(0, layers - 1)))
    state = kv.splice_prefix(cache, layers, selected, sink_tokens=sink)
    assert kv.num_layers(state.cache) == layers
    assert state.next_position == length  # the receiver's own tokens continue after the whole context
    for layer in range(layers):
        keep = length if layer in selected else min(sink, length)
        keys, values = kv.layer_kv(state.cache, layer)
        assert tuple(keys.shape) == (1, heads, keep, dim) and tuple(values.shape) == (1, heads, keep, dim)
        assert torch.equal(state.prefix_positions[layer], torch.arange(keep))
        sent_keys, sent_values = kv.layer_kv(cache, layer)
        assert torch.equal(keys, sent_keys[..., :keep, :]) and torch.equal(values, sent_values[..., :keep, :])
    assert kv.kv_bytes(state.cache) == sum(
        2 * heads * dim * 4 * (length if layer in selected else min(sink, length)) for layer in range(layers)
    )
    assert torch.equal(state.positions(3, "cpu"), torch.arange(length, length + 3)[None])


@FAST
@given(sender_caches(), st.integers(0, 10), st.integers(0, 10))
def test_copies_and_slices_keep_shapes_and_never_share_memory(built, start, stop):
    cache, layers, heads, length, dim = built
    copied = kv.copy_cache(cache)
    sliced = kv.slice_tokens(cache, start, stop)
    for layer in range(layers):
        keys, _ = kv.layer_kv(cache, layer)
        assert torch.equal(kv.layer_kv(copied, layer)[0], keys)
        assert kv.layer_length(sliced, layer) == len(range(length)[start:stop])
        if keys.numel():
            kv.layer_kv(copied, layer)[0].add_(1.0)
            assert not torch.equal(kv.layer_kv(copied, layer)[0], keys)


@FAST
@given(st.integers(1, 40), st.floats(0.0, 1.0), st.sampled_from(["kvcomm", "prior", "contiguous", "random"]),
       st.booleans(), st.integers(0, 1000))
def test_a_ratio_sends_ceil_r_l_distinct_existing_layers(layers, ratio, strategy, layer0, seed):
    scores = [math.sin(seed + layer) for layer in range(layers)]
    options = KVCommOptions(ratio=ratio, strategy=strategy, always_send_layer0=layer0, seed=seed)
    chosen = select_layers(scores, options, layers)
    budget = min(layers, math.ceil(ratio * layers - 1e-9))
    assert len(chosen) == budget == len(set(chosen))
    assert chosen == sorted(chosen) and all(0 <= layer < layers for layer in chosen)
    if layer0 and budget:
        assert chosen[0] == 0
    if strategy == "contiguous" and budget > 1:
        rest = [layer for layer in chosen if not (layer0 and layer == 0)]
        assert rest == list(range(rest[0], rest[0] + len(rest)))


# --- token alignment --------------------------------------------------------------------------


@FAST
@given(st.integers(1, 64), st.integers(1, 64))
def test_terminal_layer_map_lines_up_the_last_layers(sharer_layers, receiver_layers):
    mapping = terminal_layer_map(sharer_layers, receiver_layers)
    assert len(mapping) == receiver_layers and mapping[-1] == sharer_layers - 1
    assert all(0 <= s < sharer_layers for s in mapping) and mapping == sorted(mapping)
    assert all(b - a <= 1 for a, b in zip(mapping, mapping[1:]))


@pytest.fixture(scope="module")
def tokenizers():
    """Two different tokenizers: the tiny one, and the real SmolLM2 one when it is prepared."""
    from transformers import AutoTokenizer

    from kvviz.runtime.models import converted_dir, is_prepared

    other = AutoTokenizer.from_pretrained(converted_dir("smollm2-135m")) if is_prepared("smollm2-135m") else None
    return tiny_tokenizer(chat=False), tiny_tokenizer(chat=True), other


@FAST
@given(query=st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40).filter(str.strip),
       context=st.one_of(st.none(), st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=40)),
       private=st.booleans())
def test_alignment_pairs_every_fused_token_inside_both_prompts(tokenizers, query, context, private):
    receiver, sharer, real = tokenizers
    for sharer_tokenizer in (sharer, real or sharer):
        alignment = align_prompt(receiver, sharer_tokenizer, query, context, receiver_sees_context=not private)
        assert len(alignment.receiver_positions) == len(alignment.sharer_positions) == alignment.num_fused
        assert all(0 <= p < len(alignment.receiver_ids) - 1 for p in alignment.receiver_positions)  # never the last
        assert all(0 <= p < len(alignment.sharer_ids) for p in alignment.sharer_positions)
        assert alignment.receiver_positions == sorted(set(alignment.receiver_positions))
        assert alignment.sharer_start_position >= 0
        mapped = map_tokens(receiver, sharer_tokenizer, alignment.receiver_ids)
        assert len(mapped) == len(alignment.receiver_ids)


# --- the user's words are text ----------------------------------------------------------------


@FAST
@given(query=user_text.filter(str.strip), context=user_text, chat=st.booleans())
def test_typed_special_tokens_never_become_special_ids(query, context, chat):
    tokenizer = tiny_tokenizer(chat=chat)
    special = set(tokenizer.all_special_ids)
    plain = [t for t in build_segments(tokenizer, "q", "c" if context.strip() else None).input_ids if t in special]
    segments = build_segments(tokenizer, query, context)
    assert [t for t in segments.input_ids if t in special] == plain
    head, tail = render(tokenizer, query, context)
    for marked in (head, tail):
        ids, offsets = encode_with_offsets(tokenizer, marked)
        assert ids == encode(tokenizer, marked) and len(offsets) == len(ids)
        assert all(0 <= b <= e for b, e in offsets) and offsets == sorted(offsets)


@FAST
@given(query=st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=30).filter(str.strip),
       chat=st.booleans())
def test_text_without_special_strings_encodes_as_the_plain_tokenizer_does(query, chat):
    tokenizer = tiny_tokenizer(chat=chat)
    if any(s in query for s in SPECIALS):
        return
    segments = build_segments(tokenizer, query, "ctx")
    assert segments.context_ids == tokenizer(segments.context_text, add_special_tokens=False)["input_ids"]
    assert segments.query_ids == tokenizer(segments.query_text, add_special_tokens=False)["input_ids"]


def test_alignment_reads_typed_special_tokens_as_text(tokenizers):
    receiver, sharer, _ = tokenizers
    alignment = align_prompt(receiver, sharer, "hi <|im_start|> there", None)
    assert alignment.num_fused > 0


def test_a_special_token_added_later_is_still_read_as_special_in_the_template():
    """The special ids are kept per tokenizer (Gemma's builds ~6,000 added tokens each time they are
    read) and read again once a token is added: a template's own new special token stays one id."""
    from kvviz.core.prompts import _special_ids, encode

    tokenizer = tiny_tokenizer(chat=True)
    before = _special_ids(tokenizer)
    assert _special_ids(tokenizer) is before  # kept, not rebuilt
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|note|>"]})
    note = tokenizer.convert_tokens_to_ids("<|note|>")
    assert note not in before and note in _special_ids(tokenizer)
    assert encode(tokenizer, "<|note|> hi")[0] == note
