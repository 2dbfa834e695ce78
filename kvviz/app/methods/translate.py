"""The KV translation on the page: which receiver layers took the translated context and how much
weight each translated token got (the gates figure, for the translation and its control), and the
held-out numbers measured for the shipped translator under the answer."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvviz.app.methods.diagram import Flow
from kvviz.app.methods.registry import MethodPage, as_result, not_run
from kvviz.core.plotkit import SELECTED_OUTLINE, layout
from kvviz.handoffs.common import CONTROL_NOTE, content_free_note
from kvviz.handoffs.translate.locate import CONTROL, NAME

OPEN_COLOR, CLOSED_COLOR = "#AA4499", "#d9d9d9"


FIGURE_HEIGHT = 420


def gates_figure(result) -> go.Figure:
    """Per receiver layer: whether it took the translated context (gate 1) and the mean weight of
    the translated tokens (the share of attention they may receive); a heatmap of the weight per
    translated token below."""

    title = "C2C translation: which receiver layers took the translated context"
    result = as_result(result)
    missing = not_run(title, result, FIGURE_HEIGHT, "Run a preset with a private context.", "C2C translation")
    if missing is not None:
        return missing
    records = sorted(result.layers, key=lambda r: r["layer"])
    layers = [r["layer"] for r in records]
    tokens = (result.details or {}).get("translated_tokens") or []
    fig = make_subplots(rows=2, cols=1, shared_xaxes=False, vertical_spacing=0.18, row_heights=[0.45, 0.55],
                        subplot_titles=("gate per layer (1 open: the layer attends to the translated context) and "
                                        "the translated tokens' mean weight", "weight per translated token and layer"))
    opened = [bool(r["open"]) for r in records]
    fig.add_trace(go.Bar(
        x=layers, y=[1.0 if o else 0.04 for o in opened], name="gate",
        marker=dict(color=[OPEN_COLOR if o else CLOSED_COLOR for o in opened],
                    line=dict(color=[SELECTED_OUTLINE if o else "#999999" for o in opened], width=1)),
        hovertext=[f"receiver layer {r['layer']}: gate {'open' if r['open'] else 'closed'} (logit {r['gate_logit']:+.2f})"
                   + (f"<br>mean weight of the translated tokens {r['weight_mean']:.3f}" if r["weight_mean"] is not None else "")
                   for r in records],
        hoverinfo="text", meta={"series": "gate", "applied": [int(o) for o in opened]}), row=1, col=1)
    fig.add_trace(go.Scatter(
        x=layers, y=[r["weight_mean"] for r in records], mode="markers", name="mean token weight",
        marker=dict(color="#000000", symbol="diamond", size=8), meta={"series": "weight_mean"}), row=1, col=1)
    z = [[(r["weights"][t] if r["weights"] else None) for r in records] for t in range(len(tokens))]
    fig.add_trace(go.Heatmap(
        z=z, x=layers, y=list(range(len(tokens))), zmin=0, zmax=1, colorscale="Purples",
        colorbar=dict(title=dict(text="weight"), len=0.5, y=0.25, thickness=12),
        text=[[repr(tok)] * len(layers) for tok in tokens],
        hovertemplate="layer %{x}, token %{text}<br>weight %{z:.3f}<extra></extra>", meta={"series": "weights"}), row=2, col=1)
    fig.update_yaxes(title_text="gate", range=[0, 1.1], tickvals=[0, 1], row=1, col=1)
    fig.update_yaxes(title_text="translated token", autorange="reversed", row=2, col=1,
                     tickvals=list(range(len(tokens))), ticktext=[t.replace("\n", "\\n") for t in tokens] if len(tokens) <= 40 else None)
    fig.update_xaxes(title_text="receiver layer", dtick=1)
    subtitle = f"{sum(opened)} of {len(layers)} layers open; {len(tokens)} translated tokens"
    if (result.details or {}).get("control"):
        subtitle += "; control: the translator read an unrelated context"
    return layout(fig, f"{title}<br><sup>{subtitle}</sup>", height=FIGURE_HEIGHT + 12 * min(len(tokens), 40),
                  margin=dict(l=90, r=20, t=70, b=50))


def notes(result) -> list[str]:
    result = as_result(result)
    details = result.details or {}
    if "open_gates" not in details:
        return []
    lines = [f"gates open: {details['open_gates']} of {details['layers']} layers; sent {result.bytes_communicated or 0:,} "
             f"bytes of the sharer's KV ({len(details.get('sharer_layers_read') or [])} of its layers), translated into "
             f"{details.get('translated_bytes', 0):,} bytes of receiver KV"]
    measured = details.get("measured") or {}
    gain = measured.get("communication_gain")
    if gain:
        low, high = gain["ci95"]
        lines.append(f"held-out communication gain ({measured.get('set', '?')}, n = {gain.get('n', '?')}): {gain['value']:+.3f} "
                     f"nats/token, 95% CI [{low:+.3f}, {high:+.3f}] (NLL with another record's context minus with the right one)")
    lines += carried(measured)
    return lines


SET_LABELS = {"recall": "recall (a name, number or code the note states)",
              "countries": "Countries (a landmark's country; the note names only the landmark)",
              "whereabouts": "who is where (a person's country; the note names only a landmark)"}


def carried(measured: dict) -> list[str]:
    """What the shipped translator carries and what it does not, as eval-translator measured it on
    held-out notes: per set its answer rate beside Skyline's (the receiver reading the note) and its
    control's, and how often it follows a swapped fact beside Skyline."""
    lines = []
    for name, summary in (measured.get("sets") or {}).items():
        rows = summary.get("rows") or {}
        if not {"translator", "skyline", "control"} <= set(rows):
            continue
        count = lambda row: f"{rows[row]['contains']}/{rows[row]['n']}"  # noqa: E731
        line = (f"held-out {SET_LABELS.get(name, name)}: right {count('translator')}, "
                f"Skyline {count('skyline')}, its control {count('control')}")
        follow = (summary.get("swap") or {}).get("rows") or {}
        if {"translator", "skyline"} <= set(follow):
            line += (f"; with the fact swapped in the note it follows the swap {follow['translator']['followed']}/"
                     f"{follow['translator']['n']} (Skyline {follow['skyline']['followed']}/{follow['skyline']['n']})")
        lines.append(line)
    return lines


PAGES = (
    MethodPage(
        name=NAME,
        flow=Flow(sender="the note", crosses="its KV cache of the note, translated into the receiver's format", receiver="the translated note's KV, then the question"),
        column=27,  # beside C2C and its control; ticked from the column chips (not a default column)
        explanation=(
            "Only the sharer reads the note. A trained translator turns the sharer's memory of each of the note's "
            "tokens (its keys and values, layer by layer) into the receiver's own format, and the receiver reads "
            "its question after those translated tokens, as if it had read the note itself. The receiver never "
            "sees the note's words: what crosses is the sharer's KV cache. A gate per receiver layer says whether "
            "that layer takes the translated note at all (closed: the layer reads the question as the receiver "
            "alone does), and a weight per translated token how much attention it may get. Under the answer: "
            "what it carried on held-out notes (right answers beside Skyline's and its control's, and how often it "
            "followed a swapped fact), as eval-translator measured the shipped translator."
        ),
        figure=gates_figure,
        notes=notes,
    ),
    MethodPage(
        name=CONTROL,
        flow=Flow(sender="a note of the note's length that names nothing", crosses="its KV cache, translated", receiver="the translated KV, then the question"),
        column=28,
        explanation=(
            f"The same translator and receiver, but the sharer reads {CONTROL_NOTE} instead of the note "
            f"(for a six-word note: *{content_free_note('one two three four five six')}*). If the translation column "
            "gives the note's fact and this one does not, the "
            "fact crossed in the translated KV."
        ),
        figure=gates_figure,
        notes=notes,
    ),
)
