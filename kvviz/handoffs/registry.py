"""The handoff descriptor and the registry every part of kvviz reads.

Each handoff file ends with its descriptor(s) (kvpress style: a small object over the one shared
pipeline of ``kvviz.runtime.decode`` and ``kvviz.runtime.cache``): what it is called, what it needs,
its options, how it runs, its control, and what the benchmark needs from it. What the page shows of
it (its figure, the facts under its answer, its page copy) lives in the app layer, keyed by its
name (``kvviz.app.methods``). The page, the plots, the benchmark, the CLI help and the presets read
descriptors from here and never name a handoff. ``kvviz.handoffs`` registers the files'
descriptors, one line per file.

A descriptor in short::

    HANDOFFS = (Handoff(name="echo", title="Echo: the first words", label="Echo", color="#123456",
                        summary="one line", run=run, applicable=needs_context("..."),
                        options=(Option("words", ...),), no_receiver_prompt="not computed: ..."),)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from kvviz.core import limits
from kvviz.core.results import GenerationSettings, HandoffRequest, HandoffResult

if TYPE_CHECKING:  # type names only: the registry imports no model code
    from kvviz.runtime.cache import KVState
    from kvviz.runtime.decode import NextToken
    from kvviz.runtime.models import LoadedModel, LoadedPair

# What a requirement check returns: None when the handoff can run, else the reason it cannot.
Check = Callable[["LoadedPair", HandoffRequest], "str | None"]
ROLES = ("floor", "ceiling", "handoff")
OPTION_KINDS = ("float", "int", "choice", "text")


# --- options ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One setting of a handoff: a page widget, a ``run``/``bench`` flag, and optionally a bench
    sweep (one variant per listed value).

    ``auto``: when not empty, the value may be None, meaning what ``auto`` says ("the paper's alpha
    for the model family"); the page shows a checkbox for it and the CLI leaves the flag out.
    ``limit``: a setting of ``kvviz.core.limits`` whose range bounds the value (it follows the policy's
    caps, so public mode narrows it). ``check``: raises a ValueError for a value refused here (a
    custom fuser folder on a public server). ``api_name``: the page's and the ``/run`` API's name
    for it (default ``HANDOFF_OPTION``).
    """

    name: str
    label: str
    default: Any
    kind: str = "float"
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None
    step: float | None = None
    flag: str = ""  # the CLI flag; "" means --HANDOFF-NAME
    sweep_flag: str = ""  # bench: a comma-separated list, one variant per value (e.g. --ratios)
    sweep_default: str = ""
    on_page: bool = True
    auto: str = ""
    limit: str = ""
    check: Callable[[Any], None] | None = None
    api_name: str = ""

    def __post_init__(self):
        if self.kind not in OPTION_KINDS:
            raise ValueError(f"option {self.name}: kind must be one of {', '.join(OPTION_KINDS)}, not {self.kind!r}")
        if self.kind == "choice" and self.default not in self.choices:
            raise ValueError(f"option {self.name}: default {self.default!r} is not one of its choices {self.choices}")

    def cli_flag(self, handoff: str) -> str:
        return self.flag or f"--{handoff}-{self.name}".replace("_", "-")

    def page_name(self, handoff: str) -> str:
        """The page's and the ``/run`` API's parameter name."""
        return self.api_name or f"{handoff}_{self.name}"

    def bounds(self) -> tuple[float | None, float | None]:
        """(minimum, maximum): the ``limit`` setting's range now, else the option's own."""
        if self.limit:
            setting = limits.settings()[self.limit]
            return setting.minimum, setting.maximum
        return self.minimum, self.maximum

    def parse(self, value: Any) -> Any:
        """The value in its kind, checked; None or "" give the default (None when ``auto``)."""
        if value is None or (isinstance(value, str) and not value.strip() and self.kind != "text"):
            return None if self.auto else self.default
        if self.kind in ("float", "int"):
            parsed: Any = limits.parse_number(self.label, value, integer=self.kind == "int")
            minimum, maximum = self.bounds()
            if minimum is not None or maximum is not None:
                low = float("-inf") if minimum is None else minimum
                high = float("inf") if maximum is None else maximum
                limits.check_range(self.label, parsed, low, high)
        else:
            parsed = str(value).strip() if self.kind == "choice" else str(value)
            if self.kind == "choice" and parsed not in self.choices:
                raise ValueError(f"{self.label}: {parsed!r} is not one of {', '.join(map(str, self.choices))}.")
        if self.check is not None:
            self.check(parsed)
        return parsed

    def parse_list(self, text: str) -> list:
        """A comma-separated list of values (a bench sweep)."""
        return [self.parse(part) for part in str(text).split(",") if part.strip()]


def option_values(request: HandoffRequest, name: str, options: tuple[Option, ...]) -> dict:
    """A handoff's option values as ``with_options`` stored them in ``request.options`` (the
    defaults for a request built without them)."""
    return parse_values(options, request.options.get(name))


def parse_values(options: tuple[Option, ...], given: dict | None) -> dict:
    """Every option's value: the given ones checked, the others at their defaults."""
    given = given or {}
    unknown = sorted(set(given) - {option.name for option in options})
    if unknown:
        raise ValueError(f"Unknown option(s) {', '.join(unknown)}; known: {', '.join(o.name for o in options) or 'none'}.")
    return {option.name: option.parse(given.get(option.name)) for option in options}


# --- what a handoff needs ---------------------------------------------------------------------


class NotApplicable(ValueError):
    """Raised by a handoff's run when it finds, only while running, that it cannot run here (a
    checkpoint that will not load): the engine makes it the not-applicable result, with this reason.
    Everything that can be known before a model runs is the descriptor's ``applicable`` check."""


def always(pair, request) -> None:
    return None


def needs_context(reason: str) -> Check:
    """A check that fails with ``reason`` when the request has no private context."""

    def check(pair, request: HandoffRequest) -> str | None:
        return None if request.has_context else reason

    return check


def all_of(*checks: Check) -> Check:
    """The first failing check's reason, or None."""

    def check(pair, request):
        for one in checks:
            reason = one(pair, request)
            if reason:
                return reason
        return None

    return check


# --- the descriptor ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ReceiverPrompt:
    """The receiver right after reading its prompt the way a handoff left it: what the
    benchmark's likelihood scoring continues from (``next_token`` predicts the first answer token)."""

    model: "LoadedModel"
    state: "KVState"
    next_token: "NextToken"
    last_token: int  # the prompt's last token (whether an option continues it after a space)


@dataclass(frozen=True)
class TaskCalibration:
    """A handoff that calibrates on one sample of a task (KVComm chooses its layers on a task's first
    item, as its reference code does). The benchmark gives it the task's first sample, which is then
    not scored, unless the option ``unless_option`` was given (it says how to calibrate instead)."""

    apply: Callable[[HandoffRequest, str, str], HandoffRequest]  # (request, context, question) -> calibrated request
    unless_option: str = ""


@dataclass(frozen=True)
class Handoff:
    """Everything the lab needs to know about one way for two models to talk."""

    name: str  # the registry name: CLI, API, result rows
    title: str  # column head and figure legends
    label: str  # short, for plot axes
    color: str  # one colour per handoff, the same everywhere
    summary: str  # one line: CLI help, the column's subtitle
    run: Callable[..., HandoffResult]  # run(pair, request, io: kvviz.handoffs.common.HandoffIO) -> HandoffResult
    needs: tuple[str, ...] = ()  # what it needs, in words ("a private context", "a trained fuser")
    applicable: Check = always  # says "not applicable" at once, without running a model
    options: tuple[Option, ...] = ()
    # puts option values into a request; None: they go to request.options[name]
    apply_options: Callable[[HandoffRequest, dict], HandoffRequest] | None = None
    variant_label: Callable[[dict], str] | None = None  # bench row name from the swept values
    # the benchmark's likelihood column: the receiver after its prompt, or why it cannot be rebuilt
    receiver_prompt: Callable[["LoadedPair", HandoffRequest, HandoffResult], ReceiverPrompt] | None = None
    no_receiver_prompt: str = ""
    role: str = "handoff"  # "floor": nothing shared; "ceiling": sees everything; "handoff"
    default: bool = False  # runs when nobody names the handoffs (the CLI, the bench, the page's first columns)
    # how many tokens it may generate before the answer (a message the receiver waits for): the
    # prompt budget (kvviz.core.limits) and ZeroGPU's duration estimate count them; None: none
    message_tokens: Callable[[HandoffRequest], int] | None = None
    task_calibration: TaskCalibration | None = None  # see TaskCalibration
    # the handoff that is this one's control (the same receiver without what this one sends, or fed an
    # unrelated context): when both ran in one run that recorded what crossed, this one's answer
    # tokens are scored under the control's prompt too (``token_change``, kvviz.engine.runner)
    control: str = ""

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"handoff {self.name}: role must be one of {', '.join(ROLES)}")
        if self.receiver_prompt is None and not self.no_receiver_prompt:
            raise ValueError(f"handoff {self.name}: without receiver_prompt, say why in no_receiver_prompt")

    def option(self, name: str) -> Option:
        for option in self.options:
            if option.name == name:
                return option
        raise KeyError(f"{self.name} has no option {name!r}")

    def with_options(self, request: HandoffRequest, given: dict | None = None) -> HandoffRequest:
        """The request with this handoff's options set (the given ones checked, others default)."""
        values = parse_values(self.options, given)
        if self.apply_options is not None:
            return self.apply_options(request, values)
        return dataclasses.replace(request, options={**request.options, self.name: values})

    def swept_options(self) -> list[Option]:
        return [option for option in self.options if option.sweep_flag]

    def label_variant(self, values: dict) -> str:
        return self.variant_label(values) if self.variant_label and values else self.name

    def tokens_before_answer(self, request: HandoffRequest) -> int:
        """The ``message_tokens`` hook's count for this request (0 without the hook)."""
        return int(self.message_tokens(request)) if self.message_tokens is not None else 0

    def not_applicable(self, pair_name: str, reason: str) -> HandoffResult:
        return HandoffResult.not_applicable(self.name, pair_name, reason)


# --- the registry -----------------------------------------------------------------------------

HANDOFFS: dict[str, Handoff] = {}


def register(*handoffs: Handoff) -> None:
    for handoff in handoffs:
        if not isinstance(handoff, Handoff):
            raise TypeError(f"register() takes Handoff descriptors, got {type(handoff).__name__}")
        HANDOFFS[handoff.name] = handoff


def register_module(module) -> None:
    """Register the descriptors a handoff file ends with (its ``HANDOFFS`` tuple)."""
    descriptors = getattr(module, "HANDOFFS", None)
    if not descriptors:
        raise ValueError(f"{module.__name__} ends with no HANDOFFS tuple of descriptors")
    register(*descriptors)


def get(name: str) -> Handoff:
    if name not in HANDOFFS:
        raise ValueError(f"Unknown handoff '{name}'; choose from {', '.join(HANDOFFS)}.")
    return HANDOFFS[name]


def all_handoffs() -> list[Handoff]:
    """Every registered handoff, in registration order (the order of every table)."""
    return list(HANDOFFS.values())


def default_handoffs() -> list[str]:
    """What runs when nobody names the handoffs, in registration order."""
    return [h.name for h in HANDOFFS.values() if h.default]


def with_role(role: str) -> list[Handoff]:
    return [h for h in HANDOFFS.values() if h.role == role]


def control_of(name: str) -> str:
    """The handoff that is ``name``'s control ("" when it has none)."""
    return HANDOFFS[name].control if name in HANDOFFS else ""


def controlled_by(name: str) -> list[str]:
    """The handoffs whose control is ``name``, in registration order."""
    return [h.name for h in HANDOFFS.values() if h.control == name]


def color_of(name: str) -> str:
    return HANDOFFS[name].color if name in HANDOFFS else "#444444"


def label_of(name: str) -> str:
    return HANDOFFS[name].label if name in HANDOFFS else name


def title_of(name: str) -> str:
    return HANDOFFS[name].title if name in HANDOFFS else name


def parse_handoffs(names: str | list[str]) -> list[str]:
    """Handoff names from "a,b" or a list; "all" means every registered handoff."""
    if isinstance(names, str):
        names = [name.strip() for name in names.split(",") if name.strip()]
    if list(names) == ["all"]:
        return list(HANDOFFS)
    unknown = [name for name in names if name not in HANDOFFS]
    if unknown:
        raise ValueError(f"Unknown handoff(s) {', '.join(unknown)}; choose from {', '.join(HANDOFFS)}.")
    if not names:
        raise ValueError("Name at least one handoff.")
    return list(names)


def request_with_options(request: HandoffRequest, given: dict[str, dict] | None = None) -> HandoffRequest:
    """Set every registered handoff's options: ``given`` maps handoff name -> {option: value}."""
    given = given or {}
    unknown = sorted(set(given) - set(HANDOFFS))
    if unknown:
        raise ValueError(f"Options for unknown handoff(s) {', '.join(unknown)}.")
    for handoff in HANDOFFS.values():
        if handoff.options:
            request = handoff.with_options(request, given.get(handoff.name))
    return request


def build_request(
    query: str,
    context: str | None = None,
    max_new_tokens: int = 32,
    sample: bool = False,
    temperature: float = 0.7,
    seed: int = 0,
    options: dict[str, dict] | None = None,
    inspect: dict | None = None,
) -> HandoffRequest:
    """A request from the settings every surface shares (page form, CLI flags, bench) plus each
    handoff's options (handoff name -> {option: value}; the others at their defaults).
    ``inspect``: record what crossed (``HandoffRequest.inspect``; None = off).
    A ValueError says what is wrong in plain words."""
    setting = limits.settings()
    number = lambda name, value: limits.parse_number(setting[name].label, value, setting[name].integer)  # noqa: E731
    request = HandoffRequest(
        query=query,
        context=context,
        generation=GenerationSettings(
            max_new_tokens=number("max_new_tokens", max_new_tokens), greedy=not sample,
            temperature=number("temperature", temperature), seed=number("seed", seed or 0),
        ),
        inspect=inspect,
    )
    return request_with_options(request, options)


def tokens_before_answer(request: HandoffRequest, names: list[str] | None = None) -> int:
    """The most tokens any of these handoffs (default: every registered one) generates before its
    answer (``Handoff.message_tokens``)."""
    chosen = [HANDOFFS[name] for name in names] if names is not None else list(HANDOFFS.values())
    return max((handoff.tokens_before_answer(request) for handoff in chosen), default=0)
