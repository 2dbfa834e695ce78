"""C2C translation: the sharer's KV of a private context, translated into the receiver's KV space.

The sharer reads the context; a trained per-layer translator (``kvviz.translator``) maps the
sharer's keys and values at every context token into the receiver's; the receiver attends to them
as a prefix in front of its question (its own one-token sink and context-free ``<bos>Context:``
first, as KVComm keeps a sink) and answers. The receiver never reads the context: no text of it
reaches the receiver, only the translated KV.

``c2c_translate_control`` runs the same translator on a fixed unrelated context (KVComm's
built-in calibration sentence): whatever it answers comes from the receiver and the question,
not from this request's context.

Translators: ``request.options["c2c_translate"]["translator"]`` (a folder) or the pair's shipped
one in ``assets/translators/<sharer>__<receiver>/`` (found by the pair's fingerprints).
"""

from __future__ import annotations

import threading
from pathlib import Path

import plotly.graph_objects as go

from kvviz import translator as tr
from kvviz.decode import generate, prefill
from kvviz.handoffs.common import LoadedPair, TokenCallback
from kvviz.handoffs.registry import Handoff, Option, all_of, needs_context, option_values
from kvviz.measure import StageTimer, decode_flops, forward_flops
from kvviz.plotkit import SELECTED_OUTLINE, as_dict, layout, not_run_figure
from kvviz.prompts import build_segments
from kvviz.results import HandoffRequest, HandoffResult

ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets" / "translators"
CONTROL_CONTEXT = "Mira keeps her red bicycle in the garden shed behind the old library in Lisbon."
NAME, CONTROL = "c2c_translate", "c2c_translate_control"


def shipped_translator(pair: LoadedPair, root: Path | None = None) -> Path | None:
    """The shipped translator whose fingerprints match the pair, or None."""
    root = ASSETS_DIR if root is None else root
    if not root.is_dir():
        return None
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            config = tr.read_config(folder)
            tr.check_pair(config, folder, pair.sharer.facts, pair.receiver.facts, pair.name)
        except tr.TranslatorError:
            continue
        return folder
    return None


def locate(pair: LoadedPair, request: HandoffRequest) -> tuple[Path | None, str]:
    given = (option_values(request, NAME, OPTIONS).get("translator") or "").strip()
    if given:
        from kvviz import policy

        folder = Path(given).expanduser()
        refusal = policy.fuser_folder_refusal(folder, (tr.CONFIG_FILE, tr.WEIGHTS_FILE))
        return (None, refusal) if refusal else (folder, "")
    found = shipped_translator(pair)
    if found is None:
        return None, (
            f"No KV translator for pair '{pair.name}' (sharer {pair.sharer.name} -> receiver {pair.receiver.name}) in "
            f"{ASSETS_DIR}. Train one: research/translator_extract.py, translator_fit.py, translator_stage2.py."
        )
    return found, ""


_loaded: dict[tuple, tr.KVTranslator] = {}
_lock = threading.Lock()


def get_translator(folder: Path, pair: LoadedPair) -> tr.KVTranslator:
    weights = folder / tr.WEIGHTS_FILE
    key = (str(folder.resolve()), weights.stat().st_mtime_ns if weights.exists() else 0, pair.sharer.name, pair.receiver.name)
    with _lock:
        if key not in _loaded:
            _loaded[key] = tr.load_translator(folder, pair.sharer.facts, pair.receiver.facts, pair.name, pair.receiver.device)
        return _loaded[key]


def run(pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None, control: bool = False) -> HandoffResult:
    name = CONTROL if control else NAME
    if not request.has_context:
        return HandoffResult.not_applicable(name, pair.name, "The translation carries a private context; this request has none.")
    folder, reason = locate(pair, request)
    if folder is None:
        return HandoffResult.not_applicable(name, pair.name, reason)
    try:
        translator = get_translator(folder, pair)
    except tr.TranslatorError as error:
        return HandoffResult.not_applicable(name, pair.name, str(error))
    receiver, sharer = pair.receiver, pair.sharer
    context = CONTROL_CONTEXT if control else request.context
    timer = StageTimer()
    alignment = tr.align_context(receiver.tokenizer, sharer.tokenizer, context, translator.config.sharer_start)
    with timer.stage("sharer_prefill"):
        sharer_kv = tr.read_kv(sharer, [alignment.sharer_ids])
    with timer.stage("transfer"):
        features = tr.features(sharer_kv, alignment, translator.config.sharer_layers, translator.config.neighbours)
        import torch

        with torch.no_grad():
            keys, values, weights = translator(features.to(translator.up.device))
        prefix = tr.build_prefix(receiver, alignment, keys, values, weights, translator.open_gates().float().tolist())
    segments = build_segments(receiver.tokenizer, request.query)
    state = prefix.state
    with timer.stage("receiver_prefill"):
        first, _ = prefill(receiver, state, segments.query_ids)
    with timer.stage("receiver_decode"):
        output = generate(receiver, state, first, request.generation, on_token=on_token)
    timings = timer.as_dict()
    sent = tr.read_bytes(translator.config, len(alignment.sharer_ids), sharer.dtype)
    made = sum(len(w) for w in prefix.weights) * 2 * translator.config.kv_width * receiver.dtype.itemsize
    layers = [
        {"layer": layer, "gate": gate, "open": gate > 0, "gate_logit": float(translator.gate_logits[layer]),
         "weight_mean": (sum(w) / len(w)) if w else None, "weights": w}
        for layer, (gate, w) in enumerate(zip(prefix.gates, prefix.weights))
    ]
    translated_tokens = [receiver.tokenizer.decode([i]) for i in alignment.receiver_ids[alignment.own_count:]]
    query_length = len(segments.query_ids)
    prefix_lengths = [len(alignment.receiver_ids) if gate > 0 else 1 for gate in prefix.gates]
    receiver_flops = forward_flops(receiver.facts, query_length, prefix_lengths, 1) + decode_flops(
        receiver.facts, len(output.token_ids), [n + query_length for n in prefix_lengths])
    receiver_first = timings["transfer"] + timings["receiver_prefill"] + output.first_token_seconds
    return HandoffResult(
        handoff=name,
        pair=pair.name,
        answer=output.text,
        answer_ids=output.token_ids,
        seen={"sharer": sharer.tokenizer.decode(alignment.sharer_ids), "receiver": segments.text},
        timings=timings,
        bytes_communicated=sent,
        communication="kv",
        flops={"sharer": forward_flops(sharer.facts, len(alignment.sharer_ids), 0, 0), "receiver": receiver_flops,
               "translator": 2.0 * translator.num_parameters * alignment.translated_count},
        tokens={"context": len(alignment.sharer_ids), "translated": alignment.translated_count,
                "receiver_prompt": query_length, "generated": len(output.token_ids)},
        layers=layers,
        first_token_seconds=timings["sharer_prefill"] + receiver_first,
        receiver_first_token_seconds=receiver_first,
        details={
            "translator_path": str(folder),
            "control": control,
            "control_context": CONTROL_CONTEXT if control else None,
            "open_gates": sum(g > 0 for g in prefix.gates),
            "layers": len(prefix.gates),
            "applied_gates": [int(g > 0) for g in prefix.gates],
            "translated_bytes": made,
            "sharer_kv_bytes_all_layers": tr.kv_bytes(sharer.facts, len(alignment.sharer_ids), sharer.dtype),
            "sharer_layers_read": list(translator.config.sharer_layers),
            "translated_tokens": translated_tokens,
            "parameters": translator.num_parameters,
            "trained": dict(translator.config.training),
            "stopped_by": output.stopped_by,
        },
    )


def run_control(pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None) -> HandoffResult:
    return run(pair, request, on_token, control=True)


def translator_found(pair: LoadedPair, request: HandoffRequest) -> str | None:
    folder, reason = locate(pair, request)
    return reason if folder is None else None


OPEN_COLOR, CLOSED_COLOR = "#882255", "#d9d9d9"
FIGURE_HEIGHT = 420


def gates_figure(result) -> go.Figure:
    """Per receiver layer: whether it took the translated context (gate 1) and the mean weight of
    the translated tokens (the share of attention they may receive); a heatmap of the weight per
    translated token below."""
    from plotly.subplots import make_subplots

    title = "C2C translation: which receiver layers took the translated context"
    missing = not_run_figure(title, result, FIGURE_HEIGHT, "Run a preset with a private context.", "C2C translation")
    if missing is not None:
        return missing
    result = as_dict(result)
    records = sorted(result["layers"], key=lambda r: r["layer"])
    layers = [r["layer"] for r in records]
    tokens = (result.get("details") or {}).get("translated_tokens") or []
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
    if (result.get("details") or {}).get("control"):
        subtitle += "; control: the translator read an unrelated context"
    return layout(fig, f"{title}<br><sup>{subtitle}</sup>", height=FIGURE_HEIGHT + 12 * min(len(tokens), 40),
                  margin=dict(l=90, r=20, t=70, b=50))


def notes(result: dict) -> list[str]:
    details = result.get("details") or {}
    if "open_gates" not in details:
        return []
    lines = [f"gates open: {details['open_gates']} of {details['layers']} layers; sent {result.get('bytes_communicated', 0):,} "
             f"bytes of the sharer's KV (layers {details.get('sharer_layers_read')}), translated into "
             f"{details.get('translated_bytes', 0):,} bytes of receiver KV"]
    measured = (details.get("trained") or {}).get("measured")
    if measured:
        lines.append(measured)
    return lines


def apply_options(request: HandoffRequest, values: dict) -> HandoffRequest:
    import dataclasses

    return dataclasses.replace(request, options={**request.options, NAME: values})


NO_LIKELIHOOD = "not computed: {name} builds the receiver's cache from translated KV, which the bench does not rebuild"
OPTIONS = (
    Option("translator", "KV translator folder (default: the pair's shipped one)", "", kind="text", flag="--translator",
           on_page=False),
)
NEEDS = ("a private context", "a trained KV translator for the pair")

HANDOFFS = (
    Handoff(
        name=NAME,
        title="C2C translation: the context's KV",
        label="C2C translate",
        color="#882255",  # wine
        summary="a trained translator maps the sharer's KV of the context into the receiver's",
        explanation=(
            "Only the sharer reads the note. A trained translator turns the sharer's memory of each of the note's "
            "tokens (its keys and values, layer by layer) into the receiver's own format, and the receiver reads "
            "its question after those translated tokens, as if it had read the note itself. The receiver never "
            "sees the note's words: what crosses is the sharer's KV cache. A gate per receiver layer says whether "
            "that layer takes the translated note at all (closed: the layer reads the question as the receiver "
            "alone does), and a weight per translated token how much attention it may get."
        ),
        run=run,
        needs=NEEDS,
        applicable=all_of(needs_context("The translation carries a private context; this request has none."), translator_found),
        options=OPTIONS,
        apply_options=apply_options,
        no_receiver_prompt=NO_LIKELIHOOD.format(name=NAME),
        figure=gates_figure,
        notes=notes,
        page=22,
        page_default=True,
    ),
    Handoff(
        name=CONTROL,
        title="C2C translation control: another context",
        label="Translate control",
        color="#CC6677",
        summary="the same translator fed an unrelated context: what the receiver answers without this note",
        explanation=(
            "The same translator and receiver, but the sharer reads a fixed unrelated sentence instead of the note "
            f"(*{CONTROL_CONTEXT}*). If the translation column gives the note's fact and this one does not, the "
            "fact crossed in the translated KV."
        ),
        run=run_control,
        needs=NEEDS,
        applicable=all_of(needs_context("The translation control needs a request with a private context."), translator_found),
        no_receiver_prompt=NO_LIKELIHOOD.format(name=CONTROL),
        figure=gates_figure,
        notes=notes,
        page=23,
    ),
)
