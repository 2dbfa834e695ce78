"""The text handoff on the page: the message under the answer, and its walk-through step (the
receiver waits for the whole message)."""

from __future__ import annotations

from kvviz.app.methods.diagram import Flow
from kvviz.app.methods.registry import MethodPage, as_result
from kvviz.handoffs.text import NAME


def notes(result) -> list[str]:
    result = as_result(result)
    message = (result.seen or {}).get("message", "")
    shown = message if len(message) <= 60 else message[:57] + "..."
    return [f"message: {int((result.tokens or {}).get('message', 0))} tokens, {shown!r}"]


PAGES = (
    MethodPage(
        name=NAME,
        flow=Flow(sender="the note and the question", crosses="a short message it writes in words", receiver="the message, then the question"),
        column=10,
        explanation=(
            "The sharer reads what it knows and writes a short message in words. The receiver reads that "
            "message in front of the question. Easy to understand and tiny to send, but slow: the sharer has "
            "to write its whole message token by token before the receiver can start, and whatever the sharer "
            "leaves out is lost."
        ),
        notes=notes,
        walkthrough=(
            "The sharer writes the facts down in words and the receiver reads them (orange). In a live run its "
            "column shows the message while the sharer writes it; the receiver starts only when it is done. "
            "**Latency by stage** shows the stages of its bar: its first answer token always waits for the whole "
            "message (the *first token* time in its column)."
        ),
        walkthrough_shows="cost",
    ),
)
