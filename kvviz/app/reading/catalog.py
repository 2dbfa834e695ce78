"""The page's methods without their code: each column's name, label, title, one-line summary,
colour, control, whether it shows when the page opens and its chip group, in page order.

A snapshot of the handoff registry and the page entries (``kvviz.app.methods.registry.catalog``)
kept in ``assets/methods.json``, so that the reading, the exercises and the workshop name the
methods without importing torch or any method's ``run``. ``python scripts/methods_catalog.py``
writes it and ``--check`` says whether it is out of date (a unit test fails when it is).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvviz.core.paths import ASSETS

CATALOG_PATH = ASSETS / "methods.json"
# the column chips' groups, in chip order: what the receiver answers alone or with the note in its
# prompt; a way for the note to cross; a handoff's machinery with the note's content taken out
GROUPS = ("baseline", "method", "control")
FIELDS = ("name", "label", "title", "summary", "color", "control", "default", "group")


@dataclass(frozen=True)
class Method:
    """One page column as the registry and its page entry describe it."""

    name: str
    label: str  # short: cards, chips, plot axes
    title: str  # long: "How it works", the status line
    summary: str  # one line: what crosses
    color: str
    control: str  # the column it is measured against ("" when it has none)
    default: bool  # shown when the page opens
    group: str  # one of GROUPS


def load(path: Path = CATALOG_PATH) -> dict[str, Method]:
    """The catalog, by name in page order; a ValueError names what is wrong with the file."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    methods = {}
    for entry in data["methods"]:
        if set(entry) != set(FIELDS) or entry["group"] not in GROUPS:
            raise ValueError(f"{path}: a method needs exactly {', '.join(FIELDS)} and a group in {GROUPS}: {entry}")
        methods[entry["name"]] = Method(**entry)
    unknown = {method.control for method in methods.values()} - set(methods) - {""}
    if unknown:
        raise ValueError(f"{path}: controls {sorted(unknown)} are not methods of the catalog")
    return methods


METHODS: dict[str, Method] = load()


def names() -> list[str]:
    """Every page column, in page order."""
    return list(METHODS)


def defaults() -> list[str]:
    """The columns shown when the page opens, in page order."""
    return [name for name, method in METHODS.items() if method.default]


def label_of(name: str) -> str:
    return METHODS[name].label if name in METHODS else name


def title_of(name: str) -> str:
    return METHODS[name].title if name in METHODS else name


def control_of(name: str) -> str:
    """The column ``name`` is measured against ("" when it has none, or is not a page column)."""
    return METHODS[name].control if name in METHODS else ""


def controlled_by(name: str) -> list[str]:
    """The columns whose control is ``name``, in page order."""
    return [other for other, method in METHODS.items() if method.control == name]


def in_page_order(names_given) -> list[str]:
    """``names_given`` that are page columns, in page order."""
    wanted = set(names_given or ())
    return [name for name in METHODS if name in wanted]
