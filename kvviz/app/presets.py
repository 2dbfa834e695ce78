"""Presets for the lab and the small built-in set for the KVComm sweep.

The presets are data: ``assets/presets.toml`` (its header explains every field). Each holds a
question, its gold answers and the lesson its precomputed results show. All examples are written
for this project (none is copied from a dataset). Two scenarios:

* **private context** (KVComm style): only the senders read a short context; the receiver gets the
  question alone and must learn the missing fact from them.
* **shared question** (C2C style): both models see the same question; the sharer's cache (or its
  written background) should help the receiver answer better.

Precomputed results for the presets (``scripts/precompute_presets.py``) live in
``assets/precomputed/presets.json`` and paint the page before any model has run;
``tests/unit/test_presets.py`` checks each preset's ``check`` against them. They are stored once per
numeric mode (``kvviz.runtime.numerics``): ``presets.json`` in bf16 (a CPU with bfloat16 products),
``presets-fp32.json`` in fp32 (any other CPU), and the same for the sweep; a page shows the ones of
the mode its live runs compute in, so that **Run live** on a preset gives the answers its lesson was
checked against.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from kvviz.app.reading import catalog
from kvviz.app.reading.questions import Claim, parse_claims
from kvviz.core.paths import ASSETS, PRECOMPUTED
from kvviz.data.contradictions import Contradiction, contradiction_from_swap
from kvviz.data.swaps import OPPOSITE, Swap, replace_fact, sharer_swap
from kvviz.runtime import numerics
from kvviz.runtime.pairs import PAIRS

PRESETS_PATH = ASSETS / "presets.toml"
PRECOMPUTED_PATH = PRECOMPUTED / "presets.json"  # the stored runs of FIRST_MODE; another mode's beside it
PRECOMPUTED_SWEEP_PATH = PRECOMPUTED / "sweep.json"
FIRST_MODE = "bf16"  # the numeric mode of the files without a mode in their name
SCENARIOS = ("private", "shared")
TABS = ("layers", "cost")


def claims_of(check: dict, where: str) -> list[Claim]:
    """A ``check`` table's claims (questions of the one vocabulary, ``kvviz.app.reading.questions``);
    a ValueError lists every problem, one line each."""
    claims, problems = parse_claims(check, where)
    if problems:
        raise ValueError("\n".join(problems))
    return claims


@dataclass(frozen=True)
class PresetRun:
    """Another run stored with a preset: some handoffs with other options (``label`` says which)."""

    label: str
    handoffs: tuple[str, ...]
    options: dict  # handoff -> option -> value
    check: dict = field(default_factory=dict)

    @property
    def claims(self) -> list[Claim]:
        return claims_of(self.check, self.label)


@dataclass(frozen=True)
class Preset:
    key: str
    title: str
    scenario: str  # "private" | "shared"
    query: str
    context: str | None
    answers: tuple[str, ...]
    subject: str = "The answer"  # the verdict strip's subject
    lesson: str = ""  # what its precomputed results show, in plain words
    tab: str | None = None  # where the lesson is seen (TABS), if anywhere below the answers
    handoffs: tuple[str, ...] = ()  # the columns it ticks; empty: the page's default
    shows: tuple[str, ...] = ()  # the kinds of lesson it stands for
    check: dict = field(default_factory=dict)  # claims about its run (see assets/presets.toml)
    runs: tuple[PresetRun, ...] = ()
    swap: Swap | None = None  # its note with the answer-bearing fact changed (a stored swap run)
    swap_words: tuple[str, ...] = ()  # (what the swap replaces, by what): the page's swap fields
    pair: str | None = None  # the registered pair its stored run is on (None: the presets file's pair)

    @property
    def claims(self) -> list[Claim]:
        """What its lesson says its stored run shows, as questions of the one vocabulary."""
        return claims_of(self.check, self.key)

    @property
    def contradiction(self) -> Contradiction | None:
        """Its note with one more sentence after the fact's, stating the swap's other value (the
        swapped note's version of that sentence, ``kvviz.data.contradictions``): the page's default
        for *Insert a contradiction*; None without a swap of its note (a swap of the sharer changes no
        sentence)."""
        if self.swap is None or self.swap.pair is not None or not self.context:
            return None
        return contradiction_from_swap(self.context, self.swap)

    @property
    def columns(self) -> list[str]:
        """The columns it ticks: its own list, else the page's default ones, in page order."""
        return catalog.in_page_order(self.handoffs or catalog.defaults())

    @property
    def label(self) -> str:
        kind = "private context" if self.scenario == "private" else "shared question"
        return f"{self.title} ({kind})"

    def to_dict(self) -> dict:
        data = asdict(self)
        data["answers"] = list(self.answers)
        data["swap"] = None if self.swap is None else self.swap.to_dict()
        return data


def _preset(raw: dict) -> Preset:
    """One ``[[preset]]`` table as a Preset; a ValueError names the preset and what is wrong."""
    key = raw.get("key", "?")
    known = {f for f in Preset.__dataclass_fields__}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"preset {key}: unknown field(s) {', '.join(unknown)}")
    if raw.get("scenario") not in SCENARIOS:
        raise ValueError(f"preset {key}: scenario must be one of {', '.join(SCENARIOS)}")
    if raw.get("tab") is not None and raw["tab"] not in TABS:
        raise ValueError(f"preset {key}: tab must be one of {', '.join(TABS)}")
    if raw.get("pair") is not None and raw["pair"] not in PAIRS:
        raise ValueError(f"preset {key}: pair must be a registered pair ({', '.join(PAIRS)})")
    claims_of(raw.get("check", {}), f"preset {key}")
    for run in raw.get("runs", []):
        claims_of(run.get("check", {}), f"preset {key}, {run.get('label', '?')}")
    runs = tuple(PresetRun(run["label"], tuple(run["handoffs"]), run.get("options", {}), run.get("check", {}))
                 for run in raw.get("runs", []))
    return Preset(**{**raw, "context": raw.get("context") or None, "answers": tuple(raw["answers"]),
                     "handoffs": tuple(raw.get("handoffs", ())), "shows": tuple(raw.get("shows", ())), "runs": runs,
                     "swap": _swap(key, raw),
                     "swap_words": (raw["swap"]["replace"], raw["swap"]["by"]) if raw.get("swap", {}).get("replace") else ()})


def _swap(key: str, raw: dict) -> Swap | None:
    """A preset's ``swap = {replace, by, answers}``: its note with ``replace`` changed to ``by``; or
    ``swap = {sharer = "opposite", answers}``: the same question to the pair's sharer that learned
    the opposite facts (``PairSpec.opposite``; the note, if any, unchanged)."""
    given = raw.get("swap")
    if given is None:
        return None
    if "sharer" in given:
        if set(given) != {"sharer", "answers"} or given["sharer"] != OPPOSITE:
            raise ValueError(f"preset {key}: a sharer swap is swap = {{ sharer = \"{OPPOSITE}\", answers = [...] }}")
        if not (raw.get("pair") and PAIRS[raw["pair"]].opposite):
            raise ValueError(f"preset {key}: a sharer swap needs a pair whose sharer has an opposite (e.g. knower)")
        return sharer_swap(raw.get("context"), given["answers"])
    if set(given) - {"replace", "by", "answers"} or not {"replace", "by", "answers"} <= set(given):
        raise ValueError(f"preset {key}: swap takes replace, by and answers")
    if not raw.get("context"):
        raise ValueError(f"preset {key}: a swap changes the note, and this preset has none")
    try:
        context = replace_fact(raw["context"], given["replace"], given["by"])
    except ValueError as error:
        raise ValueError(f"preset {key}: {error}") from error
    return Swap(context=context, answers=tuple(given["answers"]), changed=f"{given['replace']} -> {given['by']}")


def load_presets(path: Path = PRESETS_PATH) -> list[Preset]:
    with open(path, "rb") as handle:
        return [_preset(raw) for raw in tomllib.load(handle)["preset"]]


PRESETS: list[Preset] = load_presets()
PRESETS_BY_KEY = {preset.key: preset for preset in PRESETS}
DEFAULT_PRESET = PRESETS[0].key


def preset(key: str) -> Preset:
    if key not in PRESETS_BY_KEY:
        raise ValueError(f"Unknown preset '{key}'; choose one of {', '.join(PRESETS_BY_KEY)}.")
    return PRESETS_BY_KEY[key]


# --- the built-in sweep set -----------------------------------------------------------------
# Private-context questions in the "where is this person" style (written for kvviz): the
# receiver alone cannot know the answer; it has to come through the handoff. What the sweep
# varies is the swept handoff's own declaration (``Sweep`` in its descriptor; see kvviz.app.sweep).

SWEEP_ITEMS: list[dict] = [
    {"context": "Omar is walking along the Great Wall.", "query": "Which country is Omar in?", "answers": ["China"]},
    {"context": "Mei is hiking near Mount Fuji.", "query": "Which country is Mei in?", "answers": ["Japan"]},
    {"context": "Lena is taking a selfie in front of the Colosseum.", "query": "Which country is Lena in?", "answers": ["Italy"]},
    {"context": "Kofi is standing under Big Ben.", "query": "Which country is Kofi in?", "answers": ["United Kingdom", "UK", "England", "Britain"]},
    {"context": "The code for locker 12 is 4471. The gym closes at nine.", "query": "What is the code for locker 12?", "answers": ["4471"]},
    {"context": "Ada parked her blue van next to the bakery on Elm Street.", "query": "Where did Ada park her van?", "answers": ["bakery", "Elm Street"]},
]
SWEEP_METRIC = "answer contains a gold answer"


# --- precomputed results --------------------------------------------------------------------


def stored_in(path: Path, mode: str) -> Path:
    """The file of numeric mode ``mode`` that stands beside ``path`` (``PRECOMPUTED_PATH`` or
    ``PRECOMPUTED_SWEEP_PATH``): the path itself for ``FIRST_MODE``, ``NAME-MODE.json`` otherwise."""
    return path if mode == FIRST_MODE else path.with_name(f"{path.stem}-{mode}{path.suffix}")


def live_mode() -> str:
    """The numeric mode this machine's live runs compute in on the CPU (``numerics.mode_for``:
    ``KVVIZ_NUMERICS`` against what the CPU has); ``FIRST_MODE`` where that setting is refused (the
    models' load then says why)."""
    try:
        return numerics.mode_for("cpu", torch.float32)
    except ValueError:
        return FIRST_MODE


def stored_for_this_machine(path: Path) -> Path:
    """``path``'s file in ``live_mode()`` where it exists, else ``path``."""
    own = stored_in(path, live_mode())
    return own if own.is_file() else path


def load_precomputed(path: Path | None = None) -> dict:
    """``{"pair": ..., "generated": ..., "numerics": ..., "presets": {key: {"request": ..., "results":
    [...]}}}``, by default the stored runs of this machine's numeric mode (``stored_for_this_machine``);
    an empty dict when the file is missing or unreadable (the page then starts blank)."""
    path = stored_for_this_machine(PRECOMPUTED_PATH) if path is None else path
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    for entry in data.get("presets", {}).values():
        for result in entry.get("results", []):
            result["precomputed"] = True
    return data


def load_precomputed_sweep(path: Path | None = None) -> dict | None:
    """The stored sweep, by default of this machine's numeric mode; None when missing or unreadable."""
    path = stored_for_this_machine(PRECOMPUTED_SWEEP_PATH) if path is None else path
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    data["precomputed"] = True
    return data
