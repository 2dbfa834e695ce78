"""One vocabulary of questions about a run: what presets claim (``check``), what exercises ask
(``check``) and claim (``claims``), and what the walk-through's predictions ask, in the same words.

A question names its kind and, for most kinds, a column; the reading answers it
(``kvviz.app.reading.reading.Reading.answer``):

========= ============================================================ ==========================
kind      the answer                                                   compared to what is expected
========= ============================================================ ==========================
verdict   the column's mark: right / wrong / none / na                 equal
evidence  what its answer is evidence of (``evidence.KINDS``; "none")  equal
follow    what it did with the swapped note: followed / kept / neither equal
contra-   which answer it gave on the note with an inserted            equal
dicted    contradiction: gold / counter / both / neither
beats     "yes" when it is right where its control is not, else "no"   equal
layers    how many layers it sent                                      within the tolerance
sent      which layers it sent                                         the same list
says      its answer                                                   contains the expected words
writes    the message its sharer wrote                                 contains the expected words
seconds   its total time (``over``: the ratio to another column's)     within the tolerance
bytes     the bytes it sent (``over``: the ratio to another column's)  within the tolerance
gain      its held-out communication gain's 95% interval: "includes 0", "above 0" or "below 0"
which     the one column ``among`` some whose verdict, swap outcome or evidence is the given one
crossed   every column the note's content crossed by (sorted)          the same list
========= ============================================================ ==========================

Two shapes of the same vocabulary are read from the TOML files: one question (an exercise's
``check = { verdict = "text" }``, ``{ seconds = "text", over = "receiver" }``, ``{ which =
"followed" }``), and a table of claims, a question kind to ``{column = expected}`` (a preset's
``check`` and an exercise's ``claims``: ``verdict = { text = "right" }``, ``crossed = ["text"]``).
Every problem is one line that says where. Plain Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvviz.app.reading import catalog, evidence
from kvviz.data.contradictions import OUTCOMES as CONTRADICTION_OUTCOMES
from kvviz.data.metrics import contains_answer

VERDICTS = ("right", "wrong", "none", "na")
SWAP_OUTCOMES = ("followed", "kept", "neither")
EVIDENCE = (*evidence.KINDS, "none")
GAINS = ("includes 0", "above 0", "below 0")
YES_NO = ("yes", "no")
COLUMN_KINDS = ("verdict", "evidence", "follow", "contradicted", "beats", "layers", "sent", "says", "writes", "seconds",
                "bytes", "gain")
KINDS = (*COLUMN_KINDS, "which", "crossed")
NUMBERS = ("layers", "seconds", "bytes")  # answered by a number, right within a tolerance
WORDS = ("says", "writes")  # answered by text, right when it contains the expected words
RATIOS = ("seconds", "bytes")  # may be asked ``over`` another column
# the answers a kind can give, where they are a fixed set (a choice asks among them)
CHOICES = {"verdict": VERDICTS, "evidence": EVIDENCE, "follow": SWAP_OUTCOMES, "contradicted": CONTRADICTION_OUTCOMES,
           "beats": YES_NO, "gain": GAINS}
WHICH_OUTCOMES = (*VERDICTS, *SWAP_OUTCOMES, *evidence.KINDS)


@dataclass(frozen=True)
class Question:
    """``kind`` about ``column`` (for "which": the outcome asked for, among ``among``; for
    "crossed": none); ``over``: the column a seconds or bytes question is a ratio to."""

    kind: str
    column: str | None = None
    over: str | None = None
    among: tuple[str, ...] = ()

    def columns(self) -> list[str]:
        """The columns the answer depends on (a control's too, for evidence and beats)."""
        if self.kind == "which":
            return list(self.among)
        if self.kind == "crossed":
            return catalog.names()
        named = [self.column, self.over]
        if self.kind in ("evidence", "beats"):
            named.append(catalog.control_of(self.column or ""))
        return [name for name in dict.fromkeys(named) if name]


@dataclass(frozen=True)
class Claim:
    """What a lesson or an explanation says a question's answer is."""

    question: Question
    expected: Any


def agrees(question: Question, expected, answer, tolerance: float = 0.0) -> bool:
    """Whether a run's ``answer`` to ``question`` is the ``expected`` one (None never is)."""
    if answer is None:
        return False
    if question.kind in WORDS:
        return contains_answer(str(answer), [str(expected)])
    if question.kind == "layers" and isinstance(expected, list):
        return False  # a list of layers is a "sent" claim
    if question.kind in NUMBERS:
        try:
            return abs(float(answer) - float(expected)) <= tolerance + 1e-9
        except (TypeError, ValueError):
            return False
    if question.kind in ("sent", "crossed"):
        return sorted(answer) == sorted(expected)
    return str(answer) == str(expected)


# --- reading the TOML files --------------------------------------------------------------------------


def _column_problems(where: str, names) -> list[str]:
    return [f"{where}: {name!r} is not a column of the page ({', '.join(catalog.names())})"
            for name in names if name not in catalog.METHODS]


def parse_question(table, where: str, among: tuple[str, ...] = ()) -> tuple[Question | None, list[str]]:
    """One question (an exercise's ``check``): exactly one kind (and ``over`` for a ratio)."""
    if not isinstance(table, dict):
        return None, [f"{where}: check must be a table with one of {', '.join(KINDS)}"]
    kinds = [kind for kind in KINDS if kind in table]
    extra = sorted(set(table) - set(KINDS) - {"over"})
    if len(kinds) != 1 or extra:
        return None, [f"{where}: check must hold exactly one of {', '.join(KINDS)} (and over for a ratio)"
                      + (f"; unknown {', '.join(extra)}" if extra else "")]
    kind, problems = kinds[0], []
    if "over" in table and kind not in RATIOS:
        problems.append(f"{where}: check.over (a ratio) goes with {' or '.join(RATIOS)} only")
    if kind == "which":
        if table["which"] not in WHICH_OUTCOMES:
            problems.append(f"{where}: check.which must be a verdict, a swap outcome or an evidence kind "
                            f"({', '.join(WHICH_OUTCOMES)})")
        problems += _column_problems(where, among)
        return (None if problems else Question("which", table["which"], among=tuple(among))), problems
    if kind == "crossed":
        return Question("crossed"), problems
    named = [table[kind]] + ([table["over"]] if "over" in table else [])
    problems += [f"{where}: check names {name!r}, not a column of the page" for name in named
                 if name not in catalog.METHODS]
    return (None if problems else Question(kind, table[kind], table.get("over"))), problems


def _expected_problem(where: str, kind: str, column: str, expected) -> str | None:
    """Why ``expected`` cannot be an answer of ``kind`` (None when it can)."""
    if kind in CHOICES and expected not in CHOICES[kind]:
        return f"{where}: {kind} of {column} must be one of {', '.join(CHOICES[kind])}, not {expected!r}"
    if kind == "sent" and not (isinstance(expected, list) and all(isinstance(x, int) for x in expected)):
        return f"{where}: sent of {column} must be a list of layer numbers"
    if kind in NUMBERS and (isinstance(expected, bool) or not isinstance(expected, (int, float))):
        return f"{where}: {kind} of {column} must be a number"
    if kind in WORDS and (not isinstance(expected, str) or not expected.strip()):
        return f"{where}: {kind} of {column} must be the words it holds"
    return None


def parse_claims(table, where: str) -> tuple[list[Claim], list[str]]:
    """A table of claims (a preset's ``check``, an exercise's ``claims``): ``kind = {column =
    expected}`` for a column's kind, ``crossed = [columns]``. Returns the claims and the problems."""
    if table is None:
        return [], []
    if not isinstance(table, dict):
        return [], [f"{where}: claims must be a table of question kinds"]
    claims, problems = [], []
    unknown = sorted(set(table) - set(COLUMN_KINDS) - {"crossed"})
    if unknown:
        problems.append(f"{where}: unknown claim(s) {', '.join(unknown)} (known: {', '.join((*COLUMN_KINDS, 'crossed'))})")
    if "crossed" in table:
        named = table["crossed"]
        if not isinstance(named, list):
            problems.append(f"{where}: crossed must be a list of columns")
        else:
            problems += _column_problems(where, named)
            claims.append(Claim(Question("crossed"), sorted(named)))
    for kind in COLUMN_KINDS:
        given = table.get(kind)
        if given is None:
            continue
        if not isinstance(given, dict):
            problems.append(f"{where}: {kind} must be a table, column = expected answer")
            continue
        problems += _column_problems(where, given)
        for column, expected in given.items():
            problem = _expected_problem(where, kind, column, expected)
            if problem:
                problems.append(problem)
            elif column in catalog.METHODS:
                claims.append(Claim(Question(kind, column), expected))
    return claims, problems


def claim_text(claim: Claim) -> str:
    """A claim in words, for a failure line ("verdict of kvcomm is right")."""
    question = claim.question
    if question.kind == "crossed":
        return f"the note crossed by {claim.expected}"
    if question.kind == "which":
        return f"the column among {list(question.among)} that is {question.column} is {claim.expected}"
    over = f" over {question.over}" if question.over else ""
    return f"{question.kind} of {question.column}{over} is {claim.expected!r}"
