"""Every handoff's "How it works" diagram, drawn from one template: who reads what, what crosses,
and what the receiver reads (``Flow``, one per method page). A new handoff gets its diagram by
saying its flow in words. Text is dark ink on a light tint of the handoff's colour (>= 4.5:1,
``tests/unit/test_present.py``); the SVG names what it shows for screen readers.
"""

from __future__ import annotations

import html
import textwrap
from dataclasses import dataclass

from kvviz.core.plotkit import ink, tint

WIDTH, BOX, LINE = 460, 138, 15  # the SVG's width, a box's width, a text line's height
CHARS = 20  # characters a box's line holds at 12 px
TEXT = "#0f172a"
MUTED = "#334155"


@dataclass(frozen=True)
class Flow:
    """One handoff in three phrases: what its sender reads ("" for none), what crosses to the
    receiver, and what the receiver reads."""

    sender: str
    crosses: str
    receiver: str
    sender_name: str = "Sharer"  # "Sender" where it is a copy of the receiver's model


def _lines(text: str, width: int = CHARS) -> list[str]:
    return textwrap.wrap(text, width) or [""]


def _box(x: int, title: str, text: str, color: str, top: int, height: int, dashed: bool = False) -> str:
    fill, stroke = ("#ffffff", "#64748b") if dashed else (tint(color), color)
    dash = ' stroke-dasharray="5 4"' if dashed else ""
    parts = [f'<rect x="{x}" y="{top}" width="{BOX}" height="{height}" rx="9" fill="{fill}" stroke="{stroke}" '
             f'stroke-width="2"{dash}/>',
             f'<text x="{x + BOX // 2}" y="{top + 20}" text-anchor="middle" font-weight="700" fill="{TEXT}">'
             f"{html.escape(title)}</text>"]
    for index, line in enumerate(_lines(text)):
        parts.append(f'<text x="{x + BOX // 2}" y="{top + 40 + index * LINE}" text-anchor="middle" fill="{TEXT}">'
                     f"{html.escape(line)}</text>")
    return "".join(parts)


def svg(name: str, title: str, color: str, flow: Flow) -> str:
    """The diagram: sender box, an arrow labelled with what crosses, receiver box."""
    rows = max(len(_lines(flow.sender)), len(_lines(flow.receiver)), 1)
    height = 52 + rows * LINE
    crosses = _lines(flow.crosses, 24)
    top = 10 + max(0, len(crosses) - 2) * LINE
    total = top + height + 12
    middle = top + height // 2
    left, right = 10, WIDTH - BOX - 10
    marker = f"kv-arrow-{name}"
    arrow_dash = "" if flow.sender else ' stroke-dasharray="5 4"'
    described = (f"{title}: {flow.sender_name.lower()} reads {flow.sender or 'nothing'}; "
                 f"{flow.crosses} crosses; the receiver reads {flow.receiver}")
    label = "".join(f'<text x="{WIDTH // 2}" y="{middle - 10 - (len(crosses) - 1 - i) * LINE}" text-anchor="middle" '
                    f'fill="{MUTED}" font-size="12">{html.escape(line)}</text>' for i, line in enumerate(crosses))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {total}" width="{WIDTH}" height="{total}" '
        f'role="img" aria-label="{html.escape(described)}" font-family="Inter, system-ui, sans-serif" font-size="12">'
        f"<title>{html.escape(described)}</title>"
        f'<defs><marker id="{marker}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        f'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="{ink(color)}"/></marker></defs>'
        + _box(left, flow.sender_name, flow.sender or "no sender", color, top, height, dashed=not flow.sender)
        + f'<line x1="{left + BOX + 6}" y1="{middle}" x2="{right - 6}" y2="{middle}" stroke="{ink(color)}" '
          f'stroke-width="2.5"{arrow_dash} marker-end="url(#{marker})"/>'
        + label
        + _box(right, "Receiver", flow.receiver, color, top, height)
        + "</svg>"
    )
