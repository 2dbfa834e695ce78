"""The one record shape every dataset becomes, and the report of what loading skipped."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from kvviz.data.choices import LETTERS


@dataclass(frozen=True)
class Record:
    """One question (or one instruction) in the common shape.

    ``context`` is the text only the sharing model sees (the sender in a
    hand-off); ``question`` is what the receiving model is asked.  For
    multiple choice, ``choices`` holds the options in order (letters A, B,
    C... by position), ``answer_index`` the right one, and ``answers`` holds
    the right option's text so that the open-answer metrics work too.
    ``response`` is the reference output of instruction data.  ``meta`` keeps
    dataset-specific extras (MMLU-Redux subject and error_type, HotpotQA
    type/level, ...); it is informational only.
    """

    id: str
    question: str
    context: str | None
    answers: list[str]
    choices: list[str] | None
    answer_index: int | None
    source: str
    response: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Catch inconsistent records where they are built, not later in a
        # scoring loop.
        if self.choices is not None:
            if not self.choices:
                raise ValueError(f"record {self.id!r}: choices is an empty list")
            if len(self.choices) > len(LETTERS):
                raise ValueError(f"record {self.id!r}: more than {len(LETTERS)} choices")
            if self.answer_index is None or not 0 <= self.answer_index < len(self.choices):
                raise ValueError(
                    f"record {self.id!r}: answer_index {self.answer_index!r} is not a "
                    f"valid index into {len(self.choices)} choices"
                )
        elif self.answer_index is not None:
            raise ValueError(f"record {self.id!r}: answer_index given without choices")

    @property
    def is_multiple_choice(self) -> bool:
        return self.choices is not None

    @property
    def answer_letter(self) -> str | None:
        """Letter of the right choice ("A", "B", ...), or None if not multiple choice."""
        if self.answer_index is None:
            return None
        return LETTERS[self.answer_index]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict (lists and meta are copied)."""
        return dataclasses.asdict(self)


class Problem(NamedTuple):
    """One skipped input record: where it is and why it was skipped.

    ``line`` is the 1-based line number in a JSONL/CSV file (for a CSV record
    spanning several lines, the line it starts on), or the 1-based item number
    in a JSON array file.
    """

    line: int
    reason: str
    path: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass
class LoadReport:
    """What happened while loading: skipped bad records and filtered rows."""

    name: str
    problems: list[Problem] = field(default_factory=list)
    #: Rows dropped on purpose by a loader option (e.g. MMLU-Redux rows whose
    #: error_type is not "ok"); these are not problems.
    filtered: int = 0
    #: Number of records loaded before ``limit`` was applied.
    loaded: int = 0

    def add(self, path: str | Path, line: int, reason: str) -> None:
        self.problems.append(Problem(line, reason, str(path)))

    @property
    def lines(self) -> list[tuple[int, str]]:
        """The problems as ``(line_number, reason)`` pairs."""
        return [(p.line, p.reason) for p in self.problems]

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self, max_items: int = 10) -> str:
        head = [str(p) for p in self.problems[:max_items]]
        more = len(self.problems) - len(head)
        if more > 0:
            head.append(f"... and {more} more")
        return (
            f"{self.name}: skipped {len(self.problems)} bad record(s):\n  "
            + "\n  ".join(head)
        )


def letter_to_index(label: Any, n: int) -> int | None:
    if isinstance(label, str) and len(label.strip()) == 1:
        idx = LETTERS.find(label.strip().upper())
        if 0 <= idx < n:
            return idx
    return None
