"""Tiny random models built from configs, with a tokenizer trained here: no weights, no network.

A Llama-like model (chat template, GQA) and a Gemma-3-like model (no chat template, one KV
head, sliding-window layers with a window of 8 so that short prompts already cross it).
"""

from __future__ import annotations

import functools

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, PreTrainedTokenizerFast

from kvviz.core.facts import facts_from_config
from kvviz.runtime import attention
from kvviz.runtime.models import LoadedModel

CORPUS = [
    "Uma is at the Mahaffie House. Which country is Uma located in? United States.",
    "The secret code word is pineapple. What is the secret code word? pineapple",
    "Question: What is the capital of France? Answer: Paris is the capital of France.",
    "Context: Mira keeps her red bicycle in the garden shed behind the old library in Lisbon.",
    "Briefly describe the most useful background to solve the problem. Answer briefly.",
    "The quick brown fox jumps over the lazy dog 0123456789 times, déjà vu, naïve café.",
    "def add(a, b): return a + b  # code, {braces} [brackets] (parens) <tags> = + - * /",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@functools.lru_cache(maxsize=None)
def tiny_tokenizer(chat: bool) -> PreTrainedTokenizerFast:
    specials = ["<unk>", "<pad>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>"]
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    backend.train_from_iterator(CORPUS * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )
    if chat:
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _build(name: str, config, tokenizer, seed: int) -> LoadedModel:
    attention.register()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention.ATTENTION_NAME, dtype=torch.float32)
    model.eval().requires_grad_(False)
    params = sum(p.numel() for p in model.parameters())
    return LoadedModel(
        name=name,
        model=model,
        tokenizer=tokenizer,
        facts=facts_from_config(name, model.config, tokenizer, params),
        source="built from config",
        load_seconds=0.0,
    )


def tiny_llama(seed: int = 0, name: str = "tiny-llama") -> LoadedModel:
    tokenizer = tiny_tokenizer(chat=True)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
    )
    return _build(name, config, tokenizer, seed)


def tiny_gemma(seed: int = 0, name: str = "tiny-gemma") -> LoadedModel:
    tokenizer = tiny_tokenizer(chat=False)
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=8, max_position_embeddings=512,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    return _build(name, config, tokenizer, seed)
