"""AC on the page: where the activation was taken and merged, and how alike the two models' states
are at each depth (the layer figure), and the layers under the answer."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvviz.app.methods.diagram import Flow
from kvviz.app.methods.registry import MethodPage, as_result, not_run
from kvviz.core.plotkit import SELECTED_OUTLINE, layout
from kvviz.handoffs.ac.handoff import COLOR, NAME

FIGURE_HEIGHT = 440


def figure(result) -> go.Figure:
    """Top: how alike the two models' last-token states are at each depth (cosine), with where the
    vector was taken (sender layer k) and merged (receiver layer j). Below: their sizes (norms)."""
    title = "AC: where the activation was taken and merged (per layer)"
    result = as_result(result)
    missing = not_run(title, result, FIGURE_HEIGHT, "Run a preset with a private context to see AC's layers.", "AC")
    if missing is not None:
        return missing
    records = sorted(result.layers, key=lambda r: r["layer"])
    details = result.details or {}
    layers = [r["layer"] for r in records]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1, row_heights=[0.6, 0.4],
                        subplot_titles=("cosine similarity of the sender's and the receiver's state entering each layer",
                                        "size (norm) of each model's state"))
    cosines = [r["cosine"] if r["cosine"] is not None else 0.0 for r in records]
    marked = [r["taken"] or r["injected"] for r in records]
    fig.add_trace(go.Bar(
        x=layers, y=cosines, name="cosine (sender vs receiver)",
        marker=dict(color=[COLOR if m else "#c7b1aa" for m in marked],
                    line=dict(color=[SELECTED_OUTLINE if m else "rgba(0,0,0,0)" for m in marked], width=1.5)),
        hovertext=[f"layer {r['layer']}: cosine {c:.3f}" + (" <b>taken from the sender</b>" if r["taken"] else "")
                   + (" <b>merged into the receiver</b>" if r["injected"] else "") for r, c in zip(records, cosines)],
        hoverinfo="text", meta={"series": "cosine"},
    ), row=1, col=1)
    for key, symbol, text in (("taken", "triangle-down", "sender layer k (vector taken)"),
                              ("injected", "star", "receiver layer j (vector merged)")):
        at = [r["layer"] for r in records if r[key]]
        fig.add_trace(go.Scatter(x=at, y=[1.08] * len(at), mode="markers", name=text,
                                 marker=dict(symbol=symbol, size=12, color=COLOR, line=dict(color=SELECTED_OUTLINE, width=1)),
                                 hoverinfo="name", meta={"series": key}), row=1, col=1)
    for key, dash, text in (("sender_norm", "dot", "sender"), ("receiver_norm", "solid", "receiver")):
        fig.add_trace(go.Scatter(x=layers, y=[r[key] for r in records], mode="lines+markers", name=f"{text} norm",
                                 line=dict(color=COLOR, dash=dash), meta={"series": key}), row=2, col=1)
    fig.update_yaxes(title_text="cosine", range=[min(0.0, min(cosines)) - 0.05, 1.15], row=1, col=1)
    fig.update_yaxes(title_text="norm", row=2, col=1)
    fig.update_xaxes(title_text="layer", dtick=1 if len(layers) <= 40 else None, row=2, col=1)
    fig.update_annotations(font_size=11)
    subtitle = f"sender layer {details.get('k')} -> receiver layer {details.get('j')}, merge: {details.get('f')}"
    return layout(fig, f"{title}<br><sup>{subtitle}</sup>", height=FIGURE_HEIGHT, margin=dict(l=60, r=20, t=80, b=60))


def notes(result) -> list[str]:
    details = as_result(result).details or {}
    if "k" not in details:
        return []
    return [f"sender layer {details['k']} -> receiver layer {details['j']} ({details['f']})"]


PAGES = (
    MethodPage(
        name=NAME,
        flow=Flow(sender="the note", crosses="one hidden-state vector (its last token entering layer k)", receiver="the question, that vector merged in at layer j", sender_name="Sender"),
        column=45,
        explanation=(
            "Activation Communication. The sender reads the private context; the state of its residual stream "
            "entering layer k, at the last context token, is the whole message: one vector of numbers. The "
            "receiver reads only the question, and while it does, that vector is merged into its own state "
            "entering layer j at the last token (replaced, added, or averaged). Then the receiver answers. "
            "Tiny to send, no writing, but everything the sender knows has to fit into one vector, and the "
            "two models must share a hidden size."
        ),
        figure=figure,
        notes=notes,
        walkthrough=(
            "AC (brown) sends a single vector: the sender's internal state at one layer, at the last word of the "
            "context. The plot shows where it was taken and where it was merged into the receiver."
        ),
    ),
)
