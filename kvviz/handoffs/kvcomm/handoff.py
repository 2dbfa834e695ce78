"""KVComm: the receiver attends to the sender's KV of the context in a selected set of layers.

Protocol (KVComm, arXiv 2510.03346, and its reference code; REFERENCE.md §2):
1. The sender prefills the context C (its cache, keys after RoPE, positions 0..|C|-1).
2. Calibration, once per pair and calibration sample: the receiver prefills the calibration
   question with the sender's KV of the calibration context present in every layer; for each
   layer, the attention importance S_a(l) is the mean over heads and query tokens of the attention
   mass on the context keys (the first key, the attention sink, excluded).
3. Score S = alpha * minmax(S_a) + (1 - alpha) * minmax(P) with the Gaussian prior
   P(l) = exp(-(l - mu)^2 / (2 sigma^2)); the top M = ceil(r * L) layers are sent (non-contiguous).
   alpha is 1.0 unless set (the reference code's default); ``alpha="paper"`` takes the paper's
   value for the receiver's family (PAPER_ALPHAS; the paper gives none for Gemma).
4. Selected receiver layers see the whole context KV before their own; the others keep only the
   sender's first token as an attention sink. Query positions continue after |C| in every layer,
   and the mask is causal by real positions. ``reference_mask=True`` reproduces the reference
   code's mask instead (query tokens see later query tokens in the unselected layers during the
   prefill; ``kvviz.runtime.attention.AttentionPlan.reference_mask``), so its numbers can be compared.

Calibration sample (``KVCommOptions.calibration``): "builtin" (the sentence below, the same for
every task), "sample" (a given (context, question), e.g. a task's first item as the reference
code does) or "query" (this request itself: the receiver then reads the question twice, once with
the context in every layer to choose the layers, once for real; both passes are on the critical
path and timed as its prefill).

This query's importance: every run also measures S_a(l) of *this* question on *this* context
(one extra receiver pass with the context in every layer, after the answer is written). It is
instrumentation, to show whether one-sample calibration transfers: timed in
``details["query_importance"]["seconds"]``, never in the handoff's stages or first-token time
(except with calibration "query", where that pass is the calibration itself).

Layer 0: with ``always_send_layer0`` (the default, as the reference code does) layer 0 is one of
the M sent layers whenever M >= 1, and the other M - 1 are the best-scoring of layers 1..L-1.
So "exactly M layers" holds in every strategy, and r = 0 sends nothing but the sink.

Strategies (``kvviz.handoffs.kvcomm.layers``, one small pick each over one shared step): "kvcomm"
(the score above), "attention" (alpha = 1), "prior" (alpha = 0), "contiguous" (the best-scoring
block of consecutive layers), "random" (seeded; no score), "explicit" (the layers given; no score).
The options (``KVCommOptions``) live in ``request.options["kvcomm"]``.

Per-layer records (``HandoffResult.layers``, one per receiver layer; plots read these):
  layer                      receiver layer index
  sent                       "context" (the whole context KV) or "sink" (only its first token)
  selected                   sent == "context"
  forced                     True for layer 0 when ``always_send_layer0`` put it in the set (its
                             score was not consulted)
  calibration_attention      S_a(l) measured on the calibration sample; None when the strategy
                             used no attention (prior, random, explicit, or alpha = 0)
  calibration_attention_norm the same, min-max normalised over layers; None likewise
  query_attention            S_a(l) of this question on this context (always measured)
  query_attention_norm       the same, min-max normalised over layers
  prior                      the normalised Gaussian prior, the score's second term (its weight is
                             1 - alpha: 0 by default); None when no score was used
  score                      alpha * calibration_attention_norm + (1 - alpha) * prior, the value
                             the layers were ranked by; None when no score was used (random,
                             explicit)

``details`` keys: strategy, ratio, alpha (None when no score was used), alpha_source, mu, sigma,
selected_layers, num_selected, forced_layers, sink_layers, reference_mask, sender_model,
calibration (None when no attention was used; else source "builtin" | "sample" | "query",
context, query, alpha, seconds, cached), query_importance (seconds, instrumentation),
importance_spearman (Spearman rank correlation between calibration_attention and
query_attention over layers; None without calibration), stopped_by.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import plotly.graph_objects as go

from kvviz.core.plotkit import SELECTED_OUTLINE, as_dict, layout, not_run_figure
from kvviz.core.prompts import build_segments
from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.handoffs.common import UNRELATED_CONTEXT, TokenCallback, read_prompt
from kvviz.handoffs.kvcomm.layers import (
    CALIBRATION_CONTEXT,
    CALIBRATION_QUERY,
    NAME,
    STRATEGIES,
    attention_importance,
    calibrate,
    calibrate_on_sample,
    calibration_texts,
    configure,
    forced_layers,
    layer_records,
    layer_scores,
    options_of,
    resolve_alpha,
    select_layers,
    spearman,
)
from kvviz.handoffs.registry import Handoff, Option, Sweep, TaskCalibration, all_of, needs_context
from kvviz.runtime import cache as kv
from kvviz.runtime import crossed
from kvviz.runtime.decode import generate, prefill, read_prompt_once
from kvviz.runtime.measure import StageTimer, decode_flops, forward_flops
from kvviz.runtime.models import LoadedPair


def applicability(pair: LoadedPair) -> str | None:
    """None when KVComm can run on this pair, else the reason it cannot."""
    sender, receiver = pair.kvcomm_sender.facts, pair.receiver.facts
    if sender.kv_shape_signature != receiver.kv_shape_signature:
        return (
            "KVComm needs a sender with the receiver's architecture and KV shape: "
            f"{sender.name} is {sender.model_type} with {sender.num_layers} layers x {sender.num_kv_heads} KV heads x "
            f"{sender.head_dim} dims, {receiver.name} is {receiver.model_type} with {receiver.num_layers} x "
            f"{receiver.num_kv_heads} x {receiver.head_dim}."
        )
    if sender.tokenizer_hash != receiver.tokenizer_hash:
        return "KVComm needs sender and receiver to share a tokenizer (positions and the sink must line up)."
    return None


# --- the handoff ------------------------------------------------------------------------------


@dataclass
class Sent:
    """What one KVComm run chose and sent, for its result."""

    selected: list[int]
    scores: dict
    calibration: dict | None  # the importance that chose the layers, with where it was measured
    query_importance: dict  # this query's own importance (instrumentation, or the calibration)
    bytes: int


def run(pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None) -> HandoffResult:
    reason = applicability(pair)
    if reason:
        return HandoffResult.not_applicable(NAME, pair.name, reason)
    if not request.has_context:
        return HandoffResult.not_applicable(
            NAME, pair.name, "KVComm shares the KV of a private context; this request has none."
        )
    options = options_of(request)
    receiver = pair.receiver
    alpha, alpha_source = resolve_alpha(options, receiver.facts.model_type)
    segments = build_segments(receiver.tokenizer, request.query, request.context)
    timer = StageTimer()
    output, sent = send_and_answer(pair, request, options, alpha, segments, timer, on_token)
    timings = timer.as_dict()
    on_this_query = sent.calibration is not None and sent.calibration["source"] == "query"
    prompt_flops, receiver_flops, sender_flops = kvcomm_flops(pair, segments, sent.selected, len(output.token_ids), on_this_query)
    return HandoffResult(
        handoff=NAME,
        pair=pair.name,
        answer=output.text,
        answer_ids=output.token_ids,
        seen={"sender": segments.context_text, "receiver": segments.query_text},
        timings=timings,
        bytes_communicated=sent.bytes,
        communication="kv",
        flops={"sharer": sender_flops, "receiver": receiver_flops},
        flops_to_first_token={"sharer": sender_flops, "receiver": prompt_flops},
        tokens={"context": len(segments.context_ids), "receiver_prompt": len(segments.query_ids),
                "generated": len(output.token_ids)},
        layers=layer_records(
            receiver.facts.num_layers, sent.selected, forced_layers(options, sent.selected),
            sent.calibration["attention"] if sent.calibration else None, sent.scores, sent.query_importance["attention"],
        ),
        first_token_seconds=timer.first_token_seconds,
        receiver_first_token_seconds=timer.receiver_first_token_seconds,
        details={**run_details(pair, options, alpha, alpha_source, sent), "stopped_by": output.stopped_by},
    )


CONTROL = "kvcomm_control"


def run_control(pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None) -> HandoffResult:
    """KVComm with the same options (so, calibrated on the built-in sample, the same layers) whose
    sender reads a fixed unrelated sentence instead of the private context: what the receiver
    answers when the splice carries nothing about the question."""
    if not request.has_context:
        return HandoffResult.not_applicable(CONTROL, pair.name, "The KVComm control needs a request with a private context.")
    result = run(pair, dataclasses.replace(request, context=UNRELATED_CONTEXT), on_token)
    return dataclasses.replace(result, handoff=CONTROL, details={**result.details, "control_context": UNRELATED_CONTEXT})


def send_and_answer(pair, request, options, alpha, segments, timer: StageTimer, on_token):
    """The timed handoff: the sender reads the context, the layers are chosen (on this query's own
    attention with calibration "query"), the KV is spliced in, the receiver answers. Then, outside
    every stage, this query's importance is measured (instrumentation). Returns (decode output,
    what was sent)."""
    sender, receiver = pair.kvcomm_sender, pair.receiver
    num_layers = receiver.facts.num_layers
    uses_attention = alpha is not None and alpha > 0
    calibration = None
    if uses_attention and options.calibration != "query":
        # one-off per pair and sample (cached), before the question is asked: not timed here
        calibration = {**calibrate(pair, *calibration_texts(options)), "source": options.calibration}
    # the sender reads the context (once per run: AC's sender reads the same)
    sender_state = read_prompt_once(sender, segments.context_ids, timer, "sharer_prefill").state
    query_importance = None
    if uses_attention and options.calibration == "query":
        # The receiver reads this question once with the context in every layer to choose the
        # layers: part of its prefill, on the critical path, and every layer's KV is sent.
        started = time.perf_counter()
        with timer.stage("receiver_prefill"):
            measured = attention_importance(pair, sender_state.cache, segments.query_ids)
        seconds = time.perf_counter() - started
        calibration = {
            "attention": measured, "context": request.context, "query": request.query,
            "seconds": seconds, "cached": False, "source": "query",
        }
        query_importance = {"attention": measured, "seconds": seconds, "instrumentation": False}
    scores = layer_scores(calibration["attention"] if calibration else None, alpha, options, num_layers)
    with timer.stage("transfer"):
        selected = select_layers(scores["score"], options, num_layers)
        state = kv.splice_prefix(sender_state.cache, num_layers, set(selected))
        state.reference_mask = options.reference_mask
        sent_bytes = kv.kv_bytes(sender_state.cache if query_importance is not None else state.cache)
    # what crossed: the context's keys, at positions 0..|C|-1 (the sink alone in unsent layers)
    crossed.mark_sent("context tokens (the sender's KV cache, in the layers KVComm sent; the first token, "
                      "the attention sink, in every layer)", range(len(segments.context_ids)), segments.context_ids,
                      layers=selected)
    with timer.stage("receiver_prefill"):
        first, _ = prefill(receiver, state, segments.query_ids)
    with timer.stage("receiver_decode"):
        output = generate(receiver, state, first, request.generation, on_token=on_token, timer=timer)
    if query_importance is None:
        # instrumentation: after the answer, outside every stage and the total
        started = time.perf_counter()
        measured = attention_importance(pair, sender_state.cache, segments.query_ids)
        query_importance = {"attention": measured, "seconds": time.perf_counter() - started, "instrumentation": True}
    return output, Sent(selected, scores, calibration, query_importance, sent_bytes)


def kvcomm_flops(pair, segments, selected: list[int], generated: int, on_this_query: bool) -> tuple[float, float, float]:
    """(the receiver's FLOPs to its first token, the receiver's in all, the sender's)."""
    receiver = pair.receiver
    num_layers = receiver.facts.num_layers
    context_length, query_length = len(segments.context_ids), len(segments.query_ids)
    # receiver attention sees |C| prefix keys in sent layers and 1 (the sink) in the others
    prefix = [context_length if layer in selected else min(1, context_length) for layer in range(num_layers)]
    prompt = forward_flops(receiver.facts, query_length, prefix, 1)
    if on_this_query:  # the extra pass that chose the layers
        prompt += forward_flops(receiver.facts, query_length, context_length, 0)
    answer = decode_flops(receiver.facts, generated, [count + query_length for count in prefix])
    return prompt, prompt + answer, forward_flops(pair.kvcomm_sender.facts, context_length, 0, 0)


def run_details(pair, options, alpha, alpha_source: str, sent: Sent) -> dict:
    """``HandoffResult.details`` (the keys in the module docstring, but ``stopped_by``)."""
    num_layers = pair.receiver.facts.num_layers
    calibration = sent.calibration
    return {
        "strategy": options.strategy,
        "ratio": options.ratio,
        "alpha": alpha,
        "alpha_source": alpha_source,
        "mu": options.mu if options.mu is not None else (num_layers - 1) / 2,
        "sigma": options.sigma,
        "selected_layers": sent.selected,
        "num_selected": len(sent.selected),
        "forced_layers": forced_layers(options, sent.selected),
        "sink_layers": [layer for layer in range(num_layers) if layer not in sent.selected],
        "reference_mask": options.reference_mask,
        "sender_model": pair.kvcomm_sender.name,
        "calibration": None if calibration is None else {
            "source": calibration["source"],
            "context": calibration["context"],
            "query": calibration["query"],
            "alpha": alpha,
            "seconds": calibration["seconds"],
            "cached": calibration["cached"],
        },
        "query_importance": {
            "seconds": sent.query_importance["seconds"],
            "instrumentation": sent.query_importance["instrumentation"],
        },
        "importance_spearman": None if calibration is None
        else spearman(calibration["attention"], sent.query_importance["attention"]),
    }


# --- descriptor -------------------------------------------------------------------------------

COLOR = "#009E73"  # green
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


def figure_series(result: dict) -> list[tuple[str, str, str, str]]:
    """The bar series a KVComm result can show, as (series, record field, name, explanation);
    only what the run measured or used: the calibration importance where a calibration was used,
    this query's importance (always measured), the prior and the score only where a score mixed
    both (0 < alpha < 1), or the prior alone where it was the score (alpha = 0)."""
    details = result.get("details", {}) or {}
    records = result.get("layers") or []
    alpha = details.get("alpha")
    calibration = details.get("calibration") or {}
    source = calibration.get("source")
    has = lambda field: any(r.get(field) is not None for r in records)  # noqa: E731
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
    missing = not_run_figure(title, result, FIGURE_HEIGHT, hint, "KVComm")
    if missing is not None:
        return missing
    result = as_dict(result)
    records = sorted(result["layers"], key=lambda r: r["layer"])
    layers = [int(r["layer"]) for r in records]
    selected = [bool(r.get("selected")) for r in records]
    forced = [bool(r.get("forced")) for r in records]
    details = result.get("details", {}) or {}

    def status(layer_selected: bool, layer_forced: bool) -> str:
        if layer_forced:
            return "<b>layer 0: always sent (by rule, not by score)</b>"
        if layer_selected:
            return f"<b>{_sent_reason(details)}: the whole context KV</b>"
        return "sink only: this layer keeps just the context's first token"

    fig = go.Figure()
    for key, field, name, explain in figure_series(result):
        values = [None if r.get(field) is None else float(r[field]) for r in records]
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


def parse_layers(text: str) -> tuple[int, ...] | None:
    """ "7, 0,3" -> (0, 3, 7); empty -> None."""
    if not text or not text.strip():
        return None
    try:
        return tuple(sorted({int(part) for part in text.replace(" ", ",").split(",") if part.strip()}))
    except ValueError as error:
        raise ValueError(f"Explicit layers must be numbers separated by commas, e.g. 0,3,7 (got {text!r}).") from error


def apply_options(request: HandoffRequest, values: dict) -> HandoffRequest:
    """The page's and the CLI's options into the request's ``KVCommOptions`` (the others kept);
    explicit layers override the strategy."""
    layers = parse_layers(values["layers"])
    return configure(
        request,
        ratio=values["ratio"],
        strategy="explicit" if layers else values["strategy"],
        alpha=values["alpha"],
        sigma=values["sigma"],
        layers=layers,
        seed=request.generation.seed,
        calibration=values.get("calibration") or "builtin",
        calibration_sample=None,
    )


def variant_label(values: dict) -> str:
    """Bench rows: "kvcomm@0.3" (the paper's score), "kvcomm-random@0.5" ..."""
    prefix = "kvcomm" if values["strategy"] == "kvcomm" else f"kvcomm-{values['strategy']}"
    return f"{prefix}@{values['ratio']:g}"


def receiver_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult):
    """The sender's context KV spliced into the layers the run selected, then the query."""
    segments = build_segments(pair.receiver.tokenizer, request.query, request.context)
    sender_state = kv.KVState()
    prefill(pair.kvcomm_sender, sender_state, segments.context_ids, need_logits=False)
    selected = set(result.details.get("selected_layers", []))
    state = kv.splice_prefix(sender_state.cache, pair.receiver.facts.num_layers, selected)
    return read_prompt(pair.receiver, segments.query_ids, state)


def control_receiver_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult):
    """The control's prompt: the unrelated sentence's KV in the layers its run selected, then the query."""
    return receiver_prompt(pair, dataclasses.replace(request, context=UNRELATED_CONTEXT), result)


def notes(result: dict) -> list[str]:
    """Under the answer: the layers sent (layer 0 by rule), the calibration sample in full and how
    well its importance ranks this query's."""
    details = result.get("details", {}) or {}
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


SELECTABLE_STRATEGIES = tuple(s for s in STRATEGIES if s != "explicit")  # explicit: give layers
# page and ``run``: the built-in sample or this query; ``bench`` calibrates on the task's first sample
# unless --calibration is given (kvviz.studies.bench.run)
CALIBRATION_CHOICES = ("builtin", "query")

HANDOFFS = (
    Handoff(
        name=NAME,
        title="KVComm: selected layers",
        label="KVComm",
        color=COLOR,
        summary="the receiver attends to a same-model sender's context KV in selected layers",
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
        run=run,
        control=CONTROL,
        needs=("a private context", "a sender with the receiver's architecture, KV shape and tokenizer"),
        applicable=all_of(
            needs_context("KVComm shares the KV of a private context; this request has none."),
            lambda pair, request: applicability(pair),
        ),
        options=(
            Option("ratio", "KVComm ratio r (share of layers sent)", 0.5, minimum=0.0, maximum=1.0, step=0.05,
                   flag="--ratio", sweep_flag="--ratios", sweep_default="0.3,0.5,0.7"),
            Option("strategy", "KVComm layer selection", "kvcomm", kind="choice", choices=SELECTABLE_STRATEGIES,
                   flag="--strategy", sweep_flag="--strategies", sweep_default="kvcomm"),
            Option("alpha", "alpha (weight of attention vs prior)", 1.0, minimum=0.0, maximum=1.0, step=0.05,
                   flag="--alpha", auto="The reference code's alpha, 1.0"),
            Option("sigma", "sigma (width of the Gaussian prior, layers)", 10.0, minimum=0.5, maximum=30.0, step=0.5,
                   flag="--sigma"),
            Option("layers", "KVComm explicit layers (e.g. 0,3,7; overrides the strategy)", "", kind="text",
                   flag="--layers"),
            Option("calibration", "KVComm calibration (whose attention chooses the layers: the builtin sample or this query)", "builtin", kind="choice",
                   choices=CALIBRATION_CHOICES, flag="--calibration"),
        ),
        apply_options=apply_options,
        task_calibration=TaskCalibration(calibrate_on_sample, unless_option="calibration"),
        variant_label=variant_label,
        receiver_prompt=receiver_prompt,
        figure=layers_figure,
        notes=notes,
        stage_labels={
            "sharer_prefill": "the sender (a copy of the receiver's model, not the sharer) reads the context",
            "transfer": "choose layers and splice the KV in memory (no network time)",
        },
        page=40,
        page_default=True,
        walkthrough=(
            "KVComm (green) sends no words. Its sender, a second copy of the receiver's model (the sharer cannot "
            "be used: the shapes must match), reads the note and puts its internal memory of it (the *KV cache*) "
            "into some of the receiver's layers; the others keep only the note's first token, and layer 0 is "
            "always sent. The plot **KVComm: which layers get the context** shows, per layer, the attention "
            "importance measured on the calibration sample (which chose the layers) next to the importance "
            "measured on *this* question after it was answered, with their rank correlation, so you can see "
            "whether one calibration sample speaks for your question. Triangles mark the layers sent, a star "
            "layer 0 (sent by rule), a dash the layers that kept only the sink. We loaded **{preset}**: {lesson} "
            "In *Settings* change the ratio, or calibrate on this query instead of the built-in sample."
        ),
        walkthrough_preset="fuji",
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
    ),
    Handoff(
        name=CONTROL,
        title="KVComm control: another context",
        label="KVComm control",
        color="#44AA99",  # teal, beside KVComm's green
        summary="KVComm's splice with the sender reading an unrelated sentence: what the receiver answers without the note",
        explanation=(
            "The same KVComm (same options, so with the built-in calibration the same layers are sent), but the "
            f"sender reads a fixed unrelated sentence (*{UNRELATED_CONTEXT}*) instead of the private context. "
            "What KVComm answers and this does not came through the context's KV; what both answer, the splice "
            "alone (or the question) gave. Tick it beside KVComm: the What crossed tab then colours KVComm's answer "
            "tokens by how much likelier the real context made each one."
        ),
        run=run_control,
        needs=("a private context", "a sender with the receiver's architecture, KV shape and tokenizer"),
        applicable=all_of(
            needs_context("The KVComm control needs a request with a private context."),
            lambda pair, request: applicability(pair),
        ),
        receiver_prompt=control_receiver_prompt,
        notes=notes,
        page=41,
    ),
)
