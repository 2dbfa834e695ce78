"""Multiple choice, asked and read one way for every command: the prompt's lettered options and
instruction (``choice_query``) and the letter a model answered with (``extract_choice_letter``).
The benchmark and ``eval-fuser`` both use these, so their accuracies compare."""

from __future__ import annotations

import re
import string

#: Letters used for multiple-choice options, by position.
LETTERS = string.ascii_uppercase

#: What the receiver is asked after the options.
MC_INSTRUCTION = "Reply with the letter of the correct option."


def format_choices(record) -> str:
    """The options as "A. ...\\nB. ..." lines, for a multiple-choice prompt."""
    if record.choices is None:
        raise ValueError(f"record {record.id!r} is not multiple choice")
    return "\n".join(f"{LETTERS[i]}. {choice}" for i, choice in enumerate(record.choices))


def choice_query(record) -> str:
    """The question a model gets for a multiple-choice record: the question, the lettered options
    (C2C style), and the instruction. An open question is asked as it is."""
    if record.choices is None:
        return record.question
    return f"{record.question.strip()}\n{format_choices(record)}\n{MC_INSTRUCTION}"


# Tried in order by extract_choice_letter.
_CHOICE_PATTERNS = [
    # "Answer: B", "answer is (C)", "The correct option is: D", "Final answer - A".
    # IGNORECASE is for the keyword only: a lower-case letter it captures
    # ("the answer is a bit unclear") fails the `in valid` test below.
    re.compile(
        r"\b(?:answer|option|choice)\b(?:\s+is)?\s*[:\-]?\s*\(?([A-Z])\)?(?![A-Za-z0-9])",
        re.IGNORECASE,
    ),
    # a letter at the very start: "B", "(B)", "B.", "B)", "B:", "B,", "B\n..."
    re.compile(r"^\s*\(?([A-Z])(?:\)|[.:,]|\s*$|\s*\n)"),
    # "(B)" anywhere
    re.compile(r"\(([A-Z])\)"),
]


def extract_choice_letter(text: str, n_choices: int) -> str | None:
    """The option letter a model answered with, or None.

    Looks, in this order, for an explicit statement ("Answer: B", "The answer
    is (B)", "correct option is B"), then a letter at the very start ("B",
    "(B)", "B.", "B)", "B: ..."), then a parenthesised letter anywhere
    ("... so (B)").  Only capital letters among the first ``n_choices`` count;
    a bare leading letter followed by a word ("A bird ...") is not taken as an
    answer because it is usually the article "A".
    """
    if not 1 <= n_choices <= len(LETTERS):
        raise ValueError(f"n_choices must be between 1 and {len(LETTERS)}, not {n_choices}")
    if not text:
        return None
    valid = LETTERS[:n_choices]
    body = text.replace("*", "")  # markdown bold: "**B**"
    for pattern in _CHOICE_PATTERNS:
        for match in pattern.finditer(body):
            if match.group(1) in valid:
                return match.group(1)
    return None
