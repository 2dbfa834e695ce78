"""The lines above the cards: the verdict strip (which columns got the answer through, by the one
evidence rule, ``kvviz.app.reading.evidence``), the strip while the cards answer another question,
and the status line (a preset's, a live run's as it goes and when it ends, a swap's, a contradiction's,
a refusal),
each naming the pair it is about. Read from the reading of the run; user text escaped."""

from __future__ import annotations

import html

from kvviz.app.present.text import format_seconds, md
from kvviz.app.reading import catalog, evidence
from kvviz.app.reading.reading import Reading
from kvviz.engine.stream import ALL_AT_ONCE

VERDICT_RULE_HINT = ("read as a person reads it (markup and Unicode forms read through); an answer that only "
                     "denies it (\"not X\") or offers it as one of several candidates (\"X or Y\") is wrong")
# the order the strip says the kinds in (got through first)
STRIP_ORDER = (evidence.CROSSED, evidence.KNOWN, evidence.DIFFERS, evidence.DID_NOT_FOLLOW, evidence.NOT_NEEDED,
               evidence.UNCHECKED, evidence.PENDING, evidence.OWN, evidence.MISREAD)


def _labels(names) -> str:
    return ", ".join(catalog.label_of(name) for name in names)


def _evidence_parts(subject: str, kinds: dict[str, str], any_finished: bool) -> list[str]:
    """The strip's clauses: who the note's content crossed by, then each other kind with its columns."""
    by = {kind: [name for name, found in kinds.items() if found == kind] for kind in STRIP_ORDER}
    crossed = by[evidence.CROSSED] + by[evidence.KNOWN]
    parts = [f"{html.escape(subject)} got through by: <b>{_labels(crossed) or 'none'}</b>"] if any_finished else []
    for kind in STRIP_ORDER[1:]:
        if not by[kind]:
            continue
        if kind == evidence.NOT_NEEDED:
            named = "; ".join(f"{catalog.label_of(n)} (and {catalog.label_of(catalog.control_of(n))})" for n in by[kind])
        else:
            named = _labels(by[kind])
        parts.append(f"{evidence.CLAUSES[kind]}: <b>{named}</b>")
    return parts


def verdict_strip_html(reading: Reading, names) -> str:
    """One line over the ticked columns ``names``: whom the note's content got through by (it
    followed the swapped fact), and every other right answer with why it is not that evidence
    (``evidence.CLAUSES``), the wrong ones, those still running and those cut; and what "right"
    means here. Expected answers may be user text: escaped."""
    if not reading.answers:
        return ('<div class="kv-verdict">No expected answer: type one beside the question to mark the columns '
                "(alternatives split by ;).</div>")
    marks, kinds = reading.marks(names), reading.evidence(names)
    finished = any(kind in ("right", "wrong", "none") for kind in marks.values())
    parts = _evidence_parts(reading.subject, kinds, finished)
    wrong = [name for name, kind in marks.items() if kind in ("wrong", "none") and kinds.get(name) != evidence.MISREAD]
    if finished:
        parts.append(f"not by: <b>{_labels(wrong) or 'none'}</b>")
    pending = [name for name, kind in marks.items() if kind in ("waiting", "running")]
    if pending:
        parts.append(("still running: " if finished else "Running: each card gets its mark when it finishes: ")
                     + _labels(pending))
    cut = [name for name, kind in marks.items() if kind in ("stopped", "notstarted", "notrun", "failed")]
    if cut:
        parts.append(f"unfinished: {_labels(cut)}")
    gold = " or ".join(f"“{html.escape(answer)}”" for answer in reading.answers)
    sentence = "; ".join(parts)
    return (f'<div class="kv-verdict">{sentence[:1].upper() + sentence[1:]}. <span class="kv-verdict-rule" '
            f'title="{html.escape(VERDICT_RULE_HINT)}">Right means the answer states {gold}.</span></div>')


def stale_strip_html(reading: Reading, pair: str) -> str:
    """The strip while the cards answer another question or pair than the page now asks: what they
    answer, and how to get this question's answers (the question is user text: escaped)."""
    other_pair = reading.pair and reading.pair != pair
    held = f"“{html.escape(reading.query)}”" + (f" on the pair {html.escape(reading.pair)}" if other_pair else "")
    return (f'<div class="kv-verdict kv-stale">The greyed answers are to {held}, not to this question'
            f"{' and pair' if other_pair else ''}: press <b>Run live</b> to answer it.</div>")


# the status line's clause per swap outcome, for the columns that had it
SWAP_SUMMARIES = {
    "followed": "followed the swap (what they answer is the note's content)",
    "kept": "kept their answer (it did not come from this fact)",
    "neither": "gave neither answer (no sign they read this fact)",
}
# the same, when what was swapped is the sharer (one that learned the opposite facts), not the note
SHARER_SWAP_SUMMARIES = {
    "followed": "followed the swap (what they answer came from the sharer)",
    "kept": "kept their answer (it did not come from the sharer)",
    "neither": "gave neither answer (no sign they read the sharer)",
}


def swap_status(reading: Reading, names) -> str:
    """The status line once the swapped note ran: what changed, which columns followed it, and what
    each outcome means."""
    outcomes = reading.swap_outcomes(names)
    swap = reading.swap or {}
    summaries = SHARER_SWAP_SUMMARIES if swap.get("pair") else SWAP_SUMMARIES
    said = "; ".join(f"{summaries[kind]}: **{_labels(n for n, o in outcomes.items() if o == kind)}**"
                     for kind in summaries if kind in outcomes.values())
    answers = " or ".join(f"“{md(a)}”" for a in swap.get("answers") or [])
    said = said[:1].upper() + said[1:] if said else "No column could be judged"
    if swap.get("pair"):  # the sharer was swapped, not the note
        return (f'<span class="kv-badge">swapped sharer</span> **{md(swap.get("changed", ""))}** in place of the sharer '
                f"of *{md(reading.pair)}*: it answers {answers}. {said}.")
    return (f'<span class="kv-badge">swapped note</span> **{md(swap.get("changed", ""))}** on *{md(reading.pair)}*, so '
            f"the note now answers {answers}. {said}.")


# the status line's clause per answer on the contradicted note, for the columns judged there
CONTRADICTION_SUMMARIES = {
    "counter": "gave the inserted value {counter}",
    "gold": "kept the original {gold}",
    "both": "gave both",
    "neither": "gave neither",
}


def contradiction_status(reading: Reading, names) -> str:
    """The status line once the contradicted note ran: the sentence inserted, which columns gave which
    answer, and those whose control gave the inserted value too (not the handoff's doing)."""
    outcomes = reading.contradiction_outcomes(names)
    inserted = reading.contradiction or {}
    gold = f"“{md(reading.answers[0])}”" if reading.answers else "the original"
    counter = " or ".join(f"“{md(a)}”" for a in inserted.get("answers") or []) or "the inserted value"
    said = [f"{CONTRADICTION_SUMMARIES[kind].format(gold=gold, counter=counter)}: "
            f"**{_labels(n for n, o in outcomes.items() if o == kind)}**"
            for kind in CONTRADICTION_SUMMARIES if kind in outcomes.values()]
    anyway = [n for n in outcomes if reading.column(n).contradicted.evidence == evidence.NOT_NEEDED]
    if anyway:
        said.append(f"its control gave the inserted value too (not the handoff's doing): **{_labels(anyway)}**")
    line = "; ".join(said)
    return (f'<span class="kv-badge">contradicted note</span> the note with “{md(inserted.get("sentence", ""))}” '
            f"inserted after the sentence stating {gold}, on *{md(reading.pair)}*. "
            f"{line[:1].upper() + line[1:] if line else 'No column could be judged'}. Each card gives each answer's "
            "first-token probability, on the plain note → with the sentence inserted.")


def precomputed_status(title: str, pair: str, when: str = "") -> str:
    stamp = f'<span class="kv-when"> ({md(when)})</span>' if when else ""  # left out on a phone
    return f'<span class="kv-badge">precomputed</span> **{md(title)}** on *{md(pair)}*{stamp}. **Run live** runs it here.'


def live_status(pair: str, done: int, total: int, states: dict[str, str], log: str = "") -> str:
    """A live run's line as it stands: on which pair, how many columns are done, which are running
    now (all of them, not the last one started) and how many wait; ``log``: what the run does before
    any column starts (loading the pair, only while it loads)."""
    running = [catalog.title_of(name) for name, state in states.items() if state == "running"]
    waiting = sum(state == "waiting" for state in states.values())
    parts = ([f"running {', '.join(running)}"] if running else []) + ([f"{waiting} waiting"] if waiting else [])
    now = "; ".join(parts) if running or not log else md(log)
    return f"**Live run** on *{md(pair)}* ({done} of {total} done): {now or 'finishing …'}"


def finished_status(pair: str, seconds: float, workers: int, stopped: str = "", shared: str = "") -> str:
    """A finished live run's line, on which pair; ``shared``: how it shares a run computed before
    (for another learner, or by this tab), said instead of "measured in this run"."""
    wall, on = format_seconds(seconds), f"on *{md(pair)}*"
    if shared:
        return f"**Live run finished** {on} in {wall} (wall time): {md(shared)}."
    if stopped:
        return f"**{md(stopped)}** ({wall}, {on}) Every number below was measured in this run."
    if workers == ALL_AT_ONCE:
        side_by_side = (" The handoffs ran side by side, those of one model sharing its decode steps, so each one's"
                        " own times include sharing the CPU.")
    else:
        side_by_side = (f" The handoffs ran {workers} at a time, so each one's own times include sharing the CPU."
                        if workers > 1 else "")
    return f"**Live run finished** {on} in {wall} (wall time). Every number below was measured in this run." + side_by_side


def stopped_status(pair: str, seconds: float, states: dict[str, str]) -> str:
    """After Stop: how long it ran, on which pair, and each column's state (finished, stopped, not started)."""
    named = lambda kind: ", ".join(catalog.title_of(n) for n, state in states.items() if state == kind)  # noqa: E731
    parts = [f"{word} {named(kind)}" for kind, word in (("finished", "finished"), ("stopped", "stopped"),
                                                         ("notstarted", "not started")) if named(kind)]
    return f"**Stopped by you** after {format_seconds(seconds)} on *{md(pair)}*: " + "; ".join(parts) + "."


def refused_status(reason: str) -> str:
    """A request the server refused: the one place the learner reads why (nothing else changes)."""
    return f'<span class="kv-refused">**Not run:** {md(reason)}</span>'
