"""The one request shape and the one result shape every handoff shares.

Plain data only (strings, numbers, lists, dicts): results cross process boundaries (ZeroGPU
workers, the benchmark's worker processes), go to JSON for export, and feed the plots.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from kvviz import limits, policy

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


CALIBRATIONS = ("builtin", "query", "sample")


@dataclass(frozen=True)
class KVCommOptions:
    ratio: float = 0.5
    strategy: str = "kvcomm"  # kvcomm | attention | prior | contiguous | random | explicit
    # Weight of the attention importance against the Gaussian prior. None: 1.0, the reference
    # code's default; "paper": the paper's value for the receiver's family (kvcomm.PAPER_ALPHAS).
    alpha: float | str | None = None
    mu: float | None = None  # None: the middle layer
    sigma: float = 10.0
    layers: tuple[int, ...] | None = None  # for strategy "explicit"
    seed: int = 0
    always_send_layer0: bool = True
    # Which sample's attention chooses the layers: "builtin" (kvviz's own sentence), "query" (this
    # request's context and question) or "sample" (``calibration_sample``: a (context, question)
    # pair, e.g. a task's first item, as the reference code does).
    calibration: str = "builtin"
    calibration_sample: tuple[str, str] | None = None
    # True: reproduce the reference code's prefill mask (query tokens see later query tokens in
    # unselected layers; kvviz.attention.AttentionPlan.reference_mask). False: correct causal mask.
    reference_mask: bool = False

    def __post_init__(self):
        if self.calibration not in CALIBRATIONS:
            raise ValueError(f"Unknown KVComm calibration '{self.calibration}'; choose one of {', '.join(CALIBRATIONS)}.")
        if (self.calibration == "sample") != (self.calibration_sample is not None):
            raise ValueError('KVComm calibration "sample" needs calibration_sample=(context, question), and only it does.')
        if self.calibration_sample is not None and (
            len(self.calibration_sample) != 2 or not all(isinstance(t, str) and t.strip() for t in self.calibration_sample)
        ):
            raise ValueError("calibration_sample must be two non-empty texts: (context, question).")
        if isinstance(self.alpha, str) and self.alpha != "paper":
            raise ValueError(f'KVComm alpha must be a number between 0 and 1, "paper" or None; got {self.alpha!r}.')
        if isinstance(self.alpha, (int, float)) and not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"KVComm alpha must be between 0 and 1, got {self.alpha}.")


@dataclass(frozen=True)
class HandoffRequest:
    query: str
    context: str | None = None
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    text_message_tokens: int = 64
    kvcomm: KVCommOptions = field(default_factory=KVCommOptions)
    c2c_fuser: str | None = None  # path of a fuser checkpoint; None: the pair's shipped fuser
    # other handoffs' options, by handoff name (plain data; see Handoff.with_options)
    options: dict[str, dict] = field(default_factory=dict)

    def __post_init__(self):
        # the text as the models will read it (kvviz.limits says what is removed or refused)
        object.__setattr__(self, "query", limits.clean_query(self.query))
        object.__setattr__(self, "context", limits.clean_context(self.context))
        limits.check_setting("message_tokens", self.text_message_tokens)
        if self.c2c_fuser and policy.public_mode():
            raise ValueError(policy.PUBLIC_FUSER_REFUSAL)

    @property
    def has_context(self) -> bool:
        return bool(self.context and self.context.strip())

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "HandoffRequest":
        data = dict(data)
        data["generation"] = GenerationSettings(**data.get("generation", {}))
        kvcomm = dict(data.get("kvcomm", {}))
        for key in ("layers", "calibration_sample"):  # JSON turns tuples into lists
            if kvcomm.get(key) is not None:
                kvcomm[key] = tuple(kvcomm[key])
        data["kvcomm"] = KVCommOptions(**kvcomm)
        data["options"] = {name: dict(values) for name, values in (data.get("options") or {}).items()}
        return cls(**data)


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
    flops: dict[str, float] = field(default_factory=dict)  # "sharer", "receiver"
    tokens: dict[str, int] = field(default_factory=dict)  # prompt/generated/message token counts
    layers: list[dict] = field(default_factory=list)  # per receiver layer records for plots
    details: dict = field(default_factory=dict)  # handoff specific facts (calibration, gates, ...)
    # Time to first token, one definition for every handoff: from the moment the question is asked
    # to the receiver's first token, everything on the critical path included (the sharer's prefill
    # and message, the transfer or fusion, the receiver's prefill, choosing the first token).
    first_token_seconds: float | None = None
    # The receiver's side alone: from the moment what the sharer sent is there (text message, KV
    # cache) to the receiver's first token: transfer/fusion, receiver prefill, first token. For a
    # handoff with no sharer (receiver alone, Skyline) it equals ``first_token_seconds``; None where
    # there is no receiver (the sharer alone).
    receiver_first_token_seconds: float | None = None
    precomputed: bool = False

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
