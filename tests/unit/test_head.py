"""The output head: the fast greedy path must pick exactly the token the full head picks."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from kvviz.runtime import head as head_module
from kvviz.runtime.head import GROUP_SIZE, OutputHead, quantize_int4


def wide_vocabulary_model(vocabulary: int = 20000, hidden: int = 64):
    """A random model whose vocabulary is big enough for the scan index to be built."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocabulary, hidden_size=hidden, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def test_int4_quantisation_is_within_half_a_step_of_the_weights():
    torch.manual_seed(1)
    weight = torch.randn(64, 4 * GROUP_SIZE) * 0.05
    packed, scales_and_zeros = quantize_int4(weight)
    # dequantise through the kernel: a one-hot input reads one column of the weights back
    columns = torch.eye(weight.shape[1], dtype=torch.bfloat16)
    restored = torch.ops.aten._weight_int4pack_mm_for_cpu(columns, packed, GROUP_SIZE, scales_and_zeros).float().T
    scale = scales_and_zeros[..., 0].float().T.repeat_interleave(GROUP_SIZE, dim=1)
    # half a quantisation step, plus bfloat16 rounding of the scale, zero and output
    assert ((restored - weight).abs() <= 0.5 * scale + 0.02 * weight.abs().amax()).all()


def test_fast_greedy_token_equals_the_full_argmax_on_many_hidden_states():
    model = wide_vocabulary_model()
    head = OutputHead(model)
    assert head.scan_index() is not None, "the int4 kernel should exist on this CPU build"
    torch.manual_seed(2)
    for scale in (0.1, 1.0, 10.0, 100.0):
        for _ in range(25):
            hidden = torch.randn(1, 64) * scale
            assert head.greedy_token(hidden) == int(torch.argmax(head.logits(hidden)))


def test_ties_go_to_the_lowest_token_id_as_torch_argmax_does():
    model = wide_vocabulary_model()
    with torch.no_grad():
        weight = model.get_output_embeddings().weight
        weight[7] = weight[19999] = weight[12345] = torch.full((64,), 0.5)
    head = OutputHead(model)
    hidden = torch.ones(1, 64)
    assert head.greedy_token(hidden) == int(torch.argmax(head.logits(hidden))) == 7


def test_small_vocabularies_use_the_full_head():
    model = wide_vocabulary_model(vocabulary=1000)
    assert OutputHead(model).scan_index() is None


def test_the_index_is_kept_on_disk_and_a_damaged_file_is_rebuilt(tmp_path, monkeypatch):
    model = wide_vocabulary_model()
    first = OutputHead(model, cache_folder=tmp_path).scan_index()
    files = list(tmp_path.glob("head-int4-*.safetensors"))
    assert len(files) == 1
    calls = []
    real_quantize = head_module.quantize_int4
    monkeypatch.setattr(head_module, "quantize_int4", lambda weight: calls.append(1) or real_quantize(weight))
    again = OutputHead(model, cache_folder=tmp_path).scan_index()
    assert not calls, "a second head for the same weights reads the index from disk"
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    files[0].write_bytes(b"not a safetensors file")
    rebuilt = OutputHead(model, cache_folder=tmp_path).scan_index()
    assert calls and torch.equal(first[0], rebuilt[0])


def test_other_weights_get_their_own_index(tmp_path):
    one, other = wide_vocabulary_model(), wide_vocabulary_model()
    with torch.no_grad():
        other.get_output_embeddings().weight.mul_(2)
    OutputHead(one, cache_folder=tmp_path).scan_index()
    OutputHead(other, cache_folder=tmp_path).scan_index()
    assert len(list(tmp_path.glob("head-int4-*.safetensors"))) == 2


def test_log_probabilities_match_the_exact_log_softmax_within_a_hundredth_of_a_nat():
    model = wide_vocabulary_model()
    head = OutputHead(model)
    torch.manual_seed(3)
    for scale in (0.3, 3.0, 30.0):
        hidden = torch.randn(12, 64) * scale
        tokens = torch.randint(0, 20000, (12,)).tolist()
        tokens[0] = int(torch.argmax(head.logits(hidden[:1])))  # a likely one too
        exact = torch.log_softmax(head.logits(hidden), dim=-1).gather(1, torch.tensor(tokens)[:, None])[:, 0]
        assert head.log_probabilities(hidden, tokens) == pytest.approx(exact.tolist(), abs=0.01)
    small = OutputHead(wide_vocabulary_model(vocabulary=1000))  # the exact path: equal to the last bit
    hidden = torch.randn(3, 64)
    exact = torch.log_softmax(small.logits(hidden), dim=-1)[:, :3].diagonal()
    assert small.log_probabilities(hidden, [0, 1, 2]) == exact.tolist()
