"""Presets for the lab and the small built-in set for the KVComm sweep.

All examples are written for this project (none is copied from a dataset). Two scenarios:

* **private context** (KVComm style): only the sharer reads a short context; the receiver gets the
  question alone and must learn the missing fact from the sharer.
* **shared question** (C2C style): both models see the same question; the sharer's cache (or its
  written background) should help the receiver answer better.

Precomputed results for the presets (``scripts/precompute_presets.py``) live in
``assets/precomputed/presets.json`` and paint the page before any model has run.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvviz.paths import PRECOMPUTED

PRECOMPUTED_PATH = PRECOMPUTED / "presets.json"
PRECOMPUTED_SWEEP_PATH = PRECOMPUTED / "sweep.json"


@dataclass(frozen=True)
class Preset:
    key: str
    title: str
    scenario: str  # "private" | "shared"
    query: str
    context: str | None
    answers: tuple[str, ...]
    note: str  # what to look at, in plain words
    settings: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        kind = "private context" if self.scenario == "private" else "shared question"
        return f"{self.title} ({kind})"

    def to_dict(self) -> dict:
        data = asdict(self)
        data["answers"] = list(self.answers)
        return data


PRESETS: list[Preset] = [
    Preset(
        key="locker",
        title="Locker code",
        scenario="private",
        context="The code for locker 12 is 4471. The gym closes at nine.",
        query="What is the code for locker 12?",
        answers=("4471",),
        note=(
            "Only the sharer knows the code. The receiver alone has to guess; the text message carries it "
            "in words, KVComm as a same-model sender's KV cache, and Skyline reads the note itself."
        ),
    ),
    Preset(
        key="big-ben",
        title="Where is Kofi?",
        scenario="private",
        context="Kofi is standing under Big Ben.",
        query="Which country is Kofi in?",
        answers=("United Kingdom", "UK", "England", "Britain"),
        note=(
            "The receiver must know that Big Ben is in London. With KVComm calibrated on the built-in "
            "sample the same layers are sent for every question; choose calibration on this query in the "
            "settings to let this question's own attention pick them, and compare with Skyline's answer."
        ),
    ),
    Preset(
        key="colosseum",
        title="Where is Lena?",
        scenario="private",
        context="Lena is taking a selfie in front of the Colosseum.",
        query="Which country is Lena in?",
        answers=("Italy",),
        note=(
            "At the default ratio KVComm can miss this one. Raise the KVComm ratio in the settings and "
            "run again: with every layer sent it equals Skyline."
        ),
    ),
    Preset(
        key="boiling",
        title="Boiling water",
        scenario="shared",
        context=None,
        query="At sea level, water boils at how many degrees Celsius?",
        answers=("100",),
        note=(
            "Both models see the same question. The text handoff lets the sharer write background first; "
            "C2C fuses the sharer's cache into the receiver's instead. KVComm and Skyline need a private "
            "context, so they say they do not apply."
        ),
    ),
    Preset(
        key="plants",
        title="Plants and air",
        scenario="shared",
        context=None,
        query="Which gas do plants take in from the air to make their food?",
        answers=("carbon dioxide", "CO2"),
        note=(
            "A science question in the style of the C2C paper. Look at how long the text handoff takes: "
            "the sharer writes its whole message before the receiver can start."
        ),
    ),
]
PRESETS_BY_KEY = {preset.key: preset for preset in PRESETS}
DEFAULT_PRESET = PRESETS[0].key


def preset(key: str) -> Preset:
    if key not in PRESETS_BY_KEY:
        raise ValueError(f"Unknown preset '{key}'; choose one of {', '.join(PRESETS_BY_KEY)}.")
    return PRESETS_BY_KEY[key]


# --- the built-in sweep set -----------------------------------------------------------------
# Private-context questions in the "where is this person" style (written for kvviz): the
# receiver alone cannot know the answer; it has to come through the handoff. What the sweep
# varies is the swept handoff's own declaration (``Sweep`` in its descriptor; see kvviz.sweep).

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


def load_precomputed(path: Path = PRECOMPUTED_PATH) -> dict:
    """``{"pair": ..., "generated": ..., "presets": {key: {"request": ..., "results": [...]}}}``;
    an empty dict when the file is missing or unreadable (the page then starts blank)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    for entry in data.get("presets", {}).values():
        for result in entry.get("results", []):
            result["precomputed"] = True
    return data


def load_precomputed_sweep(path: Path = PRECOMPUTED_SWEEP_PATH) -> dict | None:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    data["precomputed"] = True
    return data
