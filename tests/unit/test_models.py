"""Registry, loading errors and architecture facts (no real weights needed)."""

from __future__ import annotations

import pytest

from kvviz.core import paths
from kvviz.runtime import models
from kvviz.runtime.models import ModelLoadError, load_model, resolve_pair
from tests.tiny_models import tiny_gemma, tiny_llama


def test_registered_pairs_resolve():
    embedded = resolve_pair("embedded")
    assert embedded.sharer == "smollm2-135m" and embedded.receiver == "gemma3-270m"
    assert embedded.same_shape_sender_name == "gemma3-270m"
    assert resolve_pair("qwen").needs_network


def test_unknown_pair_lists_the_known_ones():
    with pytest.raises(ValueError, match="Unknown pair 'nope'.*embedded"):
        resolve_pair("nope")


def test_user_pair_from_two_model_names():
    pair = resolve_pair("smollm2-135m+gemma3-270m")
    assert (pair.sharer, pair.receiver, pair.same_shape_sender_name) == ("smollm2-135m", "gemma3-270m", "smollm2-135m")


def test_hub_id_without_network_says_so(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import time
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    with pytest.raises(ModelLoadError, match="hub.*HF_HUB_OFFLINE=1"):
        load_model("kvviz-tests/not-a-real-model", device="cpu")


def test_folder_without_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("no weights here")
    with pytest.raises(ModelLoadError, match="holds no model"):
        load_model(str(tmp_path), device="cpu")


def test_gguf_that_fails_to_parse(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ModelLoadError, match="broken.gguf"):
        load_model(str(bad), device="cpu")


def test_unknown_model_name():
    with pytest.raises(ModelLoadError, match="Unknown model 'nonsense'"):
        load_model("nonsense", device="cpu")


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path / "cache"))
    assert paths.cache_dir() == tmp_path / "cache"
    assert models.converted_dir("gemma3-270m") == tmp_path / "cache" / "models" / "gemma3-270m"
    assert not models.is_prepared("gemma3-270m")


def test_local_folder_round_trip(tmp_path):
    """A saved transformers folder loads through the registry with the kvviz attention."""
    tiny = tiny_llama()
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device="cpu")
    assert loaded.facts.num_layers == 4 and loaded.facts.num_kv_heads == 2 and loaded.facts.head_dim == 16
    assert loaded.facts.has_chat_template
    assert loaded.model.config._attn_implementation == "kvviz"
    assert load_model(str(tmp_path), device="cpu") is loaded  # once per process


def test_facts_of_the_tiny_models():
    llama, gemma = tiny_llama().facts, tiny_gemma().facts
    assert (llama.num_layers, llama.num_heads, llama.num_kv_heads, llama.head_dim) == (4, 4, 2, 16)
    assert gemma.sliding_window == 8 and gemma.layer_types.count("full_attention") == 2
    assert not gemma.has_chat_template and llama.has_chat_template
    assert llama.kv_shape_signature != gemma.kv_shape_signature
    assert llama.tokenizer_hash != gemma.tokenizer_hash or llama.tokenizer_hash  # hashes are computed


def test_dtype_choice():
    import torch

    assert models.parse_dtype(None, "cpu") == torch.float32
    assert models.parse_dtype("bfloat16", "cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="Unknown dtype"):
        models.parse_dtype("int3", "cpu")
