"""The registered pairs of models and how a pair is named.

A *pair* names a sharer (the model that knows the context or writes the message) and a receiver
(the model that answers). KVComm, its control, AC and the latent relay need a sender with the
receiver's architecture (its KV shape, its hidden size, its tokenizer); a pair names that
*same-shape sender* (``same_shape_sender``), e.g. the receiver itself, which the KVComm paper allows.
A model name is any name ``kvviz.runtime.models`` loads (an embedded key, with ``@adapter`` for a
LoRA adapter; a hub id; a local folder). Plain Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.core import policy


@dataclass(frozen=True)
class PairSpec:
    """Two models that talk: the sharer hands information to the receiver."""

    name: str
    sharer: str
    receiver: str
    description: str
    # the sender with the receiver's architecture (KVComm, AC, the latent relay); None means "the sharer"
    same_shape_sender: str | None = None
    needs_network: bool = False
    # the registered pair whose sharer (and same-shape sender) learned the opposite facts: where a
    # swap of the sharer runs (kvviz.data.swaps.Swap.pair, kvviz.engine.runner.swap_pair)
    opposite: str | None = None

    @property
    def same_shape_sender_name(self) -> str:
        return self.same_shape_sender or self.sharer

    def model_names(self) -> list[str]:
        names = [self.sharer, self.receiver, self.same_shape_sender_name]
        return list(dict.fromkeys(names))


PAIRS: dict[str, PairSpec] = {
    "embedded": PairSpec(
        name="embedded",
        sharer="smollm2-135m",
        receiver="gemma3-270m",
        same_shape_sender="gemma3-270m",
        description=(
            "Offline default: SmolLM2-135M-Instruct shares, Gemma-3-270M receives. "
            "KVComm uses Gemma-3-270M as its own sender (same architecture required)."
        ),
    ),
    "embedded-gemma": PairSpec(
        name="embedded-gemma",
        sharer="gemma3-270m",
        receiver="gemma3-270m",
        description="Gemma-3-270M talks to a copy of itself (a legitimate KVComm and C2C setup).",
    ),
    "embedded-smollm2": PairSpec(
        name="embedded-smollm2",
        sharer="smollm2-135m",
        receiver="smollm2-135m",
        description="SmolLM2-135M-Instruct talks to a copy of itself.",
    ),
    # C2C where its premise holds (issue 44): a sharer that studied a handbook of invented facts
    # (kvviz.data.handbook) the receiver never saw, and the same sharer taught the facts permuted
    "knower": PairSpec(
        name="knower",
        sharer="smollm2-135m@handbook",
        receiver="gemma3-270m",
        same_shape_sender="gemma3-270m",
        description=(
            "SmolLM2-135M-Instruct that studied a handbook of invented facts (a LoRA adapter) shares, "
            "Gemma-3-270M, which never saw it, receives."
        ),
        opposite="knower-opposite",
    ),
    "knower-opposite": PairSpec(
        name="knower-opposite",
        sharer="smollm2-135m@handbook-permuted",
        receiver="gemma3-270m",
        same_shape_sender="gemma3-270m",
        description="The knower pair with a sharer that learned the handbook's facts permuted (the swap control).",
    ),
    # KVComm needs a sender of the receiver's shape: SmolLM2 that studied the handbook sends to
    # SmolLM2 that did not
    "knower-smollm2": PairSpec(
        name="knower-smollm2",
        sharer="smollm2-135m@handbook",
        receiver="smollm2-135m",
        same_shape_sender="smollm2-135m@handbook",
        description="SmolLM2-135M-Instruct that studied the handbook sends to SmolLM2-135M-Instruct, which did not (KVComm's shape).",
        opposite="knower-smollm2-opposite",
    ),
    "knower-smollm2-opposite": PairSpec(
        name="knower-smollm2-opposite",
        sharer="smollm2-135m@handbook-permuted",
        receiver="smollm2-135m",
        same_shape_sender="smollm2-135m@handbook-permuted",
        description="The knower-smollm2 pair with a sender that learned the handbook's facts permuted (the swap control).",
    ),
    "qwen": PairSpec(
        name="qwen",
        sharer="Qwen/Qwen2.5-0.5B-Instruct",
        receiver="Qwen/Qwen3-0.6B",
        description="The C2C paper's pair (needs network or a warm hub cache; a GPU helps).",
        needs_network=True,
    ),
    "qwen3-self": PairSpec(
        name="qwen3-self",
        sharer="Qwen/Qwen3-0.6B",
        receiver="Qwen/Qwen3-0.6B",
        description="Qwen3-0.6B with itself: a KVComm-capable hub pair.",
        needs_network=True,
    ),
    "llama-3.2": PairSpec(
        name="llama-3.2",
        sharer="meta-llama/Llama-3.2-3B-Instruct",
        receiver="meta-llama/Llama-3.2-3B-Instruct",
        description="A Llama pair in the KVComm style (gated on the hub; needs a GPU).",
        needs_network=True,
    ),
}


def resolve_pair(name_or_spec: str | PairSpec) -> PairSpec:
    """A registered pair name, or 'SHARER+RECEIVER' with any two model names."""
    if isinstance(name_or_spec, PairSpec):
        return name_or_spec
    name = (name_or_spec or "").strip()
    if name in PAIRS:
        return PAIRS[name]
    if policy.public_mode():
        raise ValueError(policy.PUBLIC_PAIR_REFUSAL.format(pairs=", ".join(PAIRS)))
    if "+" in name:
        sharer, receiver = (part.strip() for part in name.split("+", 1))
        if sharer and receiver:
            return PairSpec(name=name, sharer=sharer, receiver=receiver, description="user pair")
    raise ValueError(
        f"Unknown pair '{name}'. Known pairs: {', '.join(PAIRS)}. "
        "Or give two models as 'SHARER+RECEIVER' (embedded keys, hub ids or local folders)."
    )
