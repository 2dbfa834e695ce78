"""The page's components by name (``Page``): every component an event reads or writes, found by
its role ("status", "answer:kvcomm", "figure:latency"), and ``Page.resolve``, which turns a
handler's ``{role: value}`` updates into component updates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from kvviz.app.page import spec
from kvviz.app.page.spec import PageOption


@dataclass
class Card:
    block: Any  # the card's column (shown when ticked)
    head: Any  # title and mark (HTML)
    answer: Any  # kv-answer-NAME: a read-only textbox, so that streaming is a cheap text update
    stats: Any  # the card's one line


@dataclass
class Details:
    block: Any  # its section in "What each model saw"
    notes: Any
    seen: Any


@dataclass
class Page:
    """Every component the page's events read or write, by name."""

    initial: dict  # initial values by role
    specs: list[PageOption]
    demo: Any = None
    components: dict[str, Any] = field(default_factory=dict)  # role -> component
    cards: dict[str, Card] = field(default_factory=dict)
    details: dict[str, Details] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    tabs: dict[str, Any] = field(default_factory=dict)
    option_inputs: list = field(default_factory=list)

    def __getitem__(self, role: str):
        return self.components[role]

    def add(self, role: str, component):
        self.components[role] = component
        return component

    def value(self, role: str, default=None):
        return self.initial.get(role, default)

    @property
    def settings_inputs(self) -> list:
        return [self["max_new_tokens"], self["sample"], self["temperature"], self["seed"], *self.option_inputs]

    def outputs(self) -> list:
        """Every component an event of the page may update (a handler names the ones it changes)."""
        blocks = [c for card in self.cards.values() for c in (card.block, card.head, card.answer, card.stats)]
        blocks += [c for d in self.details.values() for c in (d.block, d.notes, d.seen)]
        return list(self.components.values()) + blocks + list(self.figures.values())

    def resolve(self, updates: dict) -> dict:
        """``{role: value}`` to ``{component: value}``. Special roles: ``shown`` (the ticked columns:
        their cards, details and figures visible, the others hidden), ``lesson`` (hidden when
        empty), ``run_button`` (True: busy), ``tab`` (select that tab), ``tokens_column`` (the token
        view's picker: choices and value), ``option:I`` (the I-th option widget)."""
        out = {}
        for role, value in updates.items():
            if role == "shown":
                continue  # last: a figure may be drawn and shown in one update
            elif role == "lesson":
                out[self["lesson"]] = value
                out[self["lesson_row"]] = gr.update(visible=bool(value))
            elif role == "run_button":
                out[self["run_button"]] = gr.update(value=spec.BUSY_LABEL if value else spec.RUN_LABEL, interactive=not value)
            elif role.startswith("option:"):
                out[self.option_inputs[int(role.split(":", 1)[1])]] = value
            elif role == "tokens_column":
                out[self["tokens_column"]] = gr.update(choices=value["choices"], value=value["value"])
            elif role == "tab":
                out[self["tabs"]] = gr.Tabs(selected=value)
            elif role in self.components:
                out[self.components[role]] = value
            elif role.startswith("figure:"):
                out[self.figures[role.split(":", 1)[1]]] = value
            elif ":" in role:
                kind, name = role.split(":", 1)
                part = self.cards[name] if kind in ("head", "answer", "stats") else self.details[name]
                out[getattr(part, kind)] = value
        if "shown" in updates:
            for component, visible in self._visibility(updates["shown"]).items():
                drawn = out.get(component)
                out[component] = gr.update(visible=visible) if drawn is None else gr.update(value=drawn, visible=visible)
        return out

    def _visibility(self, names) -> dict:
        """Component -> whether it shows, for the ticked columns ``names``."""
        shown = set(names or [])
        out = {}
        for name, card in self.cards.items():
            out[card.block] = out[self.details[name].block] = name in shown
        for name in spec.layer_figure_names():
            out[self.figures[name]] = name in shown
        return out
