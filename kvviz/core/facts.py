"""What kvviz knows about a model's shape, as plain data (no weights, no transformers).

``ModelFacts`` is read from a model's config (``facts_from_config``: any object with a
transformers config's fields) and its tokenizer (``tokenizer_fingerprint``). The handoffs check
what they need from it ("the same KV shape", "the same tokenizer") before any model runs, and the
FLOPs estimates of ``kvviz.runtime.measure`` read it: so it sits low, with no model code behind it.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelFacts:
    """What a learner (and the handoffs) need to know about a model's shape."""

    name: str
    architecture: str
    model_type: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    has_chat_template: bool
    layer_types: tuple[str, ...]
    sliding_window: int | None
    num_parameters: int | None = None
    tokenizer_hash: str | None = None

    @property
    def kv_shape_signature(self) -> tuple:
        """Two models can exchange KV layer by layer only if this matches."""
        return (self.model_type, self.num_layers, self.num_kv_heads, self.head_dim)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["layer_types"] = list(self.layer_types)
        return data


def facts_from_config(name: str, config, tokenizer=None, num_parameters=None) -> ModelFacts:
    config = config.get_text_config()
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    layer_types = tuple(getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers)
    return ModelFacts(
        name=name,
        architecture=(config.architectures or [type(config).__name__])[0],
        model_type=config.model_type,
        num_layers=config.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
        head_dim=head_dim,
        hidden_size=config.hidden_size,
        vocab_size=config.vocab_size,
        has_chat_template=bool(tokenizer is not None and getattr(tokenizer, "chat_template", None)),
        layer_types=layer_types,
        sliding_window=getattr(config, "sliding_window", None) if "sliding_attention" in layer_types else None,
        num_parameters=num_parameters,
        tokenizer_hash=tokenizer_fingerprint(tokenizer) if tokenizer is not None else None,
    )


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the vocabulary: equal hashes mean token ids can be shared as they are."""
    vocab = tokenizer.get_vocab()
    tokens_by_id = [""] * (max(vocab.values()) + 1)
    for token, token_id in vocab.items():
        tokens_by_id[token_id] = token
    # NUL cannot occur inside a token, so the joined text identifies the id -> token map
    return hashlib.sha256("\x00".join(tokens_by_id).encode("utf-8")).hexdigest()[:16]
