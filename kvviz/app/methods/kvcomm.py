"""KVComm on the page: which layers got the context and why (the layer figure), the facts under its
answer (the layers sent, the calibration sample and how it ranks this query), its walk-through step
and its sweep over ratios and strategies."""

from __future__ import annotations

import plotly.graph_objects as go

from kvviz.app.methods.diagram import Flow
from kvviz.app.methods.registry import MethodPage, Prediction, Sweep, as_result, not_run
from kvviz.app.reading.questions import Question
from kvviz.core.plotkit import SELECTED_OUTLINE, layout
from kvviz.handoffs.common import CONTROL_NOTE, content_free_note
from kvviz.handoffs.kvcomm.handoff import COLOR, CONTROL, NAME
from kvviz.handoffs.kvcomm.layers import CALIBRATION_CONTEXT, CALIBRATION_QUERY

# the layer figure's series per layer (``meta.series`` of each trace)
# KVComm's own green for what chose the layers, greys (the query's hatched) for the rest: no other
# handoff's colour appears in its figure (orange is the text handoff's)
SERIES_COLORS = {"calibration": "#009E73", "query": "#4B5563", "prior": "#bdbdbd", "score": "#004D38"}


SERIES_PATTERNS = {"query": "/"}


# the row of markers above the bars: how each layer got (or did not get) the context
SENT_MARKERS = {
    "sent": dict(symbol="triangle-down", size=11, color=COLOR),
    "forced": dict(symbol="star", size=12, color="#ffffff"),
    "sink": dict(symbol="line-ew", size=10, color="#888888"),
}


CALIBRATION_SOURCES = {
    "builtin": "the built-in sample",
    "sample": "the task's calibration sample",
    "query": "this query",
}


FIGURE_HEIGHT = 420


def _sent_reason(details: dict) -> str:
    """Why the non-forced sent layers were sent, in words, by strategy."""
    strategy = details.get("strategy")
    if strategy == "random":
        return "sent: drawn at random"
    if strategy == "explicit":
        return "sent: given by hand"
    if strategy == "contiguous":
        return "sent: best-scoring block"
    return "sent: top score"


def figure_series(result) -> list[tuple[str, str, str, str]]:
    """The bar series a KVComm result can show, as (series, record field, name, explanation);
    only what the run measured or used: the calibration importance where a calibration was used,
    this query's importance (always measured), the prior and the score only where a score mixed
    both (0 < alpha < 1), or the prior alone where it was the score (alpha = 0)."""
    result = as_result(result)
    details = result.details or {}
    records = result.layers or []
    alpha = details.get("alpha")
    calibration = details.get("calibration") or {}
    source = calibration.get("source")
    has = lambda field: any(record.get(field) is not None for record in records)  # noqa: E731
    series = []
    on_this_query = source == "query"
    if has("calibration_attention_norm") and not on_this_query:
        where = CALIBRATION_SOURCES.get(source, "the calibration sample")
        name = f"importance on {where} (chose the layers)"
        if alpha == 1:
            name += " = score"
        series.append(("calibration", "calibration_attention_norm", name,
                       f"share of the calibration question's attention on its context, min-max over layers; "
                       f"measured once on {where}"))
    if has("query_attention_norm"):
        if on_this_query:
            name = "this query's importance (chose the layers" + (", = score)" if alpha == 1 else ")")
            explain = "share of this question's attention on this context, min-max over layers; measured before answering"
        else:
            name = "this query's importance (measured after the answer; not used)"
            explain = ("share of this question's attention on this context, min-max over layers; measured after "
                       "the answer to see whether the calibration transfers")
        series.append(("query", "query_attention_norm", name, explain))
    if alpha is not None and alpha < 1 and has("prior"):
        name = "Gaussian prior" + (" = score (alpha = 0)" if alpha == 0 else f" (weight 1 - alpha = {1 - alpha:.2f})")
        series.append(("prior", "prior", name, "favours middle layers, min-max over layers"))
    if alpha is not None and 0 < alpha < 1 and has("score"):
        series.append(("score", "score", f"score = {alpha:.2f} x importance + {1 - alpha:.2f} x prior",
                       "the value the layers were ranked by"))
    return series


def add_sent_markers(fig, layers: list[int], selected: list[bool], forced: list[bool], details: dict) -> None:
    """The row of markers above the bars: how each layer got (or did not get) the context."""
    groups = {
        "sent": ([layer for layer, sel, frc in zip(layers, selected, forced) if sel and not frc],
                 f"{_sent_reason(details)} (context KV)"),
        "forced": ([layer for layer, frc in zip(layers, forced) if frc], "layer 0: always sent (forced)"),
        "sink": ([layer for layer, sel in zip(layers, selected) if not sel], "sink only (one token)"),
    }
    for key, (xs, name) in groups.items():
        if not xs:
            continue
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[1.08] * len(xs),
                mode="markers",
                name=name,
                marker=dict(**SENT_MARKERS[key], line=dict(color=SELECTED_OUTLINE if key != "sink" else "#888888", width=1)),
                hovertext=[f"layer {layer}: {name}" for layer in xs],
                hoverinfo="text",
                meta={"series": key},
            )
        )


def figure_subtitle(selected: list[bool], forced: list[bool], details: dict) -> str:
    """How many layers were sent and why, the strategy, alpha, and how the calibration ranks this query."""
    alpha = details.get("alpha")
    subtitle = f"{sum(selected)} of {len(selected)} layers sent"
    if any(forced):
        subtitle += " (layer 0 by rule)"
    if details.get("strategy"):
        subtitle += f", strategy {details['strategy']}"
    if alpha is not None:
        subtitle += f", alpha = {float(alpha):.2f}"
    spearman_value = details.get("importance_spearman")
    source = (details.get("calibration") or {}).get("source")
    if spearman_value is not None and source != "query":
        subtitle += f"; calibration vs this query: Spearman {float(spearman_value):+.2f}"
    return subtitle


def layers_figure(result) -> go.Figure:
    """Grouped bars per receiver layer, only of what this run measured or used (``figure_series``),
    and a row of markers above them: the layers sent by the strategy, layer 0 sent by rule
    (forced), and the layers that kept only the one-token sink.

    Sent layers get a dark outline and full opacity in every series; sink-only layers are faded.
    """
    title = "KVComm: which layers get the context (per receiver layer)"
    hint = "Run a preset with a private context to see KVComm's layer choice."
    result = as_result(result)
    missing = not_run(title, result, FIGURE_HEIGHT, hint, "KVComm")
    if missing is not None:
        return missing
    records = sorted(result.layers, key=lambda record: record["layer"])
    layers = [int(record["layer"]) for record in records]
    selected = [bool(record.get("selected")) for record in records]
    forced = [bool(record.get("forced")) for record in records]
    details = result.details or {}

    def status(layer_selected: bool, layer_forced: bool) -> str:
        if layer_forced:
            return "<b>layer 0: always sent (by rule, not by score)</b>"
        if layer_selected:
            return f"<b>{_sent_reason(details)}: the whole context KV</b>"
        return "sink only: this layer keeps just the context's first token"

    fig = go.Figure()
    for key, field, name, explain in figure_series(result):
        values = [None if record.get(field) is None else float(record[field]) for record in records]
        raw_field = {"calibration": "calibration_attention", "query": "query_attention"}.get(key)
        hover = []
        for record, value, sel, frc in zip(records, values, selected, forced):
            text = f"layer {record['layer']}<br>{name}: {'not measured' if value is None else f'{value:.3f}'}"
            if raw_field and record.get(raw_field) is not None:
                text += f" (raw {float(record[raw_field]):.4f})"
            hover.append(f"{text}<br>{explain}<br>{status(sel, frc)}")
        fig.add_trace(
            go.Bar(
                x=layers,
                y=values,
                name=name,
                marker=dict(
                    color=SERIES_COLORS[key],
                    pattern=dict(shape=SERIES_PATTERNS.get(key, ""), fgcolor="#FFFFFF", size=5),
                    opacity=[1.0 if sel else 0.35 for sel in selected],
                    line=dict(color=[SELECTED_OUTLINE if sel else "rgba(0,0,0,0)" for sel in selected], width=1.5),
                ),
                hovertext=hover,
                hoverinfo="text",
                meta={"series": key},
            )
        )
    add_sent_markers(fig, layers, selected, forced, details)
    subtitle = figure_subtitle(selected, forced, details)
    fig.update_xaxes(
        title_text="receiver layer", dtick=1 if len(layers) <= 40 else None, range=[min(layers) - 0.6, max(layers) + 0.6]
    )
    fig.update_yaxes(title_text="normalised value (0 to 1)", range=[0, 1.15])
    return layout(fig, f"{title}<br><sup>{subtitle}</sup>", height=FIGURE_HEIGHT, barmode="group", bargap=0.2,
                  margin=dict(l=60, r=20, t=70, b=120))


def notes(result) -> list[str]:
    """Under the answer: the layers sent (layer 0 by rule), the calibration sample in full and how
    well its importance ranks this query's."""
    details = as_result(result).details or {}
    selected = details.get("selected_layers")
    if selected is None:
        return []
    forced = set(details.get("forced_layers") or [])
    lines = ["layers sent: " + ", ".join(f"{layer} (always)" if layer in forced else str(layer) for layer in selected)]
    calibration = details.get("calibration")
    if calibration is None:
        if "calibration" in details:  # older records lack the key: say nothing about them
            lines.append(f"no attention measured to choose the layers (strategy {details.get('strategy')})")
    elif calibration.get("source") == "query":
        lines.append("calibrated on this query (its own attention chose the layers)")
    else:
        where = CALIBRATION_SOURCES.get(calibration.get("source"), "the calibration sample")
        lines.append(f"calibrated on {where}: \"{calibration.get('context')}\" / \"{calibration.get('query')}\"")
        rho = details.get("importance_spearman")
        if rho is not None:
            lines.append(f"calibration vs this query's importance: Spearman {float(rho):+.2f}")
    return lines


PAGES = (
    MethodPage(
        name=NAME,
        flow=Flow(sender="the note (a copy of the receiver's model)", crosses="its KV cache of the note, in selected layers only (a one-token sink elsewhere)", receiver="the sent KV, then the question", sender_name="Sender"),
        column=40,
        opens_token_view=True,  # its layer choice is what the token view explains best
        explanation=(
            "KVComm needs a sender with the receiver's architecture, so its sender is not the sharer: it is a "
            "second copy of the receiver's model (on the default pair, another Gemma-3-270M). The sender reads "
            "the private context and hands over its KV cache of it, but only in some receiver layers; every "
            "other layer keeps just the context's first token (an attention sink), and layer 0 is always sent. "
            "The layers are chosen by score = alpha x attention importance + (1 - alpha) x a bell-curve prior "
            "over layers (alpha = 1 by default, as in the reference code, so the prior has no weight). The "
            "attention importance is measured on a calibration sample (the built-in sentence, or this query if "
            "you choose it in Settings), not on your question unless you choose that; the top share r of layers "
            "is sent. The transfer here is a splice in memory: the bytes are counted, no network is timed. "
            f"The built-in calibration sample: *{CALIBRATION_CONTEXT}* / *{CALIBRATION_QUERY}*"
        ),
        figure=layers_figure,
        notes=notes,
        walkthrough=(
            "KVComm (green) sends no words. A second copy of the receiver's model reads the note and puts its "
            "memory of it (the *KV cache*) into some of the receiver's layers; the others keep only the note's "
            "first token, and layer 0 is always sent. The plot shows, per layer, the attention importance on the "
            "calibration sample (which chose the layers) beside the importance on *this* question; triangles mark "
            "the layers sent. We loaded **{preset}**: {lesson} In *Settings* change the ratio."
        ),
        walkthrough_preset="fuji",
        walkthrough_predicts=Prediction(
            "Predict first (KVComm's card is hidden until you pick): swap {old} for {new} in the note, so that the "
            "right answer becomes {swapped}. Will KVComm's answer follow to {swapped}?",
            Question("follow", NAME), yes="followed"),
        sweep=Sweep(
            title="Sweep: how many layers does KVComm need?",
            explanation=(
                "Runs KVComm on the built-in private-context questions at each ratio for each chosen "
                "layer-selection strategy (calibrated on the built-in sample), plus the receiver alone and "
                "Skyline as references."
            ),
            x_option="ratio",
            x_values=(0.0, 0.25, 0.5, 0.75, 1.0),
            x_label="share of receiver layers that get the context (ratio r)",
            series_option="strategy",
            series_values=("kvcomm", "prior", "contiguous", "random"),
            series_default=("kvcomm", "contiguous", "random"),
            shared_x=(0.0, 1.0),  # no layer / every layer: the same under every strategy
            count_detail="num_selected",
            count_name="layers",
        ),
        stage_labels={
            "sharer_prefill": "the sender (a copy of the receiver's model, not the sharer) reads the context",
            "transfer": "choose layers and splice the KV in memory (no network time)",
        },
    ),
    MethodPage(
        name=CONTROL,
        flow=Flow(sender="a note of the note's length that names nothing", crosses="its KV cache, in the same layers", receiver="the sent KV, then the question", sender_name="Sender"),
        column=41,
        explanation=(
            "The same KVComm (same options, so with the built-in calibration the same layers are sent), but the "
            f"sender reads {CONTROL_NOTE} instead of the private context (for a six-word note: "
            f"*{content_free_note('Mei is hiking near Mount Fuji.')}*). "
            "What KVComm answers and this does not came through the context's KV; what both answer, the splice "
            "alone (or the question) gave. Tick it beside KVComm: the What crossed tab then colours KVComm's answer "
            "tokens by how much likelier the real context made each one."
        ),
        notes=notes,
    ),
)
