"""C2C handoff: the sharer's KV cache, projected and fused into the receiver's (REFERENCE §1).

Both models read the same user message. The sharer prefills its prompt prefix plus one aligned
token per receiver message token (``kvviz.align``); the receiver prefills its prompt except the
last token; a trained fuser (``kvviz.fuser``) rewrites the receiver's KV at the message tokens
in every layer (``K' = K_r + g·w·K_proj``); the receiver then runs its last prompt token on the
fused cache and decodes with the shared decode loop. Generated tokens are not fused.

``c2c_control`` runs the control fuser: same architecture, data, steps and seed, trained with the
sharer's KV replaced by zeros. It is an adapter on the receiver's own cache. A gap between ``c2c``
and ``c2c_control`` may be the sharer's knowledge or only a differently trained adapter; the
communication gain (``eval-fuser``: C2C with another example's context) tells them apart.

A request's context: a fuser trained with shared input (the paper) gives it to both models; a
fuser trained with a private context (``train-fuser --context private``, the shipped one) gives
it to the sharer only, as the text and KVComm handoffs do; the fuser's config says which.

Fusers: ``request.c2c_fuser`` (a checkpoint folder, a folder in the C2C paper's published layout,
or a hub path to one) overrides the shipped ones. Shipped fusers live in
``assets/fusers/<sharer>__<receiver>/c2c`` and ``.../control`` and are found by matching the
pair's architecture fingerprint (models, KV shapes, tokenizer hash), whatever the pair's name.
A pair with no shipped fuser for which the paper publishes one (``--pair qwen``) uses that one,
fetched from the hub and converted once (``kvviz.fuser_reference``); without network the result
says how to fetch it. The paper publishes no control fuser.

The pipeline (sharer prefill, receiver prefill, fusion) is ``kvviz.fusion.fuse_prompt``, the one
the trainer and the evaluator run too.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import asdict
from pathlib import Path

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from kvviz import fuser_reference, policy
from kvviz.align import align_prompt
from kvviz.decode import generate, prefill
from kvviz.fuser import CONFIG_FILE, WEIGHTS_FILE, C2CFuser, FuserError, checkpoint_label, fingerprints_match, load_fuser, model_fingerprint, read_config
from kvviz.fusion import fuse_prompt
from kvviz.handoffs.common import LoadedPair, TokenCallback, read_prompt
from kvviz.handoffs.registry import Handoff, Option, ReceiverPrompt
from kvviz.measure import StageTimer, decode_flops, forward_flops
from kvviz.plotkit import SELECTED_OUTLINE, as_dict, layout, not_run_figure
from kvviz.presets import DEFAULT_PRESET, preset
from kvviz.results import HandoffRequest, HandoffResult

ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets" / "fusers"
KINDS = ("c2c", "control")


def shipped_folder(sharer: str, receiver: str) -> Path:
    """Where the shipped fusers of a (sharer, receiver) pair live."""
    safe = lambda name: name.replace("/", "--")  # noqa: E731
    return ASSETS_DIR / f"{safe(sharer)}__{safe(receiver)}"


def find_shipped(pair: LoadedPair, kind: str = "c2c", root: Path | None = None) -> Path | None:
    """The shipped fuser of this kind whose fingerprint matches the pair, or None."""
    root = ASSETS_DIR if root is None else root
    if not root.is_dir():
        return None
    wanted_s, wanted_r = model_fingerprint(pair.sharer.facts), model_fingerprint(pair.receiver.facts)
    preferred = shipped_folder(pair.sharer.name, pair.receiver.name) / kind
    candidates = [preferred] + sorted(p / kind for p in root.iterdir() if p.is_dir())
    for folder in candidates:
        if not (folder / "config.json").is_file():
            continue
        try:
            config = read_config(folder)
        except FuserError:
            continue
        if fingerprints_match(config.sharer, wanted_s) and fingerprints_match(config.receiver, wanted_r):
            return folder
    return None


_fusers: dict[tuple, C2CFuser] = {}
_fusers_lock = threading.Lock()


def get_fuser(folder: Path | str, pair: LoadedPair) -> C2CFuser:
    """Load once per process (keyed by folder, file time and device).

    ``folder`` may also be a fuser in the C2C paper's layout or a hub path to one: it is
    converted once (``kvviz.fuser_reference``) and the converted folder is loaded.
    """
    folder = fuser_reference.prepare(folder, pair.sharer.facts, pair.receiver.facts, pair.name)
    weights = folder / "fuser.safetensors"
    stamp = weights.stat().st_mtime_ns if weights.exists() else 0
    key = (str(folder.resolve()), stamp, str(pair.receiver.device), pair.sharer.name, pair.receiver.name)
    # the fuser computes in float32 on a CPU; on an accelerator in the receiver's dtype
    dtype = torch.float32 if pair.receiver.device.type == "cpu" else pair.receiver.dtype
    with _fusers_lock:
        if key not in _fusers:
            _fusers[key] = load_fuser(
                folder, pair.sharer.facts, pair.receiver.facts, pair.name, device=pair.receiver.device, dtype=dtype
            )
        return _fusers[key]


def published_fuser(pair: LoadedPair) -> str | None:
    """The paper's published fuser for this pair (a hub path), if the authors publish one."""
    return fuser_reference.PUBLISHED_FUSERS.get((pair.sharer.name, pair.receiver.name))


def resolve_fuser(pair: LoadedPair, request: HandoffRequest, control: bool) -> tuple[Path | None, str]:
    """(folder, "") or (None, reason). A hub path comes back as a Path of the hub path's text (it is
    fetched into the hub cache). A local folder and its files must lie inside the folders fusers
    may come from (``kvviz.policy``: a symlink out of them is refused); for a folder in the paper's
    layout that means every file in it."""
    folder, reason = locate_fuser(pair, request, control)
    if folder is not None and not fuser_reference.is_hub_path(str(folder)):
        files: tuple[str, ...] = (CONFIG_FILE, WEIGHTS_FILE)
        if folder.is_dir() and fuser_reference.is_reference_layout(folder):
            files += tuple(sorted(p.name for p in folder.iterdir()))
        refusal = policy.fuser_folder_refusal(folder, files)
        if refusal:
            return None, refusal
    return folder, reason


def locate_fuser(pair: LoadedPair, request: HandoffRequest, control: bool) -> tuple[Path | None, str]:
    """(folder, "") or (None, reason): the request's fuser folder, the pair's shipped one, or the
    paper's published one for the pair (a hub path)."""
    kind = "control" if control else "c2c"
    if request.c2c_fuser:
        if fuser_reference.is_hub_path(request.c2c_fuser):
            if control:
                return None, f"No control fuser for the published fuser {request.c2c_fuser}: the paper publishes none."
            return Path(request.c2c_fuser), ""
        folder = Path(request.c2c_fuser).expanduser()
        if control:
            # a user checkpoint's control sits beside it: <dir>/c2c and <dir>/control
            sibling = folder.parent / "control"
            if (sibling / "config.json").is_file() and sibling.resolve() != folder.resolve():
                return sibling, ""
            if (folder / "control" / "config.json").is_file():
                return folder / "control", ""
            return None, f"No control fuser beside {folder} (expected {sibling})."
        if (folder / "c2c" / "config.json").is_file() and not (folder / "config.json").is_file():
            folder = folder / "c2c"
        return folder, ""
    found = find_shipped(pair, kind)
    if found is None:
        published = published_fuser(pair)
        if published and not control:
            return Path(published), ""
        if published:
            return None, (
                f"The C2C paper publishes a fuser for pair '{pair.name}' ({published}) but no control fuser. "
                f"Train a control with: python -m kvviz train-fuser --pair {pair.name} --control"
            )
        return None, (
            f"No trained {'control ' if control else ''}C2C fuser for pair '{pair.name}' "
            f"(sharer {pair.sharer.name} -> receiver {pair.receiver.name}) in {ASSETS_DIR}. "
            "Train one with: python -m kvviz train-fuser --pair " + pair.name
        )
    return found, ""


def receiver_sees_context_for(fuser: C2CFuser) -> bool:
    """The context setting the fuser was trained in (the paper's shared input when unrecorded)."""
    return bool((fuser.config.training or {}).get("receiver_sees_context", True))


@torch.no_grad()
def fused_state(pair: LoadedPair, fuser: C2CFuser, alignment, timer: StageTimer, sharer="right"):
    """Sharer prefill, receiver prefill of all but the last prompt token, fusion (``kvviz.fusion``).

    Returns (receiver state ready for the last prompt token, layer records, bytes read, fusion s).
    """
    fused = fuse_prompt(pair, fuser, alignment, sharer=sharer, hard=True, timer=timer)
    return fused.state, fused.records, fused.bytes_read, fused.fusion_seconds


COMMUNICATION_FILE = "communication.json"  # eval-fuser's report, beside a pair's c2c/ and control/


def stored_communication(folder: Path) -> dict | None:
    """The communication measure ``eval-fuser --out <pair folder>/communication.json`` stored
    beside the fuser pair, when it names this fuser (as C2C or as its control); else None."""
    path = Path(folder).parent / COMMUNICATION_FILE
    try:
        report = json.loads(path.read_text())
        label = checkpoint_label(folder)
        if label not in (report.get("fuser"), report.get("control")):
            return None
        heldout = report["heldout"]
        measured = dict(heldout["communication"]["c2c"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    measured["heldout_nll"] = dict(heldout.get("nll", {}))
    measured["data"] = heldout.get("data")
    measured["source"] = checkpoint_label(path)
    if report.get("command"):
        measured["command"] = report["command"]
    return measured


def communication_details(fuser: C2CFuser, folder: Path | None = None) -> dict | None:
    """The C2C fuser's measured communication gain (``eval-fuser``): recorded in the fuser's config
    by the trainer (``--measure``), else stored beside the fuser pair (``COMMUNICATION_FILE``). A
    control column shows its C2C's measure (its own gain is 0 by construction)."""
    measured = (fuser.config.training or {}).get("communication")
    if measured and not fuser.config.control:
        return dict(measured, source="the fuser's config (train-fuser --measure)")
    return stored_communication(folder) if folder is not None and not fuser_reference.is_hub_path(str(folder)) else None


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


def request_fuser(pair: LoadedPair, request: HandoffRequest, control: bool) -> tuple[C2CFuser | None, Path | None, str]:
    """(fuser, folder, "") for the request, or (None, folder, reason) when it cannot run."""
    name = "c2c_control" if control else "c2c"
    folder, reason = resolve_fuser(pair, request, control)
    if folder is None:
        return None, None, reason
    try:
        fuser = get_fuser(folder, pair)
    except FuserError as error:
        return None, folder, str(error)
    if fuser.config.control != control:
        kind = "a control" if fuser.config.control else "a real (non-control)"
        return None, folder, f"The fuser at {folder} is {kind} fuser; {name} needs the other kind."
    return fuser, folder, ""


def request_alignment(pair: LoadedPair, request: HandoffRequest, fuser: C2CFuser):
    """The request's prompts aligned the way the fuser was trained (context shared or private)."""
    return align_prompt(
        pair.receiver.tokenizer, pair.sharer.tokenizer, request.query, request.context, receiver_sees_context_for(fuser),
        fuser.config.token_alignment, fuser.config.fuse_template,
    )


def fused_prompt(pair: LoadedPair, fuser: C2CFuser, alignment, sharer="right") -> ReceiverPrompt:
    """The receiver after its whole prompt on the fused cache (the state C2C decodes from), for
    likelihood scoring. ``sharer`` as in ``kvviz.fusion.fuse_prompt`` ("right", "zero" or a
    SharerKV: eval-fuser's other-question control)."""
    with torch.no_grad():
        state = fuse_prompt(pair, fuser, alignment, sharer=sharer, hard=True).state
        return read_prompt(pair.receiver, alignment.receiver_ids[-1:], state)


def receiver_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult, control: bool = False) -> ReceiverPrompt:
    fuser, _, reason = request_fuser(pair, request, control)
    if fuser is None:
        raise FuserError(reason)
    return fused_prompt(pair, fuser, request_alignment(pair, request, fuser))


def control_receiver_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult) -> ReceiverPrompt:
    return receiver_prompt(pair, request, result, control=True)


def run(
    pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None, control: bool = False
) -> HandoffResult:
    name = "c2c_control" if control else "c2c"
    fuser, folder, reason = request_fuser(pair, request, control)
    if fuser is None:
        return HandoffResult.not_applicable(name, pair.name, reason)

    timer = StageTimer()
    receiver, sharer = pair.receiver, pair.sharer
    receiver_sees_context = receiver_sees_context_for(fuser)
    alignment = request_alignment(pair, request, fuser)
    state, records, sent, fusion_seconds = fused_state(pair, fuser, alignment, timer)
    last = alignment.receiver_ids[-1:]
    with timer.stage("receiver_prefill"):
        logits, _ = prefill(receiver, state, last)
    with timer.stage("receiver_decode"):
        output = generate(receiver, state, logits, request.generation, on_token=on_token)
    timings = timer.as_dict()

    prompt_length = len(alignment.receiver_ids)
    receiver_flops = (
        forward_flops(receiver.facts, prompt_length - 1, 0, 0)
        + forward_flops(receiver.facts, 1, prompt_length - 1, 1)
        + decode_flops(receiver.facts, len(output.token_ids), prompt_length)
    )
    flops = {"receiver": receiver_flops, "fuser": 2.0 * fuser.num_parameters * alignment.num_fused}
    if not control:
        flops["sharer"] = forward_flops(sharer.facts, len(alignment.sharer_ids), 0, 0)
    segments = alignment.receiver_segments
    return HandoffResult(
        handoff=name,
        pair=pair.name,
        answer=output.text,
        answer_ids=output.token_ids,
        seen={
            "sharer": "" if control else sharer.tokenizer.decode(alignment.sharer_ids),
            "receiver": segments.text,
        },
        timings=timings,
        bytes_communicated=sent,
        communication="none" if control else "kv",
        flops=flops,
        tokens={
            "receiver_prompt": prompt_length,
            "sharer_prompt": 0 if control else len(alignment.sharer_ids),
            "fused": alignment.num_fused,
            "generated": len(output.token_ids),
        },
        layers=[asdict(record) for record in records],
        first_token_seconds=timings["sharer_prefill"] + timings["transfer"] + timings["receiver_prefill"] + output.first_token_seconds,
        receiver_first_token_seconds=timings["transfer"] + timings["receiver_prefill"] + output.first_token_seconds,
        details={
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
            "stopped_by": output.stopped_by,
        },
    )


def run_control(pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None) -> HandoffResult:
    """The control fuser (no sharer information): how much of C2C's effect is adaptation."""
    return run(pair, request, on_token=on_token, control=True)


# --- descriptors ------------------------------------------------------------------------------

GATE_OPEN_COLOR = "#0072B2"
GATE_CLOSED_COLOR = "#d9d9d9"
FIGURE_HEIGHT = 500
CLOSED_SLIVER = 0.04  # a closed gate (applied 0) is drawn as a thin grey sliver so that its hover can be reached


def gates_figure(result) -> go.Figure:
    """Top: the gate each receiver layer applied, 0 (closed) or 1 (open: the projected sharer KV is
    added), for K and V; the logit and sigmoid(logit) it came from are in the hover (at inference
    the gate is hard: open when the logit is above 0). Below, on the same layer axis: head weights
    as KV head x layer heatmaps for K and V."""
    title = "C2C: gates and head weights per receiver layer"
    missing = not_run_figure(title, result, FIGURE_HEIGHT, "C2C did not run.", "C2C")
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
    for kind, label in (("k", "K"), ("v", "V")):
        soft = [float(r.get(f"gate_{kind}", 0.0)) for r in records]
        logits = [float(r.get(f"gate_{kind}_logit", 0.0)) for r in records]
        opened = [bool(r.get(f"gate_{kind}_open", False)) for r in records]
        sharer = [r.get("sharer_layer") for r in records]
        base = GATE_OPEN_COLOR if kind == "k" else "#56B4E9"
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
                    pattern=dict(shape="" if kind == "k" else "/"),
                ),
                hovertext=hover,
                hoverinfo="text",
                showlegend=False,
                meta={"series": f"gate_{kind}", "applied": [int(o) for o in opened], "logit": logits, "sigmoid": soft},
            ),
            row=1,
            col=1,
        )
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
        folder, reason = resolve_fuser(pair, request, control)
        return reason if folder is None else None

    return check


def apply_options(request: HandoffRequest, values: dict) -> HandoffRequest:
    """The fuser option is ``request.c2c_fuser``, read by both C2C and its control."""
    return dataclasses.replace(request, c2c_fuser=values["fuser"].strip() or None)


HANDOFFS = (
    Handoff(
        name="c2c",
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
        needs=("a trained fuser for the pair",),
        applicable=fuser_found(control=False),
        options=(
            Option("fuser", "C2C fuser checkpoint folder (default: the pair's shipped one)", "", kind="text",
                   flag="--fuser", on_page=False),
        ),
        apply_options=apply_options,
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
        name="c2c_control",
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
        figure=gates_figure,
        notes=notes,
        page=25,
        page_default=True,
        walkthrough=(
            "**Predict first:** did the sharer's cache add anything? C2C control (light blue) runs a fuser with "
            "C2C's architecture, data, steps and seed, trained with the sharer's cache replaced by zeros: it can "
            f"only adapt the receiver. On this preset (we loaded **{preset(DEFAULT_PRESET).title}** again), if C2C gives the code "
            "from the note and its control does not, the sharer's cache carried it. If both columns answer "
            "alike, C2C's change is the fuser adapting the receiver, not the sharer's knowledge. The note under "
            "each column gives the held-out numbers measured by eval-fuser (NLL and the communication gain)."
        ),
        walkthrough_preset=DEFAULT_PRESET,
    ),
)
