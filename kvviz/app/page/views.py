"""What the page shows for a run, as ``{role: value}`` updates (no Gradio): every card, the verdict
strip, the lesson, whether the cards answer the question the page asks, the swapped note and the
contradicted one.

A run is read once (``kvviz.app.reading.read``: its marks, evidence, swaps and times) when it
arrives: a preset's stored run once per process (``PresetRuns``), a live run as it streams
(``kvviz.app.page.run``), a saved run when it is opened, and again only when the learner types
another expected answer. Everything here renders that reading; nothing here reads a result or
computes a mark. A *payload* is ``present.payload(...)`` plus a ``stamp`` naming the results it
holds ("preset:KEY" for a precomputed preset, "shared:ID" for the whole results of a computation
the server's shared runs name, "run:N" for a live run's own): what the tabs draw is keyed by it
(``kvviz.app.page.tabs``).

Roles: ``status``, ``verdict``, ``lesson``, ``reading`` (the run's reading, kept with the results),
and per column ``head:NAME`` (title and mark), ``answer:NAME``, ``stats:NAME`` (the card's line),
``notes:NAME`` (the long stats, in "What each model saw") and ``seen:NAME``.
"""

from __future__ import annotations

import threading

from kvviz.app import present
from kvviz.app.page.spec import column_names, expected_text
from kvviz.app.page.tabs import live_stamp, shared_stamp  # noqa: F401 (the run's stamps, for kvviz.app.page.run)
from kvviz.app.presets import PRESETS, preset
from kvviz.app.reading import against, catalog
from kvviz.app.reading.questions import Claim
from kvviz.app.reading.reading import Column, Reading, read
from kvviz.data.contradictions import Contradiction
from kvviz.data.swaps import Swap, swap_record
from kvviz.engine.contradiction import contradiction_record

OTHER_SUBJECT = "The expected answer"


def subject_of(payload: dict | None) -> str:
    key = (payload or {}).get("preset")
    return preset(key).subject if key else OTHER_SUBJECT


def reading_of(payload: dict | None, answers, states: dict[str, str] | None = None,
               previous: Reading | None = None) -> Reading:
    """The reading of a payload by the gold ``answers`` (the strip's subject is its preset's)."""
    return read(payload, answers, subject_of(payload), states, previous)


# --- cards, strip, lesson -----------------------------------------------------------------------


def card(name: str, reading: Reading | None, state: str = "", partial: str | None = None,
         message: str | None = None) -> dict:
    """Every role of one column's card (``present.card``): its result's, or, with ``state`` and no
    result yet, what it is doing (waiting, running, stopped ...)."""
    column = reading.column(name) if reading is not None else None
    if column is None or (state and column.result is None):
        column = Column(name, state or "notrun", None, state or "notrun")
    return present.card(column, partial, swapped=reading is not None and reading.swap_shown, message=message,
                        contradicted=contradiction_answers(reading))


def contradiction_answers(reading: Reading | None) -> tuple[str, str] | None:
    """(gold, counter): the answers a card's contradicted-note row names its probabilities by, while
    the page shows that row; else None."""
    if reading is None or not reading.contradiction_shown:
        return None
    counter = (reading.contradiction or {}).get("answers") or ["the inserted value"]
    return (reading.answers[0] if reading.answers else "the original", counter[0])


def verdict(reading: Reading, names) -> dict:
    return {"verdict": present.verdict_strip_html(reading, names)}


def cards(reading: Reading, names) -> dict:
    """Every column's card (ticked or not, so that ticking one shows it at once) and the strip over
    the ticked ones; with the swapped note shown each card says what it did with it."""
    updates = {}
    for name in column_names():
        updates.update(card(name, reading))
    return {**updates, **verdict(reading, names)}


def cards_and_verdict(payload: dict | None, names, answers, subject: str | None = None) -> dict:
    """A payload read (``reading_of``) and shown: every card, the strip, and the reading itself."""
    reading = read(payload, answers, subject or subject_of(payload))
    return {**cards(reading, names), "reading": reading}


def lesson_of(reading: Reading | None, presets: PresetRuns | None = None) -> str:
    """The lesson line for results that answer a preset's question (empty otherwise). A live run
    (or a saved one) is read against the claims of the stored run whose settings it repeats
    (``stored_settings``, against ``presets``' stored runs): its line says whether it shows the
    lesson too, names each claim it contradicts with both answers, or says what it lacks to check
    the rest; at other settings, unmarked or marked against another expected answer, it says the
    lesson is not checked against it."""
    key = reading.preset if reading is not None else None
    if not key:
        return ""
    picked = preset(key)
    lesson = present.md(picked.lesson)
    if reading.precomputed or not reading.finished():
        return f"**Lesson:** {lesson}"
    stored = presets(key)[0] if presets is not None else {}
    if not stored.get("request"):
        return f"**The preset's lesson** (not checked: this server has no precomputed run of it): {lesson}"
    if not reading.answers:
        return f"**The preset's lesson** (not checked: this run is unmarked, with no expected answer): {lesson}"
    if folded(reading.answers) != folded(picked.answers):
        return (f"**The preset's lesson** (from its precomputed run, marked against {present.md(expected_text(picked.answers))}; "
                f"this run is marked against another expected answer, so it is not checked against the lesson): {lesson}")
    what_if = stored_settings(picked, stored, reading.request, reading.pair or stored.get("pair", ""), list(reading.columns))
    if what_if is None:
        return (f"**The preset's lesson** (from its precomputed run; this run used other settings or another pair, "
                f"which the lesson says nothing about): {lesson}")
    claims = next((run.claims for run in picked.runs if run.label == what_if), []) if what_if else picked.claims
    at = f", at the settings of its stored run *{present.md(what_if)}*" if what_if else ""
    swap_expected = not what_if and picked.swap is not None  # the what-if runs ran no swap
    swap_ran = swap_expected and same_swap(reading, picked.swap)
    held, contradicted, unanswered = against.sort_claims(reading, claims, swap_expected, swap_ran)
    if contradicted:
        shown = "; ".join(claim_against(claim, reading, swap_expected) for claim in contradicted[:3])
        more = f"; and {len(contradicted) - 3} more" if len(contradicted) > 3 else ""
        return (f"**The preset's lesson**, from its precomputed run{at}. **This run shows otherwise** "
                f"({shown}{more}): {lesson}")
    if unanswered:
        needs = needed_for(reading, unanswered, swap_expected, swap_ran, bool(picked.swap_words))
        rest = "the other one needs" if len(unanswered) == 1 else f"the other {len(unanswered)} need"
        return (f"**The preset's lesson** (from its precomputed run{at}; this run agrees with {len(held)} of the "
                f"lesson's {len(claims)} checks, and {rest} {needs}): {lesson}")
    return f"**Lesson** (this run shows it too{at}): {lesson}"


def folded(answers) -> list[str]:
    """Expected answers as compared with a preset's: case and surrounding space aside."""
    return [str(answer).strip().casefold() for answer in answers]


def same_swap(reading: Reading, swap: Swap) -> bool:
    """Whether ``reading`` ran ``swap`` (a preset's): the same change, with the same answers."""
    return reading.swap_changed == swap.changed and folded(reading.swap_answers) == folded(swap.answers)


def claim_against(claim: Claim, reading: Reading, swap_expected: bool = False) -> str:
    """A lesson's claim beside what a run shows, in words ("KVComm: right in the lesson, wrong here")."""
    question = claim.question
    if question.kind == "crossed":
        judgeable = against.judged(reading, swap_expected)

        def named(names):
            return ", ".join(catalog.label_of(name) for name in catalog.in_page_order(set(names) & judgeable)) or "no column"
        return f"got through by {named(claim.expected)} in the lesson, by {named(reading.crossed())} here"
    subject = catalog.label_of(question.column) if question.column else "the column"
    kind = present.CLAIM_KIND_WORDS.get(question.kind, f" {question.kind}")
    return (f"{present.md(subject)}{kind}: {present.md(present.claim_answer(claim.expected, question.kind))} in the "
            f"lesson, {present.md(present.claim_answer(reading.answer(question), question.kind))} here")


def needed_for(reading: Reading, unanswered: list[Claim], swap_expected: bool, swap_ran: bool, words: bool = True) -> str:
    """What a run lacks to check ``unanswered`` claims: the preset's swap, results of some columns,
    an inserted contradiction, in words."""
    needs = []
    if swap_expected and not swap_ran and any(against.depends_on_swap(claim) for claim in unanswered):
        needs.append("the preset's swap (**Swap the fact**" + (" with its words)" if words else ")"))
    lacking = against.lacking(reading, unanswered, swap_expected, swap_ran)
    if lacking:
        labels = [catalog.label_of(name) for name in lacking]
        needs.append(f"a result from {', '.join(labels)}" if len(labels) <= 4 else f"results from {len(labels)} more columns")
    if any(claim.question.kind == "contradicted" for claim in unanswered):
        needs.append("an inserted contradiction (**Insert a contradiction**)")
    return " or ".join(needs) or "what this run did not measure"


def stale_view(reading: Reading, pair: str) -> dict:
    """The page while its results answer another question or pair than the one it now asks: every
    card keeps its answer, greyed and marked "other question" (no ✓ or ✗ for a question it was not
    asked), the strip says which question they answer, and no preset, lesson, expected answer or
    swap is claimed for the question asked now."""
    updates = {f"head:{column.name}": present.card_head_html(column.name, "stale") for column in reading.finished()}
    return {**updates, "presets": None, "lesson": "", "verdict": present.stale_strip_html(reading, pair),
            "status": f"**Not run yet** on *{present.md(pair)}*: the cards show another question's answers, greyed. "
                      "**Run live** answers this one."}


def question_view(reading: Reading, query: str, context: str, pair: str, names, presets: PresetRuns | None = None) -> dict:
    """What the page shows for the question, note and pair it now asks: the run as it is when it
    answers them (marks, strip, the preset's lesson), else ``stale_view``."""
    if reading.asks(query, context, pair):
        return {**cards(reading, names), "lesson": lesson_of(reading, presets),
                "presets": reading.preset if reading.precomputed else None}
    return stale_view(reading, pair)


def cleared_question() -> dict:
    """What a new question (typed, pasted, dropped, autofilled, opened from a link) takes away: the
    old question's expected answer, swap words and contradicting sentence."""
    return {"expected": "", "swap_replace": "", "swap_by": "", "swap_answer": "", "contra_sentence": "", "contra_answer": ""}


def asked_view(reading: Reading, query: str, context: str, pair: str, names, presets: PresetRuns | None = None) -> dict:
    """The page after the question, the note or the pair changed: while the run answers what is
    asked, its cards, marks, preset, lesson, expected answer and swap words (the run's own, so that
    asking its question again brings them back); else every card greyed and none of them."""
    if not reading.asks(query, context, pair):
        return {**stale_view(reading, pair), **cleared_question()}
    kept = {"expected": expected_text(reading.answers), "status": asked_again_status(reading)}
    if reading.preset and reading.precomputed:
        kept.update(swap_fields(preset(reading.preset)))
    return {**question_view(reading, query, context, pair, names, presets), **kept}


def asked_again_status(reading: Reading) -> str:
    """The status line when the page asks its run's question again: what the cards show, on which pair."""
    if reading.preset and reading.precomputed:
        return present.precomputed_status(preset(reading.preset).title, reading.pair)
    return f"The cards show this question's last run on *{present.md(reading.pair)}* (**Run live** runs it again)."


# --- the swapped note (Swap the fact) --------------------------------------------------------------


def swap_fields(picked) -> dict:
    """The swap fields for a preset: its stored swap's words and answer (empty without one; a swap
    of the sharer changes no word of a note, so only its answer), and its contradicting sentence and
    what it answers (``Preset.contradiction``; empty without one)."""
    old, new = picked.swap_words or ("", "")
    made = picked.contradiction
    return {"swap_replace": old, "swap_by": new,
            "swap_answer": expected_text(picked.swap.answers) if picked.swap else "",
            "contra_sentence": made.sentence if made else "", "contra_answer": expected_text(made.answers) if made else ""}


def same_request(payload: dict | None, request: dict, pair: str | None = None) -> bool:
    """Whether the payload's results answer this request (question, note, settings, options) and,
    given, on this pair."""
    held = (payload or {}).get("request") or {}
    same_pair = pair is None or (payload or {}).get("pair") == pair
    return same_pair and all(held.get(part) == request.get(part) for part in ("query", "context", "generation", "options"))


def stored_settings(picked, payload: dict, request: dict, pair: str, columns: list[str]) -> str | None:
    """Which of ``picked``'s stored runs a run of ``columns`` (``request`` on ``pair``) repeats the
    settings of: "" its main run (``payload``, the one its lesson is about), a stored run's label
    (the same with that run's options, as "KVComm at ratio 0.35"), or None (other settings: its
    lesson says nothing of them). Only what can change the run's columns counts (``run_settings``)."""
    held = payload.get("request") or {}
    if (payload.get("pair") or pair) != pair or not held:
        return None
    asked = run_settings(request, columns)
    if run_settings(held, columns) == asked:
        return ""
    for run in picked.runs:
        options = {name: {**values, **run.options.get(name, {})} for name, values in (held.get("options") or {}).items()}
        if run_settings({**held, "options": options}, columns) == asked:
            return run.label
    return None


def run_settings(request: dict, columns: list[str]) -> dict:
    """What of a request can change the answers of ``columns``: its question and note, its decoding
    (the temperature, top-p and seed only when it samples) and the options of the handoffs behind
    those columns (a control runs on its handoff's options)."""
    generation = dict(request.get("generation") or {})
    if generation.get("greedy", True):
        generation = {"max_new_tokens": generation.get("max_new_tokens"), "greedy": True}
    behind = set(columns) | {name for name in catalog.names() if catalog.control_of(name) in columns}
    options = {name: values for name, values in (request.get("options") or {}).items() if name in behind}
    return {"query": request.get("query"), "context": request.get("context"), "generation": generation, "options": options}


def holds_swap(reading: Reading, names, swap: Swap) -> bool:
    """Whether every column in ``names`` already ran this swap (a preset's stored swap): the same
    swapped note, or the same sharer swap."""
    def ran(held) -> bool:
        return bool(held.changed) and held.context == (swap.context or "") and held.pair == (swap.pair or "")
    return bool(names) and all(ran(reading.column(name).swap) for name in names)


def with_swap(payload: dict, originals: dict[str, dict], swapped: dict[str, dict], names, swap: Swap,
              answers: list[str]) -> dict:
    """A new payload: each column's result on the note (``originals``) with what it did on the
    swapped note (``swapped``; ``kvviz.data.swaps.swap_record``, judged by ``answers`` where given)."""
    return _with_other_note(payload, originals, swapped, names, "swap", swap,
                            lambda original, other: swap_record(original, other, swap, answers or None))


def with_contradiction(payload: dict, originals: dict[str, dict], contradicted: dict[str, dict], names,
                       made: Contradiction, answers: list[str]) -> dict:
    """A new payload: each column's result on the note (``originals``) with what it did on the
    contradicted note (``contradicted``; ``kvviz.engine.contradiction.contradiction_record``, judged
    by ``answers``)."""
    return _with_other_note(payload, originals, contradicted, names, "contradiction", made,
                            lambda original, other: contradiction_record(original, other, made, answers or None))


NOTE_OF = {"swap": "the swapped note", "contradiction": "the contradicted note"}


def _with_other_note(payload: dict, originals: dict[str, dict], others: dict[str, dict], names, kind: str, made,
                     judged) -> dict:
    """A payload with each column's ``kind`` record (``judged(original, other)``), shown; the other
    kind's row stays shown where every column still holds its record (the same note's run)."""
    results = []
    for name in names:
        other = others.get(name) or {"applicable": False, "reason": f"it did not run on {NOTE_OF[kind]}"}
        results.append({**originals[name], kind: judged(originals[name], other)})
    data = present.payload(payload["pair"], payload["request"], results, False, payload.get("preset"))
    kept = next(k for k in NOTE_OF if k != kind)
    if payload.get(f"{kept}_shown") and all(result.get(kept) for result in results):
        data.update({kept: payload.get(kept), f"{kept}_shown": True})
    return dict(data, stamp=live_stamp(), **{kind: made.to_dict(), f"{kind}_shown": True})


def swap_view(reading: Reading, names) -> dict:
    """The page once the swapped note ran: every card with its swapped answer and outcome, the
    strip, the status line that sums them up, the results and their reading."""
    return {**cards(reading, names), "results": reading.payload, "reading": reading,
            "status": present.swap_status(reading, names)}


def contradiction_view(reading: Reading, names) -> dict:
    """The page once the contradicted note ran: every card with which answer it gave there and the
    two answers' first-token probabilities, the strip, the status line, the results and their reading."""
    return {**cards(reading, names), "results": reading.payload, "reading": reading,
            "status": present.contradiction_status(reading, names)}


def preset_matching(query: str, context: str | None) -> str | None:
    """The preset whose question this is (same query and context), if any."""
    for candidate in PRESETS:
        if candidate.query.strip() == (query or "").strip() and (candidate.context or "") == (context or "").strip():
            return candidate.key
    return None


# --- precomputed payloads -----------------------------------------------------------------------


def precomputed_payload(precomputed: dict, key: str, default_pair: str) -> tuple[dict, str]:
    """A preset's precomputed results as a payload, and its status line (or an empty payload that
    says how to get results)."""
    entry = (precomputed.get("presets") or {}).get(key)
    title = preset(key).title
    if not entry:
        payload = dict(present.payload(preset(key).pair or default_pair, None, [], True, key), stamp=f"preset:{key}")
        return payload, (f"No precomputed results for **{present.md(title)}**: press **Run live** to compute them "
                         "on this machine.")
    timed = precomputed.get("timed", "alone")  # how its times were taken (scripts/precompute_presets.py)
    results = [dict(raw, precomputed=True, timed=timed) for raw in entry["results"] if raw["handoff"] in catalog.METHODS]
    pair = entry.get("pair") or precomputed.get("pair", default_pair)  # a preset may name its own pair
    what_ifs: dict[str, list] = {}  # column -> [(label, result)]: the preset's stored runs at other settings
    for label, run in (entry.get("runs") or {}).items():
        for raw in run.get("results", []):
            what_ifs.setdefault(raw["handoff"], []).append((label, raw))
    # a swap of the sharer (its pair's sharer that learned the opposite) is the preset's lesson: shown at once
    swap_shown = bool((entry.get("swap") or {}).get("pair"))
    payload = dict(present.payload(pair, entry.get("request"), results, True, key), stamp=f"preset:{key}",
                   swap=entry.get("swap"), what_ifs=what_ifs, swap_shown=swap_shown)
    # a preset re-run on its own (precompute_presets.py --preset) carries its own stamp
    return payload, present.precomputed_status(title, pair, entry.get("generated") or precomputed.get("generated", ""))


class PresetRuns:
    """Each preset's stored run, read once per process by its own answers and shared by every
    session: (payload, status line, reading)."""

    def __init__(self, precomputed: dict, default_pair: str):
        self.precomputed, self.default_pair = precomputed, default_pair
        self._read: dict[str, tuple[dict, str, Reading]] = {}
        self._lock = threading.Lock()

    def __call__(self, key: str) -> tuple[dict, str, Reading]:
        with self._lock:
            if key not in self._read:
                payload, status = precomputed_payload(self.precomputed, key, self.default_pair)
                picked = preset(key)
                self._read[key] = (payload, status, read(payload, picked.answers, picked.subject))
            return self._read[key]
