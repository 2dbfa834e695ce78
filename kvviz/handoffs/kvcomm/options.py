"""KVComm's options: what decides its layers (``KVCommOptions``, held in ``request.options["kvcomm"]``
as plain data), read and changed in a request (``options_of``, ``configure``), and the same options
as the descriptor's page widgets and command-line flags (``OPTIONS``, ``apply_options``). The
strategies themselves and the layer choice are ``kvviz.handoffs.kvcomm.layers``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvviz.core.results import HandoffRequest
from kvviz.handoffs.registry import Option

NAME = "kvcomm"
CALIBRATIONS = ("builtin", "query", "sample")
# every strategy by name (kvviz.handoffs.kvcomm.layers.STRATEGIES says how each chooses)
STRATEGY_NAMES = ("kvcomm", "attention", "prior", "contiguous", "random", "explicit")


# --- the options ----------------------------------------------------------------------------


@dataclass(frozen=True)
class KVCommOptions:
    """Everything that decides KVComm's layers. Stored in ``request.options["kvcomm"]`` as plain
    data (``to_dict``); the descriptor's page / CLI options set some of it (``apply_options``),
    ``configure`` any of it (the benchmark's task calibration, the studies)."""

    ratio: float = 0.5
    strategy: str = "kvcomm"  # one of STRATEGY_NAMES (kvviz.handoffs.kvcomm.layers.STRATEGIES)
    # Weight of the attention importance against the Gaussian prior. None: 1.0, the reference
    # code's default; "paper": the paper's value for the receiver's family (PAPER_ALPHAS).
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
    # unselected layers; kvviz.runtime.attention.AttentionPlan.reference_mask). False: correct causal mask.
    reference_mask: bool = False

    def __post_init__(self):
        if self.strategy not in STRATEGY_NAMES:
            raise ValueError(f"Unknown KVComm strategy '{self.strategy}'; choose one of {', '.join(STRATEGY_NAMES)}.")
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

    def to_dict(self) -> dict:
        """Plain data (JSON's lists for the tuples), as a request holds it."""
        data = dataclasses.asdict(self)
        for key in ("layers", "calibration_sample"):
            if data[key] is not None:
                data[key] = list(data[key])
        return data

    @classmethod
    def from_dict(cls, data: dict | None) -> "KVCommOptions":
        data = dict(data or {})
        for key in ("layers", "calibration_sample"):  # JSON turns tuples into lists
            if data.get(key) is not None:
                data[key] = tuple(data[key])
        return cls(**data)


def options_of(request: HandoffRequest) -> KVCommOptions:
    """The request's KVComm options (the defaults when it has none)."""
    return KVCommOptions.from_dict(request.options.get(NAME))


def configure(request: HandoffRequest, **changes) -> HandoffRequest:
    """The request with some KVComm options changed (the others kept)."""
    options = dataclasses.replace(options_of(request), **changes)
    return dataclasses.replace(request, options={**request.options, NAME: options.to_dict()})


def calibrate_on_sample(request: HandoffRequest, context: str, question: str) -> HandoffRequest:
    """Calibrated on one (context, question): the benchmark's task calibration."""
    return configure(request, calibration="sample", calibration_sample=(context, question))


# --- the options as page widgets and command-line flags ------------------------------------


def parse_layers(text: str) -> tuple[int, ...] | None:
    """ "7, 0,3" -> (0, 3, 7); empty -> None."""
    if not text or not text.strip():
        return None
    try:
        return tuple(sorted({int(part) for part in text.replace(" ", ",").split(",") if part.strip()}))
    except ValueError as error:
        raise ValueError(f"Explicit layers must be numbers separated by commas, e.g. 0,3,7 (got {text!r}).") from error


def apply_options(request: HandoffRequest, values: dict) -> HandoffRequest:
    """The page's and the CLI's options into the request's ``KVCommOptions`` (the others kept);
    explicit layers override the strategy."""
    layers = parse_layers(values["layers"])
    return configure(
        request,
        ratio=values["ratio"],
        strategy="explicit" if layers else values["strategy"],
        alpha=values["alpha"],
        sigma=values["sigma"],
        layers=layers,
        seed=request.generation.seed,
        calibration=values.get("calibration") or "builtin",
        calibration_sample=None,
    )


def variant_label(values: dict) -> str:
    """Bench rows: "kvcomm@0.3" (the paper's score), "kvcomm-random@0.5" ..."""
    prefix = "kvcomm" if values["strategy"] == "kvcomm" else f"kvcomm-{values['strategy']}"
    return f"{prefix}@{values['ratio']:g}"


SELECTABLE_STRATEGIES = tuple(s for s in STRATEGY_NAMES if s != "explicit")  # explicit: give layers
# page and ``run``: the built-in sample or this query; ``bench`` calibrates on the task's first sample
# unless --calibration is given (kvviz.studies.bench.run)
CALIBRATION_CHOICES = ("builtin", "query")

# the descriptor's options: apply_options puts their values into the request's KVCommOptions
OPTIONS = (
    Option("ratio", "KVComm ratio r (share of layers sent)", 0.5, minimum=0.0, maximum=1.0, step=0.05,
           flag="--ratio", sweep_flag="--ratios", sweep_default="0.3,0.5,0.7"),
    Option("strategy", "KVComm layer selection", "kvcomm", kind="choice", choices=SELECTABLE_STRATEGIES,
           flag="--strategy", sweep_flag="--strategies", sweep_default="kvcomm"),
    Option("alpha", "alpha (weight of attention vs prior)", 1.0, minimum=0.0, maximum=1.0, step=0.05,
           flag="--alpha", auto="The reference code's alpha, 1.0"),
    Option("sigma", "sigma (width of the Gaussian prior, layers)", 10.0, minimum=0.5, maximum=30.0, step=0.5,
           flag="--sigma"),
    Option("layers", "KVComm explicit layers (e.g. 0,3,7; overrides the strategy)", "", kind="text",
           flag="--layers"),
    Option("calibration", "KVComm calibration (whose attention chooses the layers: the builtin sample or this query)", "builtin", kind="choice",
           choices=CALIBRATION_CHOICES, flag="--calibration"),
)
