"""What a column did with the inserted contradiction, typed: the second counterfactual beside the
swapped fact (``kvviz.data.contradictions``; run by ``kvviz.engine.contradiction``, whose
``contradiction_record`` is what a result holds).

The note keeps its fact and gets one sentence after it that states another value. Per column: which
answer it gave on that note (``outcome``: "gold", the value stated first; "counter", the inserted
one; "both"; "neither"), the receiver's probability of each answer's first content token there and
on the plain note (the last layer of the logit lens), which of the two it finds likelier (``leans``),
and what giving the inserted value is evidence of, by the one evidence rule
(``kvviz.app.reading.evidence.rule``, read with "gave the inserted value" as the column's mark and
its control's): "differs" where its control did not give it, "not needed" where its control gave it
anyway (it is not the handoff's doing), "own" for a column with no control, "unchecked" where the
control did not run on the contradicted note. Plain Python: no torch, no Gradio.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.app.reading import evidence

NOT_RUN = "none"  # the outcome of a column no contradicted note ran for (or that could not be judged)


@dataclass(frozen=True)
class Contradicted:
    """One column on the contradicted note (``ran`` False: none ran for it)."""

    ran: bool = False
    outcome: str = NOT_RUN  # gold / counter / both / neither, or NOT_RUN
    answer: str = ""
    applicable: bool = True
    p_gold: float | None = None  # on the contradicted note (0 to 1; None: no lens recorded)
    p_counter: float | None = None
    p_gold_clean: float | None = None  # on the plain note, where its run followed the counter answer too
    p_counter_clean: float | None = None
    gold_token: str = ""  # the first content tokens followed
    counter_token: str = ""
    same_first_token: bool = False  # both answers begin with one token: the probabilities cannot tell them apart
    evidence: str | None = None  # what giving the inserted value is evidence of (the module docstring)

    @property
    def mark(self) -> str:
        """Its answer on the contradicted note as a mark for the one evidence rule: "right" where it
        gave the inserted value (only), "wrong" where it gave anything else, "notrun" where no
        contradicted note ran for it (or it could not be judged)."""
        if not self.ran or self.outcome == NOT_RUN:
            return "notrun"
        return "right" if self.outcome == "counter" else "wrong"

    @property
    def leans(self) -> str | None:
        """Which answer's first token the receiver finds likelier on the contradicted note: "gold",
        "counter", or None (not recorded, equal, or one token for both)."""
        if self.p_gold is None or self.p_counter is None or self.same_first_token or self.p_gold == self.p_counter:
            return None
        return "gold" if self.p_gold > self.p_counter else "counter"


def _probability(value) -> float | None:
    return None if value is None else float(value)


def contradicted_of(record: dict | None) -> Contradicted:
    """A result's ``contradiction`` record (``kvviz.engine.contradiction.contradiction_record``), typed."""
    if not record:
        return Contradicted()
    return Contradicted(ran=True, outcome=record.get("outcome") or NOT_RUN, answer=str(record.get("answer") or ""),
                        applicable=bool(record.get("applicable", True)), p_gold=_probability(record.get("p_gold")),
                        p_counter=_probability(record.get("p_counter")),
                        p_gold_clean=_probability(record.get("p_gold_clean")),
                        p_counter_clean=_probability(record.get("p_counter_clean")),
                        gold_token=str(record.get("gold_token") or ""), counter_token=str(record.get("counter_token") or ""),
                        same_first_token=bool(record.get("same_first_token")))


def counter_evidence(own: Contradicted, has_control: bool, control: Contradicted | None) -> str | None:
    """What a column's giving the inserted value is evidence of (the one rule; None where it did
    not give it or none ran)."""
    if not own.ran:
        return None
    return evidence.rule(own.mark, has_control, control.mark if control is not None else "notrun", "none")
