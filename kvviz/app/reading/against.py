"""A run read against claims made from another run: a live run of a preset's question against the
lesson its stored run shows (``kvviz.app.page.views.lesson_of``).

The stored run ran every column and, where the preset has one, its swap; a live run may have run
fewer columns, no swap or another one, and a column may have failed. So each claim is held,
contradicted, or unanswered by the live run: unanswered when a column it depends on has no usable
result, or when its answer needs the preset's swap and the live run did not run it for that column.
A "crossed" claim (which columns the note got through by) is answered only when every column it names
can be judged, and is then compared on the columns the live run can judge.
Plain Python: no torch, no Gradio.
"""

from __future__ import annotations

from kvviz.app.reading import catalog, evidence
from kvviz.app.reading.questions import Claim
from kvviz.app.reading.reading import Reading


def depends_on_swap(claim: Claim) -> bool:
    """Whether ``claim``'s answer needs the swap: what a column did with it, which columns the note
    got through by, and the evidence kinds only a swap shows (``evidence.SHOWN_BY_SWAP``)."""
    kind = claim.question.kind
    return kind in ("follow", "crossed") or (kind == "evidence" and claim.expected in evidence.SHOWN_BY_SWAP)


def usable(reading: Reading, name: str) -> bool:
    """Whether column ``name`` finished with a result that can be judged (not failed)."""
    column = reading.column(name)
    return column.result is not None and column.mark != "failed"


def judged(reading: Reading, swap_expected: bool = False) -> set[str]:
    """The columns whose crossing ``reading`` can judge: usable, with their control usable (a column
    without a control needs none) and, where the claims were read with a swap, a result on it."""
    return {name for name, column in reading.columns.items() if usable(reading, name)
            and (not catalog.control_of(name) or usable(reading, catalog.control_of(name)))
            and (not swap_expected or column.swap.outcome != "none")}


def can_answer(reading: Reading, claim: Claim, swap_expected: bool = False, swap_ran: bool = False) -> bool:
    """Whether ``reading`` can say whether ``claim`` holds. ``swap_expected``: the claim was read
    from a run with a swap; ``swap_ran``: this run ran that same swap."""
    question = claim.question
    if swap_expected and depends_on_swap(claim):
        if not swap_ran:
            return False
        if question.column and reading.column(question.column).swap.outcome == "none":
            return False
    if question.kind == "crossed":
        return set(claim.expected) <= judged(reading, swap_expected)
    if not all(usable(reading, name) for name in question.columns()):
        return False
    return reading.answer(question) is not None


def sort_claims(reading: Reading, claims: list[Claim], swap_expected: bool = False, swap_ran: bool = False
                ) -> tuple[list[Claim], list[Claim], list[Claim]]:
    """``claims`` as (held, contradicted, unanswered) by ``reading`` (``can_answer``)."""
    held, contradicted, unanswered = [], [], []
    judgeable = judged(reading, swap_expected)
    for claim in claims:
        if not can_answer(reading, claim, swap_expected, swap_ran):
            unanswered.append(claim)
        elif claim.question.kind == "crossed":
            same = set(claim.expected) == set(reading.crossed()) & judgeable
            (held if same else contradicted).append(claim)
        else:
            (held if reading.holds(claim) else contradicted).append(claim)
    return held, contradicted, unanswered


def lacking(reading: Reading, unanswered: list[Claim], swap_expected: bool = False, swap_ran: bool = False) -> list[str]:
    """The columns (in page order) that the ``unanswered`` claims lack a usable result of (their
    own or their control's) or, when the swap ran, a result on the swap."""
    def lacks(name: str) -> bool:
        return not usable(reading, name) or (swap_expected and swap_ran and reading.column(name).swap.outcome == "none")

    names = set()
    for claim in unanswered:
        question = claim.question
        if question.kind == "crossed":
            for name in set(claim.expected) - judged(reading, swap_expected):
                control = catalog.control_of(name)
                if lacks(name):
                    names.add(name)
                if control and not usable(reading, control):  # a control is judged on its own result only
                    names.add(control)
        else:
            names.update(name for name in question.columns() if not usable(reading, name))
            if swap_ran and depends_on_swap(claim) and question.column and lacks(question.column):
                names.add(question.column)
    return catalog.in_page_order(names)
