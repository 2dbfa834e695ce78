"""The latent relay on the page: what the sender thought at each latent step (nearest tokens) and
where the receiver's question looked (the figure), and the steps and the map under the answer."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvviz.app.methods.diagram import Flow
from kvviz.app.methods.registry import MethodPage, as_result, not_run
from kvviz.core.plotkit import layout
from kvviz.handoffs.latent_relay.handoff import COLOR, NAME
from kvviz.handoffs.latent_relay.thinking import shown

FIGURE_HEIGHT = 500


def figure(result) -> go.Figure:
    """Top, per latent step: the cosine of the latent vector with its nearest token's embedding,
    labelled with its nearest tokens. Below, per receiver layer: the attention mass its question
    puts on the latent positions and on the context."""
    title = "Latent relay: what the sender thought, and where the receiver looked"
    result = as_result(result)
    missing = not_run(title, result, FIGURE_HEIGHT, "Run a preset with a private context to see the latent "
                             "relay's steps.", "The latent relay")
    if missing is not None:
        return missing
    details = result.details or {}
    steps = details.get("steps") or []
    records = sorted(result.layers, key=lambda r: r["layer"])
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.22, row_heights=[0.5, 0.5],
                        subplot_titles=("per latent step: cosine with the nearest token's embedding (label: nearest "
                                        "tokens, not words the sender wrote)",
                                        "per receiver layer: attention of the question on the latent steps and on the context"))
    if steps:
        fig.add_trace(go.Bar(
            x=[s["step"] for s in steps], y=[s["nearest"][0]["cosine"] for s in steps], name="cosine with the nearest token",
            marker=dict(color=COLOR), text=[" / ".join(shown(n["token"]) for n in s["nearest"])
                                            for s in steps], textposition="outside",
            hovertext=[f"latent step {s['step']}: nearest tokens "
                       + ", ".join(f"{n['token']!r} ({n['cosine']:.2f})" for n in s["nearest"])
                       + f"<br>norm of h M before rescaling {s['norm_before_rescale']:.1f}"
                       + ("" if s["cosine_to_previous"] is None else f"; cosine with the previous step {s['cosine_to_previous']:.2f}")
                       for s in steps],
            hoverinfo="text", meta={"series": "nearest_cosine"},
        ), row=1, col=1)
    else:
        fig.add_annotation(text="N = 0: no latent steps (the relay is KVComm with every layer)", showarrow=False,
                           xref="x domain", yref="y domain", x=0.5, y=0.5, row=1, col=1)
    if records[0].get("attention_on_latent") is None:
        fig.add_annotation(text="no transfer: the receiver saw none of the sender's cache", showarrow=False,
                           xref="x2 domain", yref="y2 domain", x=0.5, y=0.5, row=2, col=1)
    else:
        layers = [r["layer"] for r in records]
        fig.add_trace(go.Bar(x=layers, y=[r["attention_on_latent"] for r in records], name="attention on the latent steps",
                             marker=dict(color=COLOR), meta={"series": "attention_on_latent"}), row=2, col=1)
        fig.add_trace(go.Scatter(x=layers, y=[r["attention_on_context"] for r in records], mode="lines+markers",
                                 name="attention on the context (sink excluded)", line=dict(color="#999999"),
                                 meta={"series": "attention_on_context"}), row=2, col=1)
    fig.update_xaxes(title_text="latent step", dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="receiver layer", dtick=1 if len(records) <= 40 else None, row=2, col=1)
    fig.update_yaxes(title_text="cosine", range=[0, 1.25], row=1, col=1)
    fig.update_yaxes(title_text="attention mass", rangemode="tozero", row=2, col=1)
    fig.update_annotations(font_size=11)
    return layout(fig, f"{title}<br><sup>{subtitle(details)}</sup>", height=FIGURE_HEIGHT,
                  margin=dict(l=60, r=20, t=80, b=60))


def subtitle(details: dict) -> str:
    alignment = details.get("alignment") or {}
    control = details.get("control", "off")
    text = f"{details.get('latent_steps', 0)} latent steps, {alignment.get('map', 'computed')} map"
    if alignment.get("distance_from_identity") is not None:
        text += f" ({alignment['distance_from_identity']:.1e} from a scaled identity)"
    if control != "off":
        text += f"; control: {control}"
    return text


def notes(result) -> list[str]:
    details = as_result(result).details or {}
    if "latent_steps" not in details:
        return []
    lines = [subtitle(details)]
    steps = details.get("steps") or []
    if steps:
        lines.append("nearest tokens of the latent vectors: " + " / ".join(shown(s["nearest"][0]["token"]) for s in steps))
    per_step = details.get("seconds_per_latent_step")
    if per_step is not None:
        lines.append(f"{per_step * 1000:.0f} ms per latent step")
    return lines


PAGES = (
    MethodPage(
        name=NAME,
        flow=Flow(sender="the note, then N latent steps of thought", crosses="its KV cache of the note and the steps, every layer", receiver="that KV, then the question", sender_name="Sender"),
        column=42,
        explanation=(
            "LatentMAS-style latent relay. A second copy of the receiver's model reads the private context, then "
            "\"thinks\" for N steps without writing: its last hidden state, passed through a fixed alignment map "
            "(computed once from the model's embeddings), is fed back to it as the next input. Its KV cache of the "
            "context and of these N latent steps goes in front of the receiver's question, in every layer. With "
            "N = 0 it is KVComm with every layer, so Skyline's answer. The controls ask whether the thoughts "
            "matter: no transfer (the receiver gets nothing), an identity map, or a random map with the computed "
            "map's spectrum. On models whose input and output embeddings are tied, the computed map is the "
            "identity up to scale. The figure reads each latent vector back as its nearest tokens: what it lies "
            "near, not words the sender wrote."
        ),
        figure=figure,
        notes=notes,
        walkthrough=(
            "The latent relay (wine) lets a copy of the receiver's model read the note and think a few steps "
            "without words; its whole memory of both goes in front of the question. Its plot reads each thought "
            "back as its nearest tokens and shows how much the receiver's attention lands on the thoughts."
        ),
        stage_labels={
            "sharer_prefill": "the sender (a copy of the receiver's model, not the sharer) reads the context",
            "sharer_decode": "the sender's latent steps (vectors fed back, no token written)",
            "transfer": "splice the KV of context + latent steps in memory (no network time)",
        },
    ),
)
