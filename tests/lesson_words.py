"""What a lesson or an explanation says got across, read from its words, to check against the page's
evidence rule (``kvviz.app.reading.evidence``) with every column ticked.

A clause (split at ``.``, ``;`` and ``:``) that says something crossed ("got through by", "gets Italy
across", "carries the note's content across", "crosses", "comes from the note") names columns (by
their labels and the words lessons use for them: "the text message", "the translator"). Without a
negation those columns must be among the ones the note's content crossed by; with one ("not", "no",
"n't") they must not be; with "only", they must be exactly those. "The receiver" and "the sharer"
are the models, not columns: those columns are named "the receiver alone" and "the sharer alone".
"""

from __future__ import annotations

import re

from kvviz.app.reading import catalog

ALIASES = {"text message": "text", "text handoff": "text", "text column": "text", "translator": "c2c_translate",
           "translated cache": "c2c_translate", "latent relay": "latent_relay", "receiver alone": "receiver",
           "sharer alone": "sharer", "fused cache": "c2c", "kvcomm's": "kvcomm"}
CROSSING = re.compile(r"\b(gets?|got)\b[^.;:]*\b(across|through)\b|\bcarr(y|ies|ied)\b[^.;:]*\bacross\b|"
                      r"\bcross(es|ed)?\b|\b(come|came|comes) from the note", re.IGNORECASE)
NEGATION = re.compile(r"\b(not|no|never|nor)\b|n't\b", re.IGNORECASE)


def names_in(clause: str) -> set[str]:
    """The columns a clause names, longest names first (so "C2C control" is not also "C2C")."""
    words = {**{method.label.lower(): name for name, method in catalog.METHODS.items()
                if name not in ("receiver", "sharer")}, **ALIASES, "text": "text"}
    found, rest = set(), clause.lower()
    for word in sorted(words, key=len, reverse=True):
        pattern = re.compile(rf"(?<![\w-]){re.escape(word)}(?![\w-])")
        if pattern.search(rest):
            found.add(words[word])
            rest = pattern.sub(" ", rest)
    return found


def contradictions(text: str, crossed: set[str]) -> list[str]:
    """The clauses of ``text`` that say something crossed which the evidence does not show."""
    out = []
    for clause in re.split(r"(?<=[.;:])\s+", " ".join(text.split())):
        if not CROSSING.search(clause):
            continue
        named = names_in(clause)
        if NEGATION.search(clause):
            wrong = named & crossed
            if wrong:
                out.append(f"{clause!r} denies that the note crossed by {sorted(wrong)}, the evidence shows it did")
        elif re.search(r"\bonly\b", clause, re.IGNORECASE) and named != crossed:
            out.append(f"{clause!r} says only {sorted(named)}; the note's content crossed by {sorted(crossed)}")
        elif named - crossed:
            out.append(f"{clause!r} says the note crossed by {sorted(named - crossed)}; the evidence shows {sorted(crossed)}")
    return out
