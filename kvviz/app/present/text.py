"""Text for people, escaped: markdown cells, seconds, what each model saw, a pair's short name,
each method's own facts under its answer, and a lesson's claims in words. User text (queries, contexts, answers,
prompts) only ever goes out escaped (``md``) or into plain text boxes: it is shown as text, never run as HTML."""

from __future__ import annotations

from kvviz.app.methods import registry as methods
from kvviz.core.results import HandoffResult

SHORT_PAIR = 28  # characters of a pair's name on a card (the whole name on hover and in the status line)


def md(text) -> str:
    """Escape text for a markdown cell: HTML and the markdown characters that change layout."""
    escaped = str(text)
    for char in "\\`*_[]#|~<>&":
        escaped = escaped.replace(char, "\\" + char)
    return escaped


def format_seconds(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def short_pair(pair: str) -> str:
    """A pair's name short enough for a card ("embedded", or the start of a long SHARER+RECEIVER)."""
    return pair if len(pair) <= SHORT_PAIR else pair[:SHORT_PAIR - 1] + "…"


def notes_of(result: HandoffResult | None) -> list[str]:
    """The method's own facts about a run (layers sent, gates open, the message ...), from its page entry."""
    page = methods.page_of(result.handoff) if result is not None else None
    if page is None or page.notes is None or not result.applicable:
        return []
    return page.notes(result)


SEEN_TITLES = {
    "sharer": "What the sharer read",
    "sender": "What KVComm's sender (a copy of the receiver's model, not the sharer) read",
    "message": "The message it wrote",
    "receiver": "What the receiver read",
    "alignment": "How the sharer's tokens line up with the receiver's",
}


def seen_text(result: HandoffResult | None) -> str:
    """What each model saw, as plain text (prompt templates included)."""
    if result is None or not result.seen:
        return ""
    blocks = [f"--- {SEEN_TITLES[key]} ---\n{result.seen[key]}" for key in SEEN_TITLES if key in result.seen]
    blocks += [f"--- {key} ---\n{value}" for key, value in result.seen.items() if key not in SEEN_TITLES]
    return "\n\n".join(blocks)


# how a claim's kind reads after a column's name ("KVComm layers sent: 9 in the lesson, 6 here")
CLAIM_KIND_WORDS = {"verdict": "", "follow": " on the swap", "says": " says", "writes": " writes",
                    "layers": " layers sent", "sent": " sends layers", "evidence": " evidence",
                    "contradicted": " on the contradicted note", "gain": " gain", "beats": " beats its control",
                    "seconds": " seconds", "bytes": " bytes"}


# a claim's answer in words where the reading's own word would not read as one ("neither here")
CLAIM_ANSWER_WORDS = {
    "verdict": {"none": "no answer", "na": "not applicable", "unmarked": "not marked", "failed": "failed"},
    "follow": {"kept": "kept its answer", "neither": "gave neither answer", "none": "no result on the swap"},
    "contradicted": {"gold": "gave the original", "counter": "gave the inserted value", "both": "gave both",
                     "neither": "gave neither", "none": "not judged"},
    "evidence": {"none": "no evidence"},
}


def claim_answer(value, kind: str = "") -> str:
    """An answer to a claim's question of ``kind``, in words."""
    if value is None or value == "":
        return "no answer"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return CLAIM_ANSWER_WORDS.get(kind, {}).get(str(value)) or {"na": "not applicable"}.get(str(value), str(value))
