"""KV steering on the page: the edit per layer beside the cached values it was added to, and the
first answer token with and without it (the figure), and what changed under the answer."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvviz.app.methods.diagram import Flow
from kvviz.app.methods.registry import MethodPage, as_result, not_run
from kvviz.core.plotkit import layout
from kvviz.handoffs.kv_steering.handoff import COLOR, NAME

FIGURE_HEIGHT = 500


def figure(result) -> go.Figure:
    """Top, per receiver layer: the size of the edit (value and key) beside the size of the cached
    value it was added to. Below: the first answer token's likeliest tokens with the edit and for
    the receiver alone; the subtitle gives both answers."""
    title = "KV steering: the edit per layer and what it did to the answer"
    result = as_result(result)
    missing = not_run(title, result, FIGURE_HEIGHT, "Run a preset to see KV steering's edit and its effect.",
                             "KV steering")
    if missing is not None:
        return missing
    details = result.details or {}
    records = sorted(result.layers, key=lambda r: r["layer"])
    layers = [r["layer"] for r in records]
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.22, row_heights=[0.55, 0.45],
                        subplot_titles=("per receiver layer: norm of the edit, and of the cached value it was added to",
                                        "first answer token: probability with the edit and for the receiver alone"))
    fig.add_trace(go.Bar(x=layers, y=[r["value_edit_norm"] for r in records], name="value edit ||c_v V||",
                         marker=dict(color=COLOR), meta={"series": "value_edit_norm"},
                         hovertext=[f"layer {r['layer']}: value edit {r['value_edit_norm']:.2f}, cached value "
                                    f"{r['value_norm']:.2f}" + ("" if r["steered"] else " (not steered)") for r in records],
                         hoverinfo="text"), row=1, col=1)
    if any(r["key_edit_norm"] for r in records):
        fig.add_trace(go.Bar(x=layers, y=[r["key_edit_norm"] for r in records], name="key edit ||c_k K||",
                             marker=dict(color="#C9C98A"), meta={"series": "key_edit_norm"}), row=1, col=1)
    fig.add_trace(go.Scatter(x=layers, y=[r["value_norm"] for r in records], mode="lines+markers",
                             name="cached value at that position (before the edit)", line=dict(color="#999999"),
                             meta={"series": "value_norm"}), row=1, col=1)
    steered_top, alone_top = details.get("first_token_top") or [], details.get("first_token_top_alone") or []
    tokens = list(dict.fromkeys([t["token"] for t in steered_top] + [t["token"] for t in alone_top]))
    for name, top, color, series in (("with the edit", steered_top, COLOR, "first_token_steered"),
                                     ("receiver alone", alone_top, "#7f7f7f", "first_token_alone")):
        shown = {t["token"]: t["probability"] for t in top}
        fig.add_trace(go.Bar(x=[repr(t) for t in tokens], y=[shown.get(t) for t in tokens], name=name,
                             marker=dict(color=color), meta={"series": series}), row=2, col=1)
    fig.update_xaxes(title_text="receiver layer", dtick=1 if len(layers) <= 40 else None, row=1, col=1)
    fig.update_yaxes(title_text="norm", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="probability", range=[0, 1.05], row=2, col=1)
    fig.update_annotations(font_size=11)
    return layout(fig, f"{title}<br><sup>{subtitle(result)}</sup>", height=FIGURE_HEIGHT, barmode="group",
                  margin=dict(l=60, r=20, t=80, b=60))


def subtitle(result) -> str:
    details = result.details or {}
    change = "changed" if details.get("answer_changed") else "unchanged"
    return (f"pairs {details.get('pairs')}, c_v {details.get('c_values')}, c_k {details.get('c_keys')}; answer {change}: "
            f"{result.answer!r} (receiver alone {details.get('receiver_alone_answer', '')!r})")


def notes(result) -> list[str]:
    details = as_result(result).details or {}
    if "answer_changed" not in details:
        return []
    layers = details.get("steered_layers") or []
    where = f"layers {layers[0]}-{layers[-1]}" if layers else "no layer"
    return [f"steered {where} with the {details['pairs']} pairs (c_v {details['c_values']}, c_k {details['c_keys']}); "
            "no sharer, nothing sent",
            f"receiver alone: {details['receiver_alone_answer']!r} ({'changed' if details['answer_changed'] else 'unchanged'}; "
            f"first-token KL {details['first_token_kl']:.3f} nats)"]


PAGES = (
    MethodPage(
        name=NAME,
        flow=Flow(sender="", crosses="no sharer: one edit of its own cache from contrastive pairs", receiver="the question, its cache edited once"),
        column=48,
        explanation=(
            "KV-cache steering. Nothing comes from another model. From pairs of example prompts that differ only in "
            "how earlier questions were answered (briefly or at length; from the context or from memory), kvviz takes "
            "the average difference of the receiver's cached keys and values at one token, per layer. The receiver "
            "reads the question alone; once, just before its prompt's last token, those differences (times c_k and "
            "c_v) are added to its cache, and it answers. Beside the handoffs it asks: is a change in the answer "
            "communication, or only an edit of the cache? The plot shows the edit's size per layer and how the first "
            "answer token moved against the receiver alone."
        ),
        figure=figure,
        notes=notes,
        walkthrough=(
            "KV steering (olive) uses no sharer: it edits the receiver's own cache once, with vectors from example "
            "pairs. If its answer changes, that change came from an edit, not from anything the sharer knew."
        ),
        stage_labels={"receiver_prefill": "the receiver reads its question; its cache is edited once (no sharer)"},
    ),
)
