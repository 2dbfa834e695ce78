"""Two runs side by side: the page's last runs in the session, and any two of their
columns as a diff: the answers token by token, what each answer token read, and per layer the
attention on the sent tokens and the logit lens. No Gradio.

A side is ``"N:handoff"``: column ``handoff`` of run number N of the session's history. "C2C minus
its control" is two columns of one run; "KVComm r = 0.3 minus r = 0.5" one column of two runs;
``"N:handoff:swapped"`` is that column's answer on the swapped note (*Swap the fact*), so "KVComm
on the note minus KVComm on the swapped note" shows, token by token, what the swap changed.
"""

from __future__ import annotations

import dataclasses
import difflib
import html
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvviz.app.reading import catalog
from kvviz.app.reading.reading import Column, Reading
from kvviz.app.tokenview import change_row_html, chip_text
from kvviz.core.plotkit import layout, wrap
from kvviz.core.results import HandoffResult

HISTORY_SIZE = 6  # runs kept per session (the oldest goes first)
HISTORY_SECONDS = 3600  # a session's history is dropped this long after it last changed
TOP_SENT = 8  # sent tokens listed per side when the two read different ones
A_COLOR, B_COLOR = "#0072B2", "#D55E00"


# --- the history -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One side of a comparison: its run in the history, the column's result and, for its answer on
    the swapped note, what the swap changed ("" for the note's own run)."""

    entry: dict
    result: HandoffResult
    swapped: str = ""


def slim(reading: Reading) -> Reading:
    """A run as the history keeps it: the attention arrays the diff does not read (the rest of each
    row's mass) dropped."""
    columns = {}
    for name, column in reading.columns.items():
        data = column.result.token_attention if column.result is not None else {}
        if data and data.get("other"):
            column = dataclasses.replace(column, result=dataclasses.replace(column.result,
                                                                            token_attention={**data, "other": []}))
        columns[name] = column
    return dataclasses.replace(reading, columns=columns)


def remember(history: list[dict] | None, reading: Reading | None) -> list[dict]:
    """The history with ``reading`` added as the newest run (unless it is already there, or holds no
    result); at most ``HISTORY_SIZE`` runs. A run's results with what a tab recorded when it opened
    (``recorded_from``: the run's stamp, ``kvviz.app.page.recording``) take the run's place, number and all."""
    history = list(history or [])
    if reading is None or not reading.finished():
        return history
    if reading.stamp and any(entry["reading"].stamp == reading.stamp for entry in history):
        return history
    source = reading.payload.get("recorded_from")
    for index, entry in enumerate(history):
        if source and entry["reading"].stamp == source:
            history[index] = {**entry, "reading": slim(reading)}
            return history
    number = (history[-1]["number"] + 1) if history else 1
    history.append({"number": number, "reading": slim(reading)})
    return history[-HISTORY_SIZE:]


def run_label(entry: dict) -> str:
    reading = entry["reading"]
    kind = "preset " + reading.preset if reading.precomputed and reading.preset else "live"
    short = reading.query if len(reading.query) <= 40 else reading.query[:39] + "…"
    return f"run {entry['number']} ({kind}): {short}"


def entries(history: list[dict]) -> dict[int, dict]:
    return {entry["number"]: entry for entry in history or []}


SWAPPED = ":swapped"  # a side's suffix: the column's answer on the swapped note


def swapped_result(column: Column) -> HandoffResult | None:
    """A column's answer on the swapped note as a result of its own (its answer and tokens; what it
    read is recorded on the note's run only), or None where no swapped note ran."""
    swap = column.swap
    if column.result is None or not swap.changed or not swap.applicable:
        return None
    tokens = list(swap.answer_tokens)
    return HandoffResult(handoff=column.name, pair=column.result.pair, answer=swap.answer, answer_ids=list(swap.answer_ids),
                         token_attention={"answer_tokens": tokens} if tokens else {})


def side_of(history: list[dict], key: str | None) -> Side | None:
    """The side ``"N:handoff"`` (or ``"N:handoff:swapped"``) names, or None when it is not in the history."""
    if key and key.endswith(SWAPPED):
        side = side_of(history, key[: -len(SWAPPED)])
        column = side.entry["reading"].column(side.result.handoff) if side is not None else None
        swapped = swapped_result(column) if column is not None else None
        return Side(side.entry, swapped, column.swap.changed or "the swapped note") if swapped is not None else None
    if not key or ":" not in key:
        return None
    number, name = key.split(":", 1)
    entry = entries(history).get(int(number)) if number.isdigit() else None
    result = entry["reading"].result(name) if entry is not None else None
    return Side(entry, result) if result is not None else None


def choices(history: list[dict]) -> list[tuple[str, str]]:
    """Every column of every kept run that has an answer, newest run first: (label, key)."""
    out = []
    for entry in reversed(history or []):
        for column in entry["reading"].finished():
            if not column.applicable:
                continue
            label = f"{run_label(entry)} · {catalog.label_of(column.name)}"
            out.append((label, f"{entry['number']}:{column.name}"))
            if swapped_result(column) is not None:
                out.append((f"{label} on the swapped note", f"{entry['number']}:{column.name}{SWAPPED}"))
    return out


def swapped_side(history: list[dict], key: str | None) -> str | None:
    """The side holding ``key``'s column on the swapped note, if the swap ran for it."""
    if not key or key.endswith(SWAPPED):
        return None
    other = key + SWAPPED
    return other if side_of(history, other) is not None else None


def control_side(history: list[dict], key: str | None) -> str | None:
    """The side holding ``key``'s control (its method's ``control``) in the same run, if it ran."""
    side = side_of(history, key)
    control = catalog.control_of(side.result.handoff) if side is not None and not side.swapped else ""
    other = f"{side.entry['number']}:{control}" if control else None
    return other if other and side_of(history, other) is not None else None


def previous_side(history: list[dict], key: str | None) -> str | None:
    """The same column in the newest kept run before ``key``'s, if it ran there."""
    side = side_of(history, key)
    if side is None:
        return None
    for earlier in reversed([e for e in history if e["number"] < side.entry["number"]]):
        other = f"{earlier['number']}:{side.result.handoff}"
        if side_of(history, other) is not None:
            return other
    return None


def default_sides(history: list[dict]) -> tuple[str | None, str | None]:
    """What the comparison shows after a run: in the newest run, the first column beside its
    control, a column with a control of its own first (C2C minus its control fuser, before text
    minus the receiver alone); else its first column against the same in the run before."""
    if not history:
        return None, None
    newest = history[-1]
    names = [column.name for column in newest["reading"].finished() if column.applicable]
    own_control = [name for name in names if catalog.control_of(name) not in ("", "receiver")]
    for name in own_control + [name for name in names if name not in own_control]:
        key = f"{newest['number']}:{name}"
        if control_side(history, key):
            return key, control_side(history, key)
    first = f"{newest['number']}:{names[0]}" if names else None
    return first, previous_side(history, first)


# --- the diff ----------------------------------------------------------------------------------------


def answer_tokens(result: HandoffResult) -> list[str]:
    """The answer as tokens where the run recorded them, else as words."""
    data = result.token_attention or {}
    if data.get("answer_tokens"):
        return list(data["answer_tokens"])
    change = result.token_change or {}
    if change.get("tokens"):
        return list(change["tokens"])
    return str(result.answer or "").split()


def token_diff_html(a: list[str], b: list[str]) -> tuple[str, str]:
    """The two answers' tokens, with what differs marked (A's in vermillion, B's in blue)."""
    left, right = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        same = op == "equal"
        left += [f'<span class="kv-cmp-tok{"" if same else " kv-cmp-a"}">{chip_text(t)}</span>' for t in a[i1:i2]]
        right += [f'<span class="kv-cmp-tok{"" if same else " kv-cmp-b"}">{chip_text(t)}</span>' for t in b[j1:j2]]
    return "".join(left), "".join(right)


def sent_mass(result: HandoffResult, skip_sink: bool = True) -> tuple[list[str], list[float]]:
    """(sent tokens, each one's attention summed over every layer and head, averaged over the
    answer tokens that were captured): what the answer read, as one number per sent token. The
    first sent token (the attention sink) is left out when ``skip_sink``."""
    data = result.token_attention or {}
    rows = data.get("attention") or []
    tokens = list(data.get("sent_tokens") or [])
    if not rows or not tokens:
        return [], []
    sums = [0.0] * len(tokens)
    for token_rows in rows:
        for layer_rows in token_rows:
            for head_row in layer_rows:
                for s, value in enumerate(head_row):
                    sums[s] += value
    means = [value / len(rows) for value in sums]
    start = 1 if skip_sink and len(tokens) > 1 else 0
    return tokens[start:], means[start:]


def layer_mass(result: HandoffResult) -> list[float]:
    """Per receiver layer: attention on every sent token but the sink, averaged over heads and
    captured answer tokens (a share of each head's row, 0 to 1)."""
    data = result.token_attention or {}
    rows = data.get("attention") or []
    if not rows:
        return []
    layers = len(rows[0])
    out = []
    for layer in range(layers):
        total, count = 0.0, 0
        for token_rows in rows:
            for head_row in token_rows[layer]:
                total += sum(head_row[1:]) if len(head_row) > 1 else sum(head_row)
                count += 1
        out.append(total / max(1, count))
    return out


def request_differences(a: dict, b: dict) -> list[str]:
    """What differs between two runs' requests, in words (the question, the context, settings, options)."""
    out = []
    for field, label in (("query", "question"), ("context", "context")):
        if (a.get(field) or "") != (b.get(field) or ""):
            out.append(f"the {label} differs")
    for field, value in (a.get("generation") or {}).items():
        other = (b.get("generation") or {}).get(field)
        if other != value:
            out.append(f"{field}: {value} vs {other}")
    options_a, options_b = a.get("options") or {}, b.get("options") or {}
    for handoff in sorted(set(options_a) | set(options_b)):
        for option in sorted(set(options_a.get(handoff) or {}) | set(options_b.get(handoff) or {})):
            value, other = (options_a.get(handoff) or {}).get(option), (options_b.get(handoff) or {}).get(option)
            if value != other:
                out.append(f"{catalog.label_of(handoff)} {option}: {value} vs {other}")
    return out


def side_title(side: Side) -> str:
    note = f" on the swapped note ({side.swapped})" if side.swapped else ""
    return f"{catalog.title_of(side.result.handoff)}{note} · {run_label(side.entry)}"


def compare_html(history: list[dict], key_a: str | None, key_b: str | None) -> str:
    """The diff of two sides as HTML: what each is, what differs in the requests, the answers token
    by token, and which sent tokens each answer read more."""
    side_a, side_b = side_of(history, key_a), side_of(history, key_b)
    if side_a is None or side_b is None:
        if not history:
            return '<div class="kv-tv-empty">No runs yet in this session: load a preset or press <b>Run live</b>.</div>'
        return '<div class="kv-tv-empty">Pick two columns (A and B) from this session\'s runs.</div>'
    a, b = side_a.result, side_b.result
    left, right = token_diff_html(answer_tokens(a), answer_tokens(b))
    same_run = side_a.entry["number"] == side_b.entry["number"]
    differences = [] if same_run else request_differences(side_a.entry["reading"].request, side_b.entry["reading"].request)
    swapped = side_a.swapped or side_b.swapped
    setting = (f"the same run, {'A' if side_a.swapped else 'B'} on the swapped note ({swapped}): the same "
               "question and settings, one fact of the note changed" if same_run and swapped else
               "two columns of the same run (the same question and settings)" if same_run else
               ("two runs; what differs: " + "; ".join(differences)) if differences else
               "two runs with the same question and settings")
    parts = [
        f'<div class="kv-cmp-what">{html.escape(setting[:1].upper() + setting[1:])}.</div>',
        '<table class="kv-cmp"><tr><th></th><th>A</th><th>B</th></tr>',
        f'<tr><th>column</th><td>{html.escape(side_title(side_a))}</td><td>{html.escape(side_title(side_b))}</td></tr>',
        f'<tr><th>answer</th><td>{left}</td><td>{right}</td></tr>',
        f'<tr><th>as text</th><td>{html.escape(a.answer or "")}</td><td>{html.escape(b.answer or "")}</td></tr>',
        "</table>",
        scored_against_html(a, b, same_run),
        sent_diff_html(a, b),
    ]
    return f'<div class="kv-cmp-view">{"".join(parts)}</div>'


def scored_against_html(a: HandoffResult, b: HandoffResult, same_run: bool) -> str:
    """Where B is A's control in A's run (or A is B's): the method's answer tokens coloured by the
    change in their log-probability against it (``token_change``, as in What crossed)."""
    if not same_run:
        return ""
    for method, control in ((a, b), (b, a)):
        change = method.token_change or {}
        if change.get("change") and change.get("control") == control.handoff:
            label = html.escape(catalog.label_of(method.handoff))
            return f'<div class="kv-cmp-what">{label}\'s answer scored against its control:</div>{change_row_html(method)}'
    return ""


def sent_diff_html(a: HandoffResult, b: HandoffResult) -> str:
    """Which sent tokens each answer read, and A minus B where both read the same tokens."""
    tokens_a, mass_a = sent_mass(a)
    tokens_b, mass_b = sent_mass(b)
    measured = ("attention summed over every layer and head, averaged over the answer tokens captured (this run's "
                "recorded rows; the first sent token, the attention sink, left out)")
    if not mass_a and not mass_b:
        return ('<div class="kv-cmp-note">Neither side recorded attention onto sent tokens (nothing was sent as '
                "tokens, or the results were computed without recording it).</div>")
    if tokens_a == tokens_b and mass_a and mass_b:
        diffs = [x - y for x, y in zip(mass_a, mass_b)]
        top = max(1e-9, *(abs(d) for d in diffs))
        chips = "".join(
            f'<span class="kv-cmp-tok" style="background:{shade(d / top)}" title="{html.escape(repr(t))}: A {x:.3f}, '
            f'B {y:.3f}, A - B {d:+.3f}">{chip_text(t)}</span>'
            for t, x, y, d in zip(tokens_a, mass_a, mass_b, diffs))
        return (f'<div class="kv-cmp-note" title="{html.escape(measured)}">Sent tokens shaded by A minus B ({measured}): '
                "blue where A's answer read the token more, vermillion where B's did.</div>"
                f'<div class="kv-tv-row">{chips}</div>')
    lines = []
    for side, tokens, mass in (("A", tokens_a, mass_a), ("B", tokens_b, mass_b)):
        if not mass:
            result = a if side == "A" else b
            why = (result.token_attention or {}).get("nothing_sent") or "no attention onto sent tokens recorded"
            lines.append(f"<li>{side}: {html.escape(str(why))}</li>")
            continue
        order = sorted(range(len(mass)), key=lambda i: -mass[i])[:TOP_SENT]
        listed = ", ".join(f"{html.escape(repr(tokens[i]))} {mass[i]:.3f}" for i in order)
        lines.append(f"<li>{side} read most: {listed}</li>")
    return (f'<div class="kv-cmp-note">The two read different sent tokens, so there is no token-by-token difference; '
            f'the ones each read most ({html.escape(measured)}):</div><ul class="kv-cmp-note">{"".join(lines)}</ul>')


def shade(weight: float) -> str:
    """Blue for A above B, vermillion for B above A (at most 0.55 of the colour)."""
    rgb = "0, 114, 178" if weight >= 0 else "213, 94, 0"
    return f"rgba({rgb}, {0.55 * min(1.0, abs(weight)):.3f})"


def compare_figure(history: list[dict], key_a: str | None, key_b: str | None) -> go.Figure:
    """Per receiver layer, for A and B: the attention on the sent tokens (top) and the logit lens of
    each first answer token (bottom), each labelled as what was measured."""
    # the subplot titles in lines that fit a 390 px phone's plot (this figure has no compact form)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.16, subplot_titles=(
        wrap("attention on the sent tokens (sink left out), mean over heads and captured answer tokens", 40),
        wrap("logit lens: probability of the side's first answer token after each layer", 40)))
    drawn = 0
    for side, key, color in (("A", key_a, A_COLOR), ("B", key_b, B_COLOR)):
        found = side_of(history, key)
        if found is None:
            continue
        result = found.result
        label = f"{side}: {catalog.label_of(result.handoff)}, run {found.entry['number']}"
        mass = layer_mass(result)
        if mass:
            fig.add_trace(go.Scatter(x=list(range(len(mass))), y=mass, mode="lines+markers", name=f"{label}, attention",
                                     line=dict(color=color), meta={"side": side, "series": "attention"},
                                     hovertemplate="layer %{x}: %{y:.3f} of each head's attention on the sent tokens "
                                                   "(this run's recorded rows)<extra>" + html.escape(label) + "</extra>"), row=1, col=1)
            drawn += 1
        lens = result.logit_lens or {}
        if lens.get("answer_probability"):
            token = lens.get("answer_token") or ""
            fig.add_trace(go.Scatter(x=lens["layers"], y=lens["answer_probability"], mode="lines+markers",
                                     name=f"{label}, logit lens P({token!r})", line=dict(color=color, dash="dot"),
                                     meta={"side": side, "series": "lens"},
                                     hovertemplate="layer %{x}: P = %{y:.4f} (logit lens, this run)<extra>"
                                                   + html.escape(label) + "</extra>"), row=2, col=1)
            drawn += 1
    title = "A and B per receiver layer" if drawn else "A and B per receiver layer: nothing recorded to draw"
    fig.update_xaxes(title_text="receiver layer", row=2, col=1)  # ticks spaced by the width
    fig.update_yaxes(title_text="attention share (0 to 1)", row=1, col=1)
    fig.update_yaxes(title_text="probability (0 to 1)", range=[0, 1.02], row=2, col=1)
    fig.update_annotations(font_size=12)
    return layout(fig, title, height=580, margin=dict(l=60, r=20, t=100, b=110))


COMPARE_CSS = """
.kv-cmp {border-collapse: collapse; font-size: 14px; width: 100%}
.kv-cmp th {text-align: left; font-weight: 600; color: #334155; padding: 4px 8px; vertical-align: top}
.kv-cmp td {padding: 4px 8px; vertical-align: top; border-top: 1px solid #e2e8f0}
.kv-cmp-tok {font-family: ui-monospace, monospace; padding: 1px 4px; border-radius: 4px; border: 1px solid #cbd5e1;
  white-space: pre; display: inline-block; margin: 1px}
.kv-cmp-a {background: rgba(213, 94, 0, 0.35)}
.kv-cmp-b {background: rgba(0, 114, 178, 0.35)}
.kv-cmp-what, .kv-cmp-note {font-size: 13px; color: #334155; margin: 6px 0}
"""
