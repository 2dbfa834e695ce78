"""Every handoff, registered by name. A new handoff is one file and one line here.

A handoff is a function ``run(pair, request, on_token=None) -> HandoffResult``.
"""

from __future__ import annotations

from typing import Callable

from kvviz.handoffs import baselines, c2c, kvcomm, text
from kvviz.handoffs.common import LoadedPair
from kvviz.results import HandoffRequest, HandoffResult

Handoff = Callable[..., HandoffResult]

HANDOFFS: dict[str, Handoff] = {
    "receiver": baselines.receiver_alone,
    "sharer": baselines.sharer_alone,
    "skyline": baselines.skyline,
    "text": text.run,
    "kvcomm": kvcomm.run,
    "c2c": c2c.run,
    "c2c_control": c2c.run_control,
}

# One line each, for the CLI help and the app's "how it works".
DESCRIPTIONS = {
    "receiver": "the receiver alone on the query (nothing shared)",
    "sharer": "the sharer alone, with whatever context it holds",
    "skyline": "the receiver given context and query in one prompt (upper bound)",
    "text": "the sharer writes a short message; the receiver reads it",
    "kvcomm": "the receiver attends to the sender's context KV in selected layers",
    "c2c": "a trained fuser projects the sharer's KV cache into the receiver's",
    "c2c_control": "the control fuser (trained without the sharer's information): adaptation only",
}


def parse_handoffs(names: str | list[str]) -> list[str]:
    if isinstance(names, str):
        names = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in names if name not in HANDOFFS]
    if unknown:
        raise ValueError(f"Unknown handoff(s) {', '.join(unknown)}; choose from {', '.join(HANDOFFS)}.")
    if not names:
        raise ValueError("Name at least one handoff.")
    return list(names)


def register(name: str, handoff: Handoff, description: str) -> None:
    HANDOFFS[name] = handoff
    DESCRIPTIONS[name] = description


__all__ = ["HANDOFFS", "DESCRIPTIONS", "LoadedPair", "HandoffRequest", "HandoffResult", "parse_handoffs", "register"]
