"""C2C handoff: the sharer's KV cache, projected and fused into the receiver's (REFERENCE §1).

Both models read the same user message. The sharer prefills its prompt prefix plus one aligned
token per receiver message token (``kvviz.handoffs.c2c.align``); the receiver prefills its prompt except the
last token; a trained fuser (``kvviz.handoffs.c2c.fuser``) rewrites the receiver's KV at the message tokens
in every layer (``K' = K_r + g·w·K_proj``); the receiver then runs its last prompt token on the
fused cache and decodes with the shared decode loop. Generated tokens are not fused.

``c2c_control`` runs the control fuser: same architecture, data, steps and seed, trained with the
sharer's KV replaced by zeros. It is an adapter on the receiver's own cache. A gap between ``c2c``
and ``c2c_control`` may be the sharer's knowledge or only a differently trained adapter; the
communication gain (``eval-fuser``: C2C with another example's context) tells them apart.

A request's context: a fuser trained with shared input (the paper) gives it to both models; a
fuser trained with a private context (``train-fuser --context private``, the shipped one) gives
it to the sharer only, as the text and KVComm handoffs do; the fuser's config says which.

Fusers: the ``fuser`` option (a checkpoint folder, a folder in the C2C paper's published layout,
or a hub path to one) overrides the shipped ones (``kvviz.handoffs.c2c.locate``: the shipped fusers are
found by the pair's architecture fingerprint; a pair with no shipped fuser for which the paper
publishes one, ``--pair qwen``, uses that one, fetched from the hub and converted once; without
network the result says how to fetch it). The paper publishes no control fuser.

The pipeline (sharer prefill, receiver prefill, fusion) is ``kvviz.handoffs.c2c.fusion.fuse_prompt``, the
one the trainer and the evaluator run too.
"""

from __future__ import annotations

from dataclasses import asdict

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from kvviz.core import policy
from kvviz.core.plotkit import SELECTED_OUTLINE, as_dict, layout, not_run_figure
from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.handoffs.c2c.align import align_prompt, describe
from kvviz.handoffs.c2c.fuser import C2CFuser, FuserError
from kvviz.handoffs.c2c.fusion import fuse_prompt
from kvviz.handoffs.c2c.locate import communication_details, get_fuser, resolve_fuser
from kvviz.handoffs.common import TokenCallback, read_prompt
from kvviz.handoffs.registry import Handoff, Option, ReceiverPrompt, color_of, option_values
from kvviz.runtime import crossed
from kvviz.runtime.checkpoints import checkpoint_label
from kvviz.runtime.decode import generate, prefill
from kvviz.runtime.measure import StageTimer, decode_flops, forward_flops
from kvviz.runtime.models import LoadedPair

NAME = "c2c"
CONTROL = "c2c_control"

def receiver_sees_context_for(fuser: C2CFuser) -> bool:
    """The context setting the fuser was trained in (the paper's shared input when unrecorded)."""
    return bool((fuser.config.training or {}).get("receiver_sees_context", True))


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


def run(
    pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None, control: bool = False
) -> HandoffResult:
    name = CONTROL if control else NAME
    fuser, folder, reason = fuser_for(pair, request, control)
    if fuser is None:
        return HandoffResult.not_applicable(name, pair.name, reason)
    timer = StageTimer()
    receiver, sharer = pair.receiver, pair.sharer
    alignment = request_alignment(pair, request, fuser)
    with torch.no_grad():  # the frozen models and the fuser at inference: no gradients
        fused = fuse_prompt(pair, fuser, alignment, sharer="right", hard=True, timer=timer)
    # what crossed: the fused prompt, the receiver's cache of its prompt after the fuser
    fused_length = fused.state.next_position
    crossed.mark_sent("fused prompt tokens (the receiver's prompt cache after the fuser"
                      + (", the control fuser" if control else "") + ")",
                      range(fused_length), alignment.receiver_ids[:fused_length])
    with timer.stage("receiver_prefill"):
        logits, _ = prefill(receiver, fused.state, alignment.receiver_ids[-1:])
    with timer.stage("receiver_decode"):
        output = generate(receiver, fused.state, logits, request.generation, on_token=on_token, timer=timer)
    flops, before_answer = c2c_flops(pair, fuser, alignment, len(output.token_ids), control)
    return HandoffResult(
        handoff=name,
        pair=pair.name,
        answer=output.text,
        answer_ids=output.token_ids,
        seen={
            "sharer": "" if control else sharer.tokenizer.decode(alignment.sharer_ids),
            "receiver": alignment.receiver_segments.text,
            **({} if control else {"alignment": describe(alignment, receiver.tokenizer, sharer.tokenizer,
                                                          fuser.config.token_alignment)}),
        },
        timings=timer.as_dict(),
        bytes_communicated=fused.bytes_read,
        communication="none" if control else "kv",
        flops=flops,
        flops_to_first_token=before_answer,
        tokens={
            "receiver_prompt": len(alignment.receiver_ids),
            "sharer_prompt": 0 if control else len(alignment.sharer_ids),
            "fused": alignment.num_fused,
            "generated": len(output.token_ids),
        },
        layers=[asdict(record) for record in fused.records],
        first_token_seconds=timer.first_token_seconds,
        receiver_first_token_seconds=timer.receiver_first_token_seconds,
        details={**run_details(pair, fuser, folder, alignment, fused), "stopped_by": output.stopped_by},
    )


def fuser_for(pair: LoadedPair, request: HandoffRequest, control: bool) -> tuple[C2CFuser | None, object, str]:
    """(the fuser, its folder, "") or (None, None, why not)."""
    name = CONTROL if control else NAME
    folder, reason = resolve_fuser(pair, fuser_option(request), control)
    if folder is None:
        return None, None, reason
    try:
        fuser = get_fuser(folder, pair)
    except FuserError as error:
        return None, None, str(error)
    if fuser.config.control != control:
        kind = "a control" if fuser.config.control else "a real (non-control)"
        return None, None, f"The fuser at {folder} is {kind} fuser; {name} needs the other kind."
    return fuser, folder, ""


def request_alignment(pair: LoadedPair, request: HandoffRequest, fuser: C2CFuser):
    """The request's prompts aligned the way the fuser was trained (context shared or private)."""
    return align_prompt(
        pair.receiver.tokenizer, pair.sharer.tokenizer, request.query, request.context, receiver_sees_context_for(fuser),
        fuser.config.token_alignment, fuser.config.fuse_template,
    )


def fused_prompt(pair: LoadedPair, fuser: C2CFuser, alignment, sharer="right") -> ReceiverPrompt:
    """The receiver after its whole prompt on the fused cache (the state C2C decodes from), for
    likelihood scoring. ``sharer`` as in ``kvviz.handoffs.c2c.fusion.fuse_prompt`` ("right", "zero" or a
    SharerKV: eval-fuser's other-question control)."""
    with torch.no_grad():
        state = fuse_prompt(pair, fuser, alignment, sharer=sharer, hard=True).state
        return read_prompt(pair.receiver, alignment.receiver_ids[-1:], state)


def receiver_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult, control: bool = False) -> ReceiverPrompt:
    """The bench's likelihood column: the receiver's state after the fused prompt."""
    fuser, _, reason = fuser_for(pair, request, control)
    if fuser is None:
        raise FuserError(reason)
    return fused_prompt(pair, fuser, request_alignment(pair, request, fuser))


def control_receiver_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult) -> ReceiverPrompt:
    return receiver_prompt(pair, request, result, control=True)


def c2c_flops(pair, fuser: C2CFuser, alignment, generated: int, control: bool) -> tuple[dict, dict]:
    """(FLOPs per model, the same before the first answer token)."""
    receiver = pair.receiver
    prompt_length = len(alignment.receiver_ids)
    prompt = forward_flops(receiver.facts, prompt_length - 1, 0, 0) + forward_flops(receiver.facts, 1, prompt_length - 1, 1)
    before = {"receiver": prompt, "fuser": 2.0 * fuser.num_parameters * alignment.num_fused}
    if not control:
        before["sharer"] = forward_flops(pair.sharer.facts, len(alignment.sharer_ids), 0, 0)
    flops = dict(before, receiver=prompt + decode_flops(receiver.facts, generated, prompt_length))
    return flops, before


def run_details(pair, fuser: C2CFuser, folder, alignment, fused) -> dict:
    """``HandoffResult.details`` of a run (but ``stopped_by``)."""
    records, fusion_seconds = fused.records, fused.fusion_seconds
    receiver_sees_context = receiver_sees_context_for(fuser)
    sharer = pair.sharer
    return {
        "fuser_path": fuser.config.reference.get("hub") or checkpoint_label(folder),
        "fuser_source": fuser.config.source,
        "fusion_seconds": fusion_seconds,
        "parameters": fuser.num_parameters,
        "control": fuser.config.control,
        "trained": dict(fuser.config.training),
        "width": fuser.config.width,
        "layer_map": list(fuser.config.layer_map),
        "identical_tokenizers": alignment.identical_tokenizers,
        "receiver_sees_context": receiver_sees_context,
        "open_gates": {
            "k": sum(r.gate_k_open for r in records),
            "v": sum(r.gate_v_open for r in records),
            "layers": len(records),
        },
        # the gate each layer applied (0/1) beside the logit it came from, for the gate plot
        "applied_gates": {
            "k": [int(r.gate_k_open) for r in records],
            "v": [int(r.gate_v_open) for r in records],
            "k_logit": [r.gate_k_logit for r in records],
            "v_logit": [r.gate_v_logit for r in records],
        },
        "architecture": {
            "rope": fuser.config.rope,
            "fuse": fuser.config.fuse,
            "source": fuser.config.source,
            "bias": fuser.config.bias,
            "intermediate": fuser.config.inner_width,
            "token_alignment": fuser.config.token_alignment,
            "fuse_template": fuser.config.fuse_template,
        },
        # held-out communication gain measured by eval-fuser (None when not measured)
        "communication": communication_details(fuser, folder),
        "sharer_model": sharer.name,
    }


def run_control(pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None) -> HandoffResult:
    """The control fuser (no sharer information): how much of C2C's effect is adaptation."""
    return run(pair, request, on_token=on_token, control=True)


# --- descriptors ------------------------------------------------------------------------------

GATE_OPEN_COLOR = "#0072B2"
GATE_CLOSED_COLOR = "#d9d9d9"
FIGURE_HEIGHT = 500
CLOSED_SLIVER = 0.04  # a closed gate (applied 0) is drawn as a thin grey sliver so that its hover can be reached


def add_gate_bars(fig, records: list[dict], layers: list[int], color: str = GATE_OPEN_COLOR) -> None:
    """Row 1: the gate each layer applied in the handoff's ``color``, K solid and V hatched (a
    closed gate a grey sliver)."""
    for kind, label in (("k", "K"), ("v", "V")):
        soft = [float(r.get(f"gate_{kind}", 0.0)) for r in records]
        logits = [float(r.get(f"gate_{kind}_logit", 0.0)) for r in records]
        opened = [bool(r.get(f"gate_{kind}_open", False)) for r in records]
        sharer = [r.get("sharer_layer") for r in records]
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
        weights = [list(map(float, r.get(f"head_weights_{kind}") or [])) for r in records]
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
        control = result is not None and as_dict(result).get("handoff") == CONTROL
    name = "C2C control" if control else "C2C"
    title = f"{name}: gates and head weights per receiver layer"
    missing = not_run_figure(title, result, FIGURE_HEIGHT, f"{name} did not run.", name)
    if missing is not None:
        return missing
    result = as_dict(result)
    records = sorted(result["layers"], key=lambda r: r["layer"])
    layers = [int(r["layer"]) for r in records]
    heads = max((len(r.get("head_weights_k") or []) for r in records), default=0)
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
    details = result.get("details", {})
    open_k = sum(bool(r.get("gate_k_open")) for r in records)
    open_v = sum(bool(r.get("gate_v_open")) for r in records)
    subtitle = f"{open_k} K gates and {open_v} V gates open of {len(layers)} layers"
    if details.get("fusion_seconds") is not None:
        subtitle += f"; fusion {1000 * float(details['fusion_seconds']):.0f} ms"
    if details.get("control"):
        subtitle += "; control fuser (no sharer information)"
    return layout(fig, f"{title}<br><sup>{subtitle}</sup>", height=FIGURE_HEIGHT, barmode="group", margin=dict(l=60, r=20, t=70, b=50))


def control_gates_figure(result) -> go.Figure:
    """The control fuser's gates figure (named and coloured as the control even with no result)."""
    return gates_figure(result, control=True)


def notes(result: dict) -> list[str]:
    records = result.get("layers") or []
    if not records:
        return []
    open_k = sum(bool(r.get("gate_k_open")) for r in records)
    open_v = sum(bool(r.get("gate_v_open")) for r in records)
    details = result.get("details") or {}
    return [f"gates open: {open_k} K, {open_v} V of {len(records)} layers"] + communication_note(
        details.get("communication"), bool(details.get("control"))
    )


def fuser_found(control: bool):
    """Applicable when a fuser of this kind is found for the pair (config files only, no weights)."""

    def check(pair: LoadedPair, request: HandoffRequest) -> str | None:
        folder, reason = resolve_fuser(pair, fuser_option(request), control)
        return reason if folder is None else None

    return check


def refuse_in_public_mode(folder: str) -> None:
    """A public server runs the shipped fusers only (``kvviz.core.policy``)."""
    if folder.strip() and policy.public_mode():
        raise ValueError(policy.PUBLIC_FUSER_REFUSAL)


OPTIONS = (
    Option("fuser", "C2C fuser checkpoint folder (default: the pair's shipped one)", "", kind="text",
           flag="--fuser", on_page=False, check=refuse_in_public_mode),
)


def fuser_option(request: HandoffRequest) -> str | None:
    """The fuser folder the request names (C2C's option, read by its control too), or None."""
    return option_values(request, NAME, OPTIONS)["fuser"].strip() or None


HANDOFFS = (
    Handoff(
        name=NAME,
        title="C2C: cache fusion",
        label="C2C",
        color="#0072B2",  # blue
        summary="a trained fuser projects the sharer's KV cache into the receiver's",
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
        run=run,
        control=CONTROL,
        needs=("a trained fuser for the pair",),
        applicable=fuser_found(control=False),
        options=OPTIONS,
        receiver_prompt=receiver_prompt,
        figure=gates_figure,
        notes=notes,
        page=20,
        page_default=True,
        walkthrough=(
            "C2C (blue) fuses the sharer's cache into the receiver's with a small trained network that reads both "
            "caches at the question's tokens. Its plot shows, per receiver layer, the gate applied (1 open, 0 "
            "closed; the logit is in the hover). Whether the note got through is the next step's question."
        ),
    ),
    Handoff(
        name=CONTROL,
        title="C2C control: no sharer",
        label="C2C control",
        color="#56B4E9",  # light blue
        summary="the control fuser (trained without the sharer's information): adaptation only",
        explanation=(
            "The control fuser has C2C's architecture, data, steps and seed, but was trained with the sharer's "
            "cache replaced by zeros. It only adapts the receiver's own cache. If C2C does better than its "
            "control, that may be the sharer's knowledge or only a differently trained adapter: the "
            "communication gain under the answers (C2C with the sharer reading another example's context) "
            "tells them apart. It reads the fuser named for C2C (its control sits beside it)."
        ),
        run=run_control,
        needs=("a trained control fuser for the pair",),
        applicable=fuser_found(control=True),
        receiver_prompt=control_receiver_prompt,
        figure=control_gates_figure,
        notes=notes,
        page=25,
        page_default=True,
        walkthrough=(
            "**Predict first:** did the sharer's cache add anything? C2C control (light blue) runs a fuser with "
            "C2C's architecture, data, steps and seed, trained with the sharer's cache replaced by zeros: it can "
            "only adapt the receiver. We loaded **{preset}**: {lesson} The held-out numbers measured by "
            "eval-fuser (NLL and the communication gain) are in *What each model saw*."
        ),
        walkthrough_preset="plants",
    ),
)
