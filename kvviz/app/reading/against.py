"""A run read against claims made from another run: a live run of a preset's question against the
lesson its stored run shows (``kvviz.app.page.views.lesson_of``).

The stored run ran every column and, where the preset has one, a swapped note; a live run may have
run fewer columns, no swapped note, other settings. So each claim is held, contradicted, or
unanswered by the live run: unanswered when a column it depends on did not run, or when its answer
needs a swapped note the live run did not have. A "crossed" claim (which columns the note crossed
by) is compared on the columns the live run can judge: those that ran with their controls.
Plain Python: no torch, no Gradio.
"""

from __future__ import annotations

from kvviz.app.reading import catalog, evidence
from kvviz.app.reading.questions import Claim
from kvviz.app.reading.reading import Reading


def depends_on_swap(claim: Claim) -> bool:
    """Whether ``claim``'s answer needs a swapped note: what a column did with it, which columns the
    note crossed by, and the evidence kinds only a swap shows (``evidence.SHOWN_BY_SWAP``)."""
    kind = claim.question.kind
    return kind in ("follow", "crossed") or (kind == "evidence" and claim.expected in evidence.SHOWN_BY_SWAP)


def judged(reading: Reading) -> set[str]:
    """The columns whose crossing ``reading`` can judge: finished, with their control finished too
    (a column without a control needs none)."""
    return {name for name, column in reading.columns.items() if column.result is not None
            and (not catalog.control_of(name) or reading.column(catalog.control_of(name)).result is not None)}


def can_answer(reading: Reading, claim: Claim, swap_expected: bool = False) -> bool:
    """Whether ``reading`` can say whether ``claim`` holds: every column it depends on finished and
    the run has what it asks about (an inserted contradiction for "contradicted"); a "crossed" claim,
    when it can judge any column. ``swap_expected``: the claim was read from a run with a swapped
    note, so a run without one cannot answer what depends on it. A "which" question with no single
    answer is answered: by "none of them"."""
    if swap_expected and reading.swap is None and depends_on_swap(claim):
        return False
    if claim.question.kind == "crossed":
        return bool(judged(reading))
    if any(reading.column(name).result is None for name in claim.question.columns()):
        return False
    return claim.question.kind == "which" or reading.answer(claim.question) is not None


def sort_claims(reading: Reading, claims: list[Claim], swap_expected: bool = False
                ) -> tuple[list[Claim], list[Claim], list[Claim]]:
    """``claims`` as (held, contradicted, unanswered) by ``reading``."""
    held, contradicted, unanswered = [], [], []
    judgeable = judged(reading)
    for claim in claims:
        if not can_answer(reading, claim, swap_expected):
            unanswered.append(claim)
        elif claim.question.kind == "crossed":
            same = set(claim.expected) & judgeable == set(reading.crossed()) & judgeable
            (held if same else contradicted).append(claim)
        else:
            (held if reading.holds(claim) else contradicted).append(claim)
    return held, contradicted, unanswered
