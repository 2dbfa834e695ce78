"""CIPHER on the page: how sure the sharer was at each message vector and how the receiver's layers
attend to the message (the figure), and the message under the answer."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvviz.app.methods.diagram import Flow
from kvviz.app.methods.registry import MethodPage, as_result
from kvviz.core.plotkit import empty_figure, layout
from kvviz.handoffs.cipher.handoff import COLOR, NAME

FIGURE_HEIGHT = 480


def figure(result) -> go.Figure:
    """Top, per message vector: how sure the sharer was (the likeliest token's probability),
    labelled with the vector's nearest-token reading. Below, per receiver layer: the attention
    mass its question tokens put on the message."""
    title = "CIPHER: the message vectors and how the receiver reads them"
    if result is None:
        return empty_figure(title, "Run a pair that shares an embedding space to see CIPHER's message.", FIGURE_HEIGHT)
    result = as_result(result)
    steps = (result.details or {}).get("steps") or []
    if not result.applicable or not steps:
        return empty_figure(title, "CIPHER did not run: " + (result.reason or "the message is empty."), FIGURE_HEIGHT)
    records = sorted(result.layers or [], key=lambda r: r["layer"])
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.2, row_heights=[0.55, 0.45],
                        subplot_titles=("per message vector: probability of the likeliest token (label: nearest token)",
                                        "per receiver layer: attention on the message"))
    x = [s["step"] for s in steps]
    fig.add_trace(go.Bar(
        x=x, y=[s["top_probability"] for s in steps], name="probability of the likeliest token",
        marker=dict(color=COLOR), text=[s["nearest"] for s in steps], textposition="outside",
        hovertext=[f"vector {s['step']}: nearest token {s['nearest']!r} (cosine {s['cosine_nearest']:.2f}), likeliest "
                   f"{s['likeliest']!r} p={s['top_probability']:.2f}, entropy {s['entropy']:.2f} nats" for s in steps],
        hoverinfo="text", meta={"series": "top_probability"},
    ), row=1, col=1)
    fig.add_trace(go.Scatter(
        x=[r["layer"] for r in records], y=[r["attention_on_message"] for r in records], mode="lines+markers",
        name="attention on the message", line=dict(color=COLOR), meta={"series": "attention_on_message"},
    ), row=2, col=1)
    fig.update_xaxes(title_text="message vector", dtick=1 if len(x) <= 40 else None, row=1, col=1)
    fig.update_xaxes(title_text="receiver layer", dtick=1 if len(records) <= 40 else None, row=2, col=1)
    fig.update_yaxes(title_text="probability", range=[0, 1.25], row=1, col=1)
    fig.update_yaxes(title_text="attention mass", rangemode="tozero", row=2, col=1)
    fig.update_annotations(font_size=11)
    subtitle = f"{len(steps)} vectors at temperature {result.details.get('temperature')}; 1.0 = one token, lower = a blend"
    return layout(fig, f"{title}<br><sup>{subtitle}</sup>", height=FIGURE_HEIGHT, margin=dict(l=60, r=20, t=80, b=60))


def notes(result) -> list[str]:
    details = as_result(result).details or {}
    if "steps" not in details:
        return []
    mean = details.get("mean_top_probability")
    sure = "" if mean is None else f", likeliest token's mean probability {mean:.2f}"
    return [f"message: {len(details['steps'])} vectors{sure}"]


PAGES = (
    MethodPage(
        name=NAME,
        flow=Flow(sender="the note and the question", crosses="a message of blended token embeddings, one vector a step", receiver="the vectors where the words would be, then the question"),
        column=15,
        explanation=(
            "CIPHER. The sharer writes a message as the text handoff does, but never picks a word: at each step it "
            "sends the average of all token embeddings weighted by how likely each token is, and feeds that blend "
            "back to itself. The receiver reads these vectors where it would read the message's words, so nothing "
            "the sharer was unsure about is thrown away. Only models that embed tokens the same way can talk so. "
            "*What each model saw* reads each vector back as its nearest token."
        ),
        figure=figure,
        notes=notes,
        walkthrough=(
            "CIPHER (indigo) writes like the text handoff but sends, for each word, a blend of all word "
            "embeddings weighted by their probability. Its plot shows how sure the sharer was at each step."
        ),
    ),
)
