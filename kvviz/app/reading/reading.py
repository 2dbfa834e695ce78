"""A run, read once: what each column showed, typed, and the answer to any question about it.

``read(payload, answers)`` turns a run's results (``kvviz.app.present.payload``: a preset's stored
run, a live run's, a saved one) into a ``Reading``: per column its mark, its evidence
(``kvviz.app.reading.evidence``), what it did with the swapped note, the layers it sent, its time
(alone or in a shared run, on which pair, with its time alone beside it where one was measured for
this question, pair and settings), its bytes, its answer and what it did with an inserted
contradiction (``kvviz.app.reading.contradicted``); and ``Reading.answer(question)`` for
every question of the vocabulary (``kvviz.app.reading.questions``). The page's cards, strip and
status line, the lessons, the exercises, the walk-through's predictions, the workshop and ``/run``
read a run through it and never read a result dict themselves; it is built once per run (and once
per expected answer the learner types), never while drawing.

The only reads of result dicts in the app are here (``HandoffResult.from_dict`` and the few keys
the page adds to a result: how it was timed, its time alone). Plain Python: no torch, no Gradio.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvviz.app.reading import catalog, evidence
from kvviz.app.reading.contradicted import Contradicted, contradicted_of, counter_evidence
from kvviz.app.reading.questions import Claim, Question, agrees, claim_text
from kvviz.core.results import HandoffResult
from kvviz.data.metrics import verdict

FINISHED = ("right", "wrong", "none", "na", "failed", "unmarked")
STATES = ("waiting", "running", "stopped", "notstarted", "notrun")  # a column with no result yet


@dataclass(frozen=True)
class Timing:
    """A column's time, as what it is: ``timed`` "alone" (the handoff timed by itself on a warm
    process, as a preset's stored run is: its own cost) or "shared" (a live run's wall clock while its
    columns shared the CPU), on ``pair``; ``alone``: its time alone on this question, pair and
    settings, beside a shared time (a preset's stored run), when one was measured."""

    total: float
    timed: str
    pair: str
    alone: float | None = None
    first_token: float | None = None
    receiver_side: float | None = None


@dataclass(frozen=True)
class Swapped:
    """What a column did with the swapped note: its outcome (followed, kept, neither; "none" when no
    swapped note ran or it could not be judged) and its answer there."""

    outcome: str = "none"
    answer: str = ""
    applicable: bool = True
    changed: str = ""
    context: str = ""  # the swapped note
    pair: str = ""  # set when the sharer was swapped instead (the pair it ran on; "opposite": the pair's own)
    answer_tokens: tuple[str, ...] = ()
    answer_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class WhatIf:
    """A column's answer in one of a preset's stored runs at other settings, with its mark."""

    label: str
    answer: str
    mark: str


@dataclass(frozen=True)
class Column:
    """One column of a run: its result (None until it finishes), its state, and what it showed."""

    name: str
    state: str  # "finished", or one of STATES
    result: HandoffResult | None
    mark: str  # FINISHED (a result's) or a state
    evidence: str | None = None
    swap: Swapped = Swapped()
    timing: Timing | None = None
    what_ifs: tuple[WhatIf, ...] = ()
    contradicted: Contradicted = Contradicted()  # on the note with a contradicting sentence, when one ran
    raw: dict | None = field(default=None, repr=False, compare=False)  # its result as the payload holds it (JSON)

    @property
    def label(self) -> str:
        return catalog.label_of(self.name)

    @property
    def applicable(self) -> bool:
        return self.result is not None and self.result.applicable

    @property
    def answer(self) -> str:
        return "" if self.result is None else self.result.answer

    @property
    def reason(self) -> str:
        return "" if self.result is None else self.result.reason

    @property
    def sent_layers(self) -> list[int]:
        """The layers it says it sent (its per-layer records marked ``selected``)."""
        records = [] if self.result is None else self.result.layers or []
        return sorted(record["layer"] for record in records if record.get("selected"))

    @property
    def bytes(self) -> int:
        return 0 if self.result is None else int(self.result.bytes_communicated or 0)

    @property
    def message(self) -> str:
        """The message its sharer wrote ("" for a handoff that writes none)."""
        return "" if self.result is None else str((self.result.seen or {}).get("message", ""))

    @property
    def gain(self) -> str | None:
        """Its held-out communication gain's 95% interval against 0 ("includes 0", "above 0",
        "below 0"), where its details hold one (C2C's, measured by eval-fuser)."""
        measured = (self.result.details or {}).get("communication") if self.result is not None else None
        low, high = (measured or {}).get("ci95") or (None, None)
        if low is None or high is None:
            return None
        return "includes 0" if low <= 0 <= high else "above 0" if low > 0 else "below 0"

    def evidence_sentence(self) -> str:
        return evidence.sentence(self.label, self.evidence)


@dataclass(frozen=True)
class Reading:
    """One run, read: its columns in page order and what they were asked (see the module)."""

    columns: dict[str, Column]
    answers: tuple[str, ...] = ()
    subject: str = "The expected answer"
    pair: str = ""
    stamp: str = ""
    preset: str | None = None
    precomputed: bool = False
    request: dict = field(default_factory=dict)
    swap: dict | None = None  # the swapped note's change and answers, when one ran
    swap_shown: bool = False  # the page shows what each column did with it (after Swap the fact)
    contradiction: dict | None = None  # the inserted sentence, its (counter) answers and what it changed, when one ran
    contradiction_shown: bool = False  # the page shows what each column did with it (after Insert a contradiction)
    shared: str = ""  # how this run shares another learner's (the server's shared runs), if it does
    payload: dict = field(default_factory=dict, repr=False, compare=False)  # what it was read from (the JSON)

    def __deepcopy__(self, memo):  # read-only once built: a session's copy is the same reading
        return self

    # --- what it was asked ---
    @property
    def query(self) -> str:
        return str(self.request.get("query") or "")

    @property
    def context(self) -> str:
        return str(self.request.get("context") or "")

    def asks(self, query: str, context: str, pair: str) -> bool:
        """Whether this run answers this question and note on this pair (a reading of nothing
        answers anything: there is nothing to contradict)."""
        if not self.finished():
            return True
        return (self.query.strip() == (query or "").strip() and self.context.strip() == (context or "").strip()
                and (self.pair or pair) == pair)

    @property
    def swap_changed(self) -> str:
        """What the swapped note changed ("4471 -> 3902", "the sharer that learned the opposite"), when one ran."""
        return str((self.swap or {}).get("changed") or "")

    @property
    def swap_answers(self) -> tuple[str, ...]:
        """The answers the swapped note should give, when one ran."""
        return tuple(str(answer) for answer in (self.swap or {}).get("answers") or ())

    # --- its columns ---
    def column(self, name: str) -> Column:
        return self.columns.get(name) or Column(name, "notrun", None, "notrun")

    def finished(self) -> list[Column]:
        """The columns with a result, in page order."""
        return [column for column in self.columns.values() if column.result is not None]

    def results(self, names=None) -> list[HandoffResult]:
        """The typed results of ``names`` (default: every column with one), in page order."""
        return [column.result for column in self.finished() if names is None or column.name in names]

    def result(self, name: str) -> HandoffResult | None:
        return self.column(name).result

    def marks(self, names) -> dict[str, str]:
        """Each of ``names``'s mark, in page order."""
        return {name: self.column(name).mark for name in catalog.in_page_order(names)}

    def evidence(self, names) -> dict[str, str]:
        """Each of ``names`` that has evidence (``evidence.rule``), in page order."""
        return {name: kind for name in catalog.in_page_order(names) if (kind := self.column(name).evidence)}

    def crossed(self, names=None) -> list[str]:
        """The columns (of ``names``) the note's content crossed by, in page order."""
        return [name for name, kind in self.evidence(names if names is not None else self.columns).items()
                if kind in evidence.GOT_THROUGH]

    def swap_outcomes(self, names) -> dict[str, str]:
        """What each of ``names`` did with the swapped note, for those it ran for."""
        return {name: self.column(name).swap.outcome for name in catalog.in_page_order(names)
                if self.column(name).swap.outcome != "none"}

    def contradiction_outcomes(self, names) -> dict[str, str]:
        """Which answer each of ``names`` gave on the contradicted note, for those judged there."""
        return {name: self.column(name).contradicted.outcome for name in catalog.in_page_order(names)
                if self.column(name).contradicted.mark != "notrun"}

    # --- questions ---
    def answer(self, question: Question):
        """The run's answer to ``question`` (``kvviz.app.reading.questions``); None where it cannot
        say (a column that did not run, a ratio over nothing, a swap that did not run)."""
        if question.kind == "crossed":
            return sorted(self.crossed())
        if question.kind == "which":
            found = [name for name in question.among if question.column in self._outcomes(name)]
            return found[0] if len(found) == 1 else None
        column = self.column(question.column)
        if column.result is None:
            return None
        return _column_answer(self, column, question)

    def _outcomes(self, name: str) -> set[str]:
        column = self.column(name)
        return {column.mark, column.swap.outcome, column.evidence or ""} if column.result is not None else set()

    def holds(self, claim: Claim, tolerance: float = 0.0) -> bool:
        return agrees(claim.question, claim.expected, self.answer(claim.question), tolerance)

    def failures(self, claims: list[Claim], where: str) -> list[str]:
        """The claims this run does not show, one line each (what was claimed, what it shows)."""
        out = []
        for claim in claims:
            missing = [name for name in claim.question.columns() if claim.question.kind != "crossed"
                       and name not in self.columns]
            if missing:
                out.append(f"{where}: no result for {', '.join(missing)} ({claim_text(claim)})")
            elif not self.holds(claim):
                shown = self.answer(claim.question)
                said = f" ({self.column(claim.question.column).answer!r})" if claim.question.column in self.columns else ""
                out.append(f"{where}: {claim_text(claim)}, the run shows {shown!r}{said}")
        return out


def _measure(column: Column, kind: str) -> float | None:
    if not column.applicable:
        return None
    if kind == "seconds":
        return None if column.timing is None else column.timing.total
    return float(column.bytes)


def _column_answer(reading: Reading, column: Column, question: Question):
    kind = question.kind
    if kind == "verdict":
        return column.mark
    if kind == "evidence":
        return column.evidence or "none"
    if kind == "follow":
        return None if column.swap.outcome == "none" else column.swap.outcome
    if kind == "contradicted":
        return None if column.contradicted.mark == "notrun" else column.contradicted.outcome
    if kind == "beats":
        control = reading.columns.get(catalog.control_of(column.name))
        if control is None or control.result is None:
            return None
        return "yes" if column.mark == "right" and control.mark != "right" else "no"
    if kind == "layers":
        return len(column.sent_layers)
    if kind == "sent":
        return column.sent_layers
    if kind == "says":
        return column.answer
    if kind == "writes":
        return column.message
    if kind == "gain":
        return column.gain
    value = _measure(column, kind)
    if question.over is None or value is None:
        return value
    below = reading.columns.get(question.over)
    base = None if below is None or below.result is None else _measure(below, kind)
    return None if not base else value / base


# --- building a reading ---------------------------------------------------------------------------


def mark_of(result: HandoffResult, answers) -> str:
    """A finished result's mark: right / wrong / none (``kvviz.data.metrics.verdict``), "na" when
    its handoff does not apply, "failed" when it raised, "unmarked" with no expected answer."""
    if not result.applicable:
        return "failed" if "traceback" in (result.details or {}) else "na"
    return verdict(result.answer, list(answers)) or "unmarked"


def _swapped(record: dict | None) -> Swapped:
    if not record:
        return Swapped()
    return Swapped(outcome=record.get("outcome") or "none", answer=str(record.get("answer") or ""),
                   applicable=bool(record.get("applicable", True)), changed=str(record.get("changed") or ""),
                   context=str(record.get("context") or ""), pair=str(record.get("pair") or ""),
                   answer_tokens=tuple(record.get("answer_tokens") or ()), answer_ids=tuple(record.get("answer_ids") or ()))


def _timing(raw: dict, result: HandoffResult, pair: str, timed: str | None) -> Timing | None:
    total = (result.timings or {}).get("total")
    if total is None or not result.applicable:
        return None
    how = raw.get("timed") or timed or ("alone" if result.precomputed else "shared")
    alone = raw.get("alone_total")
    return Timing(float(total), how, pair, None if alone is None or how == "alone" else float(alone),
                  result.first_token_seconds, result.receiver_first_token_seconds)


def typed(raw: dict, pair: str = "") -> HandoffResult:
    """A result dict as the one result type (what the page adds to it, how it was timed, read apart)."""
    return raw if isinstance(raw, HandoffResult) else HandoffResult.from_dict({"pair": pair, **raw})


def _what_ifs(runs, answers) -> tuple[WhatIf, ...]:
    out = []
    for label, raw in runs or ():
        result = typed(raw)
        out.append(WhatIf(label, result.answer if result.applicable else "(not applicable)", mark_of(result, answers)))
    return tuple(out)


def _evidence(columns: dict[str, Column]) -> dict[str, Column]:
    """Every column with its evidence, read from its own mark, its control's and its swap; and what
    giving an inserted contradiction's value is evidence of, from its own and its control's."""
    out = {}
    for name, column in columns.items():
        control = catalog.control_of(name)
        held = columns.get(control)
        control_mark = "notrun" if held is None else held.mark
        kind = evidence.rule(column.mark, bool(control), control_mark, column.swap.outcome) if column.result else None
        countered = counter_evidence(column.contradicted, bool(control), None if held is None else held.contradicted)
        if countered != column.contradicted.evidence:
            column = _replace(column, contradicted=replace(column.contradicted, evidence=countered))
        out[name] = column if kind == column.evidence else _replace(column, evidence=kind)
    return out



def _replace(column: Column, **changes) -> Column:
    return Column(**{**column.__dict__, **changes})


def read(payload: dict | None, answers=(), subject: str = "The expected answer", states: dict[str, str] | None = None,
         previous: Reading | None = None) -> Reading:
    """The reading of a payload's results by the gold ``answers``; ``states``: the columns that
    have no result yet and what they are doing (a live run's waiting, running, stopped ...);
    ``previous``: a reading of the same run by the same answers, whose marks are kept where a
    column's answer is the same (a live run read again as each column finishes)."""
    payload = payload or {}
    answers = tuple(answers or ())
    pair, timed = str(payload.get("pair") or ""), payload.get("timed")
    what_ifs = payload.get("what_ifs") or {}
    kept = previous.columns if previous is not None and previous.answers == answers else {}
    columns: dict[str, Column] = {}
    for raw in payload.get("results") or []:
        name = raw["handoff"]
        result, old = typed(raw, pair), kept.get(name)
        same = old is not None and old.result is not None and (old.result.answer, old.result.applicable) == (
            result.answer, result.applicable)
        columns[name] = Column(name, "finished", result, old.mark if same else mark_of(result, answers),
                               swap=_swapped(raw.get("swap")), timing=_timing(raw, result, pair, timed),
                               what_ifs=old.what_ifs if same else _what_ifs(what_ifs.get(name), answers),
                               contradicted=contradicted_of(raw.get("contradiction")), raw=raw)
    for name, state in (states or {}).items():
        if name not in columns:
            columns[name] = Column(name, state, None, state)
    ordered = {name: columns[name] for name in catalog.in_page_order(columns)}
    ordered.update({name: column for name, column in columns.items() if name not in ordered})  # not a page column
    return Reading(_evidence(ordered), answers, subject, pair, str(payload.get("stamp") or ""), payload.get("preset"),
                   bool(payload.get("precomputed")), dict(payload.get("request") or {}), payload.get("swap"),
                   bool(payload.get("swap_shown")), payload.get("contradiction"), bool(payload.get("contradiction_shown")),
                   str(payload.get("shared") or ""), payload)
