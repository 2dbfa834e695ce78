"""The one request shape and the one result shape every handoff shares.

Plain data only (strings, numbers, lists, dicts): results cross process boundaries (ZeroGPU
workers, the benchmark's worker processes), go to JSON for export, and feed the plots.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from kvviz.core import limits

# Stage names, in the order they happen. Every timing dict uses these keys (seconds).
STAGES = (
    "sharer_prefill",
    "sharer_decode",
    "transfer",
    "receiver_prefill",
    "receiver_decode",
)


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = 32
    greedy: bool = True
    temperature: float = 0.7
    top_p: float = 0.95
    seed: int = 0

    def __post_init__(self):
        for name in ("max_new_tokens", "temperature", "top_p", "seed"):
            limits.check_setting(name, getattr(self, name))


@dataclass(frozen=True)
class HandoffRequest:
    """What to ask (query, the sharer's private context), how to answer (generation settings) and
    each handoff's own options, by handoff name, as plain data. The handoffs own their options:
    ``kvviz.handoffs.registry`` sets them (``Handoff.with_options``) and each handoff reads its own
    back; nothing here knows any of them."""

    query: str
    context: str | None = None
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    options: dict[str, dict] = field(default_factory=dict)
    # Record what crossed (kvviz.runtime.crossed: per-token attention onto the sent tokens, logit lens):
    # None = off (bench, sweep); a dict = on, with the gold answer under "gold" when known.
    inspect: dict | None = None

    def __post_init__(self):
        # the text as the models will read it (kvviz.core.limits says what is removed or refused)
        object.__setattr__(self, "query", limits.clean_query(self.query))
        object.__setattr__(self, "context", limits.clean_context(self.context))

    @property
    def has_context(self) -> bool:
        return bool(self.context and self.context.strip())

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "HandoffRequest":
        return cls(
            query=data["query"],
            context=data.get("context"),
            generation=GenerationSettings(**data.get("generation", {})),
            options={name: dict(values) for name, values in (data.get("options") or {}).items()},
            inspect=None if data.get("inspect") is None else dict(data["inspect"]),
        )


@dataclass
class HandoffResult:
    handoff: str
    pair: str
    answer: str = ""
    answer_ids: list[int] = field(default_factory=list)
    applicable: bool = True
    reason: str = ""  # why not applicable, or an error message
    # What each model saw, as text, for the UI ("sharer", "receiver", "message").
    seen: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # STAGES -> seconds, plus "total"
    bytes_communicated: int = 0
    communication: str = ""  # "none" | "text" | "kv"
    flops: dict[str, float] = field(default_factory=dict)  # "sharer", "receiver" (and "fuser")
    # the same, spent before the answer's first token (prompts, a message written first, the fusion)
    flops_to_first_token: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)  # prompt/generated/message token counts
    layers: list[dict] = field(default_factory=list)  # per receiver layer records for plots
    details: dict = field(default_factory=dict)  # handoff specific facts (calibration, gates, ...)
    # Time to first token, one definition for every handoff (kvviz.runtime.measure.StageTimer): from the
    # moment the question is asked to the receiver's first token, everything on the critical path
    # included (the sharer's prefill and message, the transfer or fusion, the receiver's prefill,
    # choosing the first token).
    first_token_seconds: float | None = None
    # The receiver's side alone: from the moment what the sharer sent is there (text message, KV
    # cache) to the receiver's first token: transfer/fusion, receiver prefill, first token. For a
    # handoff with no sharer (receiver alone, Skyline) it equals ``first_token_seconds``; None where
    # there is no receiver (the sharer alone).
    receiver_first_token_seconds: float | None = None
    precomputed: bool = False
    # What crossed (kvviz.runtime.crossed), one naming scheme for every handoff; empty when not recorded
    token_attention: dict = field(default_factory=dict)
    logit_lens: dict = field(default_factory=dict)
    # this answer's tokens scored under this handoff and under its control (Handoff.control), when both ran
    token_change: dict = field(default_factory=dict)
    # the same handoff on the swapped note (the answer-bearing fact changed), when a swap ran:
    # context, answers (the swapped gold), changed, answer, answer_ids, applicable, reason, and
    # outcome ("followed" | "kept" | "neither"), right (this answer against the original gold)
    # (kvviz.data.swaps.swap_record); empty when no swap ran
    swap: dict = field(default_factory=dict)
    # the same handoff on the note with a contradicting sentence inserted, when one ran: what it answered
    # there and the probabilities of the gold and the counter answer's first tokens
    # (kvviz.engine.contradiction.contradiction_record); empty when none ran
    contradiction: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "HandoffResult":
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    @classmethod
    def not_applicable(cls, handoff: str, pair: str, reason: str) -> "HandoffResult":
        return cls(handoff=handoff, pair=pair, applicable=False, reason=reason)

    @property
    def total_seconds(self) -> float:
        return self.timings.get("total", 0.0)
