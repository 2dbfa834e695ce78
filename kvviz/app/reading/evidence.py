"""What a column's answer is evidence of: the one rule, and the words every surface says it in.

A right answer is evidence that the note's content crossed only when it follows a swapped fact
(the same note with its answer-bearing fact changed): then what it answers is the note's content,
even if its control is right too (the receiver also knew it). Without a swap, a right answer whose
control is wrong *differs from its control on this one example*, which is not yet evidence that
anything crossed. The cases a learner meets, by this column's mark, its control's and what it did
with the swapped note (``rule``):

=============== ==================================================================================
crossed         right, and it followed the swapped fact: the note's content crossed
crossed, known  the same, with its control right too: the note crossed, and the receiver also knew it
differs         right, its control wrong, no swapped note ran: differs on this one example
did not follow  right, but on the swapped note it did not give the swapped answer
not needed      right, and so is its control, the swap not followed: the note was not needed
unchecked       right, its control not run (said only once nothing of it still runs)
pending         right, its control still running
own             right, and it has no control: no handoff of its own to judge (the receiver alone, the
                sharer alone and Skyline answer by themselves)
misread         wrong, yet it followed the swapped fact: the note reached it, misread
=============== ==================================================================================

The verdict strip, the cards' hover, the status line, the lessons' checks, the exercises and the
walk-through all say a kind in these words (``CLAUSES`` for a list of columns, ``sentence`` for
one). Plain Python: no torch, no Gradio.
"""

from __future__ import annotations

CROSSED = "crossed"
KNOWN = "crossed, known"
DIFFERS = "differs"
DID_NOT_FOLLOW = "did not follow"
NOT_NEEDED = "not needed"
UNCHECKED = "unchecked"
PENDING = "pending"
OWN = "own"
MISREAD = "misread"
KINDS = (CROSSED, KNOWN, DIFFERS, DID_NOT_FOLLOW, NOT_NEEDED, UNCHECKED, PENDING, OWN, MISREAD)
GOT_THROUGH = (CROSSED, KNOWN)  # the kinds a strip lists under "got through by"
SHOWN_BY_SWAP = (CROSSED, KNOWN, DID_NOT_FOLLOW, MISREAD)  # the kinds only a run with a swapped note gives

# a control's state while the run has not finished it: its column's evidence waits for it
UNFINISHED = ("waiting", "running")


def rule(mark: str, has_control: bool, control: str, swap: str) -> str | None:
    """The evidence kind of one column. ``mark``: its own (right, wrong, ...); ``control``: its
    control's mark, or its state while it runs ("waiting", "running"), or "notrun"; ``swap``: what
    it did with the swapped note (followed, kept, neither, or "none" when no swapped note ran).
    None for a column that is neither right nor a wrong answer that followed the swap."""
    if mark != "right":
        return MISREAD if mark in ("wrong", "none") and swap == "followed" and has_control else None
    if not has_control:
        return OWN
    if swap == "followed":
        return KNOWN if control == "right" else CROSSED
    if control in UNFINISHED:
        return PENDING
    if control == "right":
        return NOT_NEEDED
    if swap in ("kept", "neither"):
        return DID_NOT_FOLLOW
    if control not in ("wrong", "none"):  # not run, not applicable, failed, stopped
        return UNCHECKED
    return DIFFERS


# The strip's clause for the columns of one kind ("{clause}: <b>Text, KVComm</b>").
CLAUSES = {
    CROSSED: "got through by",
    KNOWN: "the note crossed, and the receiver also knew it (its control is right too)",
    DIFFERS: "differs from its control on this one example (no swapped note to tell whether the note crossed)",
    DID_NOT_FOLLOW: "right, but it did not follow the swapped fact",
    NOT_NEEDED: "right, and so is its control: the note was not needed",
    UNCHECKED: "right, its control not run (unchecked: tick it to tell)",
    PENDING: "right, its control still running",
    OWN: "right on its own, with no handoff to judge",
    MISREAD: "wrong, yet it followed the swapped fact (the note reached it, misread)",
}

# One column's kind as a sentence's predicate ("KVComm: the note's content crossed ...").
MEANINGS = {
    CROSSED: "the note's content crossed: right, and it followed the swapped fact",
    KNOWN: "the note's content crossed (it followed the swapped fact), and the receiver also knew it",
    DIFFERS: "right where its control is wrong, on this one example: with no swapped note it is not shown to come "
             "from the note",
    DID_NOT_FOLLOW: "right, but it did not follow the swapped fact: its answer is not shown to come from the note",
    NOT_NEEDED: "right, and so is its control: the note was not needed",
    UNCHECKED: "right, but its control did not run: unchecked",
    PENDING: "right; its control is still running",
    OWN: "right on its own: it has no handoff to judge",
    MISREAD: "wrong, yet it followed the swapped fact: the note reached it and was misread",
}


def sentence(label: str, kind: str | None) -> str:
    """One column's evidence in words ("" for a column with none)."""
    return f"{label}: {MEANINGS[kind]}" if kind in MEANINGS else ""
