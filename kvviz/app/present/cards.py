"""One column's card, rendered once for the page and for ``/run``: its head (title, mark, what its
answer is evidence of on hover, its swapped-note row, its contradicted-note row and its what-ifs),
its answer, its one line of numbers (time, on which pair, first token, bytes) and the longer block
in "What each model saw".

Everything comes from the reading of the run (``kvviz.app.reading``): a ``Column`` in, strings out;
no mark or evidence is computed here. Model text is escaped.
"""

from __future__ import annotations

import html
import re

from kvviz.app.present.text import format_seconds, md, notes_of, seen_text, short_pair
from kvviz.app.reading import catalog, evidence
from kvviz.app.reading.contradicted import Contradicted
from kvviz.app.reading.reading import Column, Timing
from kvviz.core.plotkit import human_bytes, ink

# A card's mark: a symbol and a word (never colour alone), and ``data-verdict`` for tests and CSS.
MARK_WORDS = {
    "right": "✓ right",
    "wrong": "✗ wrong",
    "none": "∅ no answer",
    "na": "n/a",
    "failed": "⚠ failed",
    "unmarked": "unmarked",
    "waiting": "waiting",
    "running": "running…",
    "stopped": "■ stopped",
    "notstarted": "not started",
    "notrun": "not run",
    "stale": "other question",
}
MARK_HINTS = {
    "right": "the answer states an expected answer",
    "wrong": "the answer does not state an expected answer (or only denies it, or lists it among other candidates)",
    "none": "the answer is empty",
    "na": "this handoff does not apply to this pair or question",
    "failed": "the handoff failed: its details say why",
    "unmarked": "no expected answer to mark it by: type one beside the question",
    "stopped": "stopped by you before it finished",
    "notstarted": "the run was stopped before this handoff started",
    "notrun": "the run did not reach this handoff",
    "stale": "this answer is to the results' own question (or pair), not to what the page asks now: press Run live",
}
SWAP_WORDS = {"followed": "⇄ followed", "kept": "= kept", "neither": "≠ neither", "none": "no swap run"}
SWAP_MEANINGS = {
    "followed": "followed the swap: what it answers is the note's content",
    "kept": "kept its answer: it did not come from this fact of the note",
    "neither": "gave neither the old answer nor the swapped one: no sign it read this fact",
}
# which answer a column gave on the note with an inserted contradiction (``kvviz.app.reading.contradicted``)
CONTRADICTION_WORDS = {"gold": "= gave the original", "counter": "↯ gave the inserted", "both": "± gave both",
                       "neither": "≠ gave neither", "none": "not judged"}
CONTRADICTION_MEANINGS = {
    "gold": "gave the value the note states first: the inserted sentence did not change its answer",
    "counter": "gave the inserted value: the contradicting sentence reached its answer",
    "both": "gave both values",
    "neither": "gave neither value with the contradicting sentence inserted",
}
ROW_ANSWER_CHARACTERS = 48  # of a long answer on the contradicted note (all of it on hover): the card's own answer stays in view
# what giving the inserted value is evidence of, by its control (the one rule's kinds, said of this row)
COUNTER_EVIDENCE = {
    evidence.DIFFERS: "its control did not give it: it differs from its control on this one example",
    evidence.NOT_NEEDED: "its control gave it too: not the handoff's doing",
    evidence.UNCHECKED: "its control did not run on the contradicted note: unchecked",
    evidence.OWN: "it has no control: no handoff to judge",
}
STATE_LINES = {"running": "*running …*", "waiting": "*waiting for its turn*", "stopped": "*stopped before it finished*",
               "notstarted": "*not started*"}


def card_head_html(name: str, kind: str, below: str = "", evidence: str = "") -> str:
    """A card's head: the title in its ink shade (>= 4.5:1), its summary on hover, and the mark (its
    meaning and, given, what the answer is evidence of on hover; project text only); ``below``: the
    swapped-note row and the what-ifs."""
    method = catalog.METHODS[name]
    hint = "; ".join(filter(None, (MARK_HINTS.get(kind, ""), evidence)))
    return (
        f'<div class="kv-card-head" style="--kv-hue:{method.color};--kv-ink:{ink(method.color)}">'
        f'<span class="kv-card-title" title="{html.escape(method.title)}: {html.escape(method.summary)}">'
        f"{html.escape(method.label)}</span>"
        f'<span class="kv-mark kv-mark-{kind}" id="kv-mark-{name}" data-verdict="{kind}" title="{html.escape(hint)}">'
        f"{html.escape(MARK_WORDS[kind])}</span></div>{below}"
    )


def time_text(timing: Timing) -> str:
    """A column's time as what it is, on which pair: "alone" (timed by itself on a warm process, as
    a preset's stored run is) or "in this shared run" (a live run's wall clock while its columns
    shared the CPU: not its own cost), with its time alone beside it where one was measured for
    this question, pair and settings."""
    total, pair = format_seconds(timing.total), short_pair(timing.pair)
    on = f" on {pair}" if pair else ""
    if timing.timed == "alone":
        return f"{total} alone{on}"
    if timing.alone is not None:
        return f"{format_seconds(timing.alone)} alone (precomputed) · {total} in this shared run{on}"
    return f"{total} in this shared run{on}"


def card_stats(column: Column, message: str | None = None) -> str:
    """The card's one line under the answer (the page's and ``/run``'s): time, first token and
    bytes; while it runs, what it is doing (the message as its sharer writes it); why it does not apply."""
    if message is not None:
        return f"✎ the sharer writes: “{md(message)}”"
    if column.result is None:
        return STATE_LINES.get(column.state, "")
    if not column.applicable:
        return md(column.reason)
    parts = [time_text(column.timing)] if column.timing is not None else []
    if column.result.first_token_seconds is not None:
        parts.append(f"first token {format_seconds(float(column.result.first_token_seconds))}")
    parts.append("nothing sent" if column.bytes == 0 else f"{human_bytes(column.bytes)} sent")
    return " · ".join(parts)


def stats_markdown(column: Column) -> str:
    """The longer block in "What each model saw": times, bytes, tokens, the method's own facts, and
    what the answer is evidence of; or why it does not apply."""
    result = column.result
    if result is None:
        return {"running": "*running ...*", "waiting": "*waiting for its turn*"}.get(column.state, "*not run yet*")
    if not result.applicable:
        return f"**Not applicable:** {md(result.reason)}"
    parts = [f"**{time_text(column.timing)}**"] if column.timing is not None else []
    if result.first_token_seconds is not None:
        parts.append(f"first token {format_seconds(float(result.first_token_seconds))}")
    receiver_side = result.receiver_first_token_seconds
    if receiver_side is not None and receiver_side != result.first_token_seconds:
        parts.append(f"receiver side {format_seconds(float(receiver_side))}")
    kind = result.communication or "none"
    sent = "nothing sent" if column.bytes == 0 else f"**{human_bytes(column.bytes)}** sent as {md(kind)}"
    lines = [" · ".join(parts), sent + f" · {int((result.tokens or {}).get('generated', 0))} tokens answered"]
    lines += [md(note) for note in notes_of(result)]
    if column.evidence:
        lines.append(md(column.evidence_sentence()))
    if result.precomputed:
        lines.append('<span class="kv-badge">precomputed</span>')
    return "\n\n".join(lines)


# the same, when what was swapped is the sharer (one that learned the opposite facts), not the note
SHARER_SWAP_MEANINGS = {
    "followed": "followed the sharer that learned the opposite: what it answers came from the sharer",
    "kept": "kept its answer with the sharer that learned the opposite: it did not come from the sharer",
    "neither": "gave neither answer with the sharer that learned the opposite: no sign it read the sharer",
}


def swap_meaning(column: Column) -> str:
    """What the column did with the swapped note (or sharer) and what that says ("KVComm followed
    the swap: what it answers is the note's content"); "" when no swap ran for it."""
    meaning = (SHARER_SWAP_MEANINGS if column.swap.pair else SWAP_MEANINGS).get(column.swap.outcome)
    return f"{column.label} {meaning}" if meaning else ""


def swap_row_html(column: Column) -> str:
    """Under a card's title, once the swapped note ran: the outcome's mark (``data-swap`` for tests
    and CSS; what it means on hover) and the answer on the swapped note (escaped: model text)."""
    outcome = column.swap.outcome
    answer = column.swap.answer if column.swap.applicable else "(does not apply)"
    where = "with the sharer that learned the opposite" if column.swap.pair else "on the swapped note"
    hint = swap_meaning(column) or "the swap did not run for this column"
    return (f'<div class="kv-swap-row"><span class="kv-swap kv-swap-{outcome}" id="kv-swap-{column.name}" '
            f'data-swap="{outcome}" title="{html.escape(hint)}">{html.escape(SWAP_WORDS[outcome])}</span>'
            f'<span class="kv-swap-answer" title="its answer {where}">{where}: '
            f"“{html.escape(answer)}”</span></div>")


def _share(probability: float | None) -> str:
    """A probability as a share a learner reads ("62%", "0.6%", "<0.1%"); "?" where none was recorded."""
    if probability is None:
        return "?"
    if probability >= 0.1:
        return f"{probability:.0%}"
    return f"{probability:.1%}" if probability >= 0.001 else "<0.1%"


def contradiction_meaning(column: Column) -> str:
    """Which answer the column gave on the contradicted note and what that says, with what giving the
    inserted value is evidence of by its control; "" when none ran for it."""
    found = column.contradicted
    meaning = CONTRADICTION_MEANINGS.get(found.outcome)
    if not meaning:
        return ""
    said = f"{column.label} {meaning}"
    return f"{said} ({COUNTER_EVIDENCE[found.evidence]})" if found.evidence in COUNTER_EVIDENCE else said


def odds_text(found: Contradicted, gold: str, counter: str) -> str:
    """P(gold) and P(counter) on the first content answer token, with the contradiction inserted and,
    where recorded, on the plain note before it ("first token: 4471 69% → 47% · 3902 25%"); escaped
    (answers may be user text)."""
    if found.p_gold is None:
        return "no logit lens recorded"
    if found.same_first_token:
        return html.escape(f"both answers begin with “{found.gold_token.strip()}”: the first token cannot tell them apart")
    shares = []
    for answer, clean, now in ((gold, found.p_gold_clean, found.p_gold), (counter, found.p_counter_clean, found.p_counter)):
        shares.append(f"{answer} {_share(clean)} → {_share(now)}" if clean is not None else f"{answer} {_share(now)}")
    return html.escape("first token: " + " · ".join(shares))


def contradiction_row_html(column: Column, gold: str, counter: str) -> str:
    """Under a card's title, once the contradicted note ran: which answer it gave (``data-contradicted``
    for tests and CSS; what it means on hover), its answer there, and P(gold) vs P(counter) on the
    answer's first content token (``gold``, ``counter``: the answers they are named by)."""
    found = column.contradicted
    answer = found.answer.strip() if found.applicable else "(does not apply)"
    shown = answer if len(answer) <= ROW_ANSWER_CHARACTERS else answer[: ROW_ANSWER_CHARACTERS - 1] + "…"
    hint = contradiction_meaning(column) or "the contradicted note was not judged for this column"
    first = (f"the receiver's probability of each answer's first token (“{found.gold_token.strip()}”, "
             f"“{found.counter_token.strip()}”) where it chooses its answer's first token: on the plain note → with the "
             "contradiction inserted (low where its answer begins with other words, “The code is …”)")
    return (f'<div class="kv-contra-row"><span class="kv-contra kv-contra-{found.outcome}" id="kv-contra-{column.name}" '
            f'data-contradicted="{found.outcome}" title="{html.escape(hint)}">'
            f"{html.escape(CONTRADICTION_WORDS[found.outcome])}</span>"
            f'<span class="kv-swap-answer" title="its answer with the contradicting sentence: {html.escape(answer)}">'
            f"with the contradiction: “{html.escape(shown)}”</span>"
            f'<span class="kv-contra-odds" title="{html.escape(first)}">{odds_text(found, gold, counter)}</span></div>')


def what_if_label(label: str) -> str:
    """A stored run's short name on a card: its label's parenthesis ("7 of 18 layers" -> "7 layers"),
    else the label after "at" ("ratio 0.35"), else the label."""
    if "(" in label and label.endswith(")"):
        return re.sub(r"^(\d+) of \d+ layers$", r"\1 layers", label[label.index("(") + 1:-1])
    return label.split(" at ", 1)[-1]


def what_if_html(column: Column) -> str:
    """Under a card's answer: its answers in the preset's stored runs at other settings, each with
    its mark, painted from the stored runs without a model. Model text is escaped."""
    if not column.what_ifs:
        return ""
    items = []
    for run in column.what_ifs:
        answer = run.answer if len(run.answer) <= 40 else run.answer[:39] + "…"
        items.append(f'<span class="kv-whatif-item" data-verdict="{run.mark}" title="{html.escape(run.label)}: stored run, '
                     f'no model needed">{html.escape(what_if_label(run.label))}: {html.escape(answer)} '
                     f'<span class="kv-mark-{run.mark} kv-whatif-mark">{html.escape(MARK_WORDS[run.mark].split()[0])}'
                     "</span></span>")
    return f'<div class="kv-whatif" id="kv-whatif-{column.name}"><span class="kv-whatif-lead">what if</span> {" · ".join(items)}</div>'


def card(column: Column, partial: str | None = None, swapped: bool = False, message: str | None = None,
         contradicted: tuple[str, str] | None = None) -> dict:
    """Every role of one column's card (and its "What each model saw" section): ``head:NAME``,
    ``answer:NAME``, ``stats:NAME``, ``notes:NAME``, ``seen:NAME``. ``partial``: its answer so far;
    ``swapped``: the swapped note's row shows under the title (where the column applies); ``message``:
    what its sharer writes; ``contradicted``: (gold, counter) answers, when the contradicted note's row shows."""
    name, finished = column.name, column.result is not None
    # a column that does not apply has no swap to show either (its card already says why)
    below = swap_row_html(column) if swapped and finished and column.applicable else ""
    below += contradiction_row_html(column, *contradicted) if contradicted and finished and column.contradicted.ran else ""
    below += what_if_html(column) if finished else ""
    answer = partial if partial is not None else ("(not applicable)" if finished and not column.applicable else column.answer)
    return {
        f"head:{name}": card_head_html(name, column.mark, below, column.evidence_sentence()),
        f"answer:{name}": answer,
        f"stats:{name}": card_stats(column, message),
        f"notes:{name}": stats_markdown(column) if finished or column.state in ("running", "waiting") else "",
        f"seen:{name}": seen_text(column.result),
    }
