"""C2C on the page: the gates each receiver layer applied and the head weights (the gates figure,
for C2C and its control), the measured communication gain under the answer, and the walk-through
steps that ask whether the sharer's cache added anything."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvviz.app.methods.diagram import Flow
from kvviz.app.methods.registry import MethodPage, Prediction, as_result, not_run
from kvviz.app.reading.questions import Question
from kvviz.core.plotkit import SELECTED_OUTLINE, layout
from kvviz.handoffs.c2c.handoff import CONTROL, NAME
from kvviz.handoffs.registry import color_of


def communication_note(measured: dict | None, control: bool) -> list[str]:
    """The measured communication, in words: the gain and its interval, what it means."""
    if not measured or "gain" not in measured or not measured.get("ci95"):
        return []
    low, high = measured["ci95"]
    verdict = (
        "the interval includes 0: no measured evidence that the sharer's cache helps"
        if low <= 0 <= high
        else ("the sharer's cache helps" if low > 0 else "the right context scores worse than another's")
    )
    text = (
        f"C2C communication gain (held-out, {measured.get('examples', '?')} examples): {measured['gain']:+.3f} nats/token, "
        f"95% CI [{low:+.3f}, {high:+.3f}]; {verdict}"
    )
    rows = measured.get("heldout_nll") or {}
    if control and rows:
        shown = ", ".join(f"{name} {value:.3f}" for name, value in rows.items())
        text = f"held-out NLL (nats/token): {shown}. " + text
    return [text]


GATE_OPEN_COLOR = "#0072B2"


GATE_CLOSED_COLOR = "#d9d9d9"


FIGURE_HEIGHT = 500


CLOSED_SLIVER = 0.04  # a closed gate (applied 0) is drawn as a thin grey sliver so that its hover can be reached


def add_gate_bars(fig, records: list[dict], layers: list[int], color: str = GATE_OPEN_COLOR) -> None:
    """Row 1: the gate each layer applied in the handoff's ``color``, K solid and V hatched (a
    closed gate a grey sliver)."""
    for kind, label in (("k", "K"), ("v", "V")):
        soft = [float(record.get(f"gate_{kind}", 0.0)) for record in records]
        logits = [float(record.get(f"gate_{kind}_logit", 0.0)) for record in records]
        opened = [bool(record.get(f"gate_{kind}_open", False)) for record in records]
        sharer = [record.get("sharer_layer") for record in records]
        base = color
        hover = [
            f"receiver layer {layer} (reads sharer layer {s})<br>{label} gate applied: <b>{int(o)}</b> "
            + ("(open: the projected sharer KV is added)" if o else "(closed: the receiver keeps its own KV)")
            + f"<br>logit {lg:+.3f}, sigmoid(logit) {g:.3f} (open when the logit is above 0)"
            for layer, s, g, lg, o in zip(layers, sharer, soft, logits, opened)
        ]
        fig.add_trace(
            go.Bar(
                x=layers,
                y=[1.0 if o else CLOSED_SLIVER for o in opened],
                customdata=[[int(o), lg, g] for o, lg, g in zip(opened, logits, soft)],
                name=f"{label} gate",
                marker=dict(
                    color=[base if o else GATE_CLOSED_COLOR for o in opened],
                    line=dict(color=[SELECTED_OUTLINE if o else "#999999" for o in opened], width=1),
                    pattern=dict(shape="" if kind == "k" else "/", fgcolor="#FFFFFF", size=6),
                ),
                hovertext=hover,
                hoverinfo="text",
                showlegend=False,
                meta={"series": f"gate_{kind}", "applied": [int(o) for o in opened], "logit": logits, "sigmoid": soft},
            ),
            row=1,
            col=1,
        )


def add_head_weights(fig, records: list[dict], layers: list[int], heads: int) -> None:
    """Rows 2 and 3: head weights as KV head x layer heatmaps for K and V (mean over tokens)."""
    for row, kind in ((2, "k"), (3, "v")):
        weights = [list(map(float, record.get(f"head_weights_{kind}") or [])) for record in records]
        # z[head][layer]: one strip per KV head, sharing the gates' layer axis
        z = [[w[head] if head < len(w) else None for w in weights] for head in range(heads)]
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=layers,
                y=list(range(heads)),
                zmin=0,
                zmax=1,
                colorscale="Blues",
                showscale=row == 2,
                colorbar=dict(title=dict(text="head<br>weight"), len=0.35, y=0.2, thickness=12),
                hovertemplate="layer %{x}, KV head %{y}<br>" + kind.upper() + " weight %{z:.3f} (mean over tokens)<extra></extra>",
                name=f"head weights {kind.upper()}",
                meta={"series": f"head_weights_{kind}"},
            ),
            row=row,
            col=1,
        )
        fig.update_yaxes(title_text=f"{kind.upper()} head", dtick=1 if heads <= 8 else None, title_standoff=4, row=row, col=1)


def gates_figure(result, control: bool | None = None) -> go.Figure:
    """Top: the gate each receiver layer applied, 0 (closed) or 1 (open: the projected sharer KV is
    added), for K and V; the logit and sigmoid(logit) it came from are in the hover (at inference
    the gate is hard: open when the logit is above 0). Below, on the same layer axis: head weights
    as KV head x layer heatmaps for K and V. ``control``: the control fuser's figure (default: as
    the result says)."""
    if control is None:
        control = result is not None and as_result(result).handoff == CONTROL
    name = "C2C control" if control else "C2C"
    title = f"{name}: gates and head weights per receiver layer"
    result = as_result(result)
    missing = not_run(title, result, FIGURE_HEIGHT, f"{name} did not run.", name)
    if missing is not None:
        return missing
    records = sorted(result.layers, key=lambda record: record["layer"])
    layers = [int(record["layer"]) for record in records]
    heads = max((len(record.get("head_weights_k") or []) for record in records), default=0)
    heat_share = min(0.25, 0.13 + 0.015 * heads)
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07,
        row_heights=[1 - 2 * heat_share, heat_share, heat_share],
        subplot_titles=(
            "gate applied per layer: 1 = open (sharer KV added), 0 = closed (grey sliver); K solid, V hatched",
            "head weights for K (mean over tokens)",
            "head weights for V",
        ),
    )
    add_gate_bars(fig, records, layers, color_of(CONTROL if control else NAME))
    add_head_weights(fig, records, layers, heads)
    fig.update_xaxes(dtick=1 if len(layers) <= 40 else None)
    fig.update_xaxes(title_text="receiver layer", row=3, col=1)
    fig.update_yaxes(title_text="gate applied", range=[0, 1.05], tickvals=[0, 1], ticktext=["0 closed", "1 open"], row=1, col=1)
    fig.update_annotations(font_size=11)
    details = result.details or {}
    open_k = sum(bool(record.get("gate_k_open")) for record in records)
    open_v = sum(bool(record.get("gate_v_open")) for record in records)
    subtitle = f"{open_k} K gates and {open_v} V gates open of {len(layers)} layers"
    if details.get("fusion_seconds") is not None:
        subtitle += f"; fusion {1000 * float(details['fusion_seconds']):.0f} ms"
    if details.get("control"):
        subtitle += "; control fuser (no sharer information)"
    return layout(fig, f"{title}<br><sup>{subtitle}</sup>", height=FIGURE_HEIGHT, barmode="group", margin=dict(l=60, r=20, t=70, b=50))


def control_gates_figure(result) -> go.Figure:
    """The control fuser's gates figure (named and coloured as the control even with no result)."""
    return gates_figure(result, control=True)


def notes(result) -> list[str]:
    result = as_result(result)
    records = result.layers or []
    if not records:
        return []
    open_k = sum(bool(record.get("gate_k_open")) for record in records)
    open_v = sum(bool(record.get("gate_v_open")) for record in records)
    details = result.details or {}
    return [f"gates open: {open_k} K, {open_v} V of {len(records)} layers"] + communication_note(
        details.get("communication"), bool(details.get("control"))
    )


PAGES = (
    MethodPage(
        name=NAME,
        flow=Flow(sender="the note and the question", crosses="its KV cache at the question's tokens, projected by the fuser", receiver="the question, its cache fused layer by layer"),
        column=20,
        explanation=(
            "Cache-to-Cache. Only the sharer reads the context (the note); both models read the question. A small "
            "trained network, the fuser, reads both models' memories (KV caches) at the question's tokens, projects "
            "the sharer's into the receiver's form and adds it to the receiver's own cache, layer by layer. A gate "
            "per layer is open (1: the sharer's projected cache is added) or closed (0). Then the receiver answers "
            "alone. No words are written in between, and the note's own tokens are never fused: its facts reach "
            "the receiver only if the sharer's cache at the question's tokens carries them. The note under the "
            "answer gives the held-out communication gain measured by eval-fuser (how much worse the receiver "
            "does when the sharer read another example's note): a gain whose interval includes 0 means no "
            "measured evidence that the sharer's cache helps."
        ),
        figure=gates_figure,
        notes=notes,
        walkthrough=(
            "C2C (blue) fuses the sharer's cache into the receiver's with a small trained network that reads both "
            "caches at the question's tokens. Its plot shows, per receiver layer, the gate applied (1 open, 0 "
            "closed; the logit is in the hover). Whether the note got through is the next step's question."
        ),
    ),
    MethodPage(
        name=CONTROL,
        flow=Flow(sender="", crosses="nothing: a fuser trained without the sharer", receiver="the question, its own cache adapted"),
        column=25,
        explanation=(
            "The control fuser has C2C's architecture, data, steps and seed, but was trained with the sharer's "
            "cache replaced by zeros. It only adapts the receiver's own cache. If C2C does better than its "
            "control, that may be the sharer's knowledge or only a differently trained adapter: the "
            "communication gain under the answers (C2C with the sharer reading another example's context) "
            "tells them apart. It reads the fuser named for C2C (its control sits beside it)."
        ),
        figure=control_gates_figure,
        notes=notes,
        walkthrough=(
            "Did the sharer's cache add anything? C2C control (light blue) runs a fuser with "
            "C2C's architecture, data, steps and seed, trained with the sharer's cache replaced by zeros: it can "
            "only adapt the receiver. We loaded **{preset}**: {lesson} The held-out numbers measured by "
            "eval-fuser (NLL and the communication gain) are in *What each model saw*."
        ),
        walkthrough_preset="plants",
        walkthrough_predicts=Prediction("Predict first (both cards are hidden until you pick): on this question, is C2C right "
                                        "where its control is wrong?",
                                        Question("beats", NAME), yes="yes"),
    ),
)
