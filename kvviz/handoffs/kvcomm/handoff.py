"""KVComm's run and its descriptors: the sender reads the context, the layers are chosen
(``kvviz.handoffs.kvcomm.layers``), the sender's KV is spliced into them, the receiver answers, and
this query's importance is measured after the answer. The protocol, the per-layer records and the
``details`` keys: the package's docstring (``kvviz.handoffs.kvcomm``)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from kvviz.core.prompts import build_segments
from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.handoffs.common import (
    HandoffIO,
    content_free_note,
    handoff_result,
    needs_same_shape_sender,
    read_prompt,
)
from kvviz.handoffs.kvcomm.layers import (
    attention_importance,
    calibrate,
    calibration_texts,
    forced_layers,
    layer_records,
    layer_scores,
    resolve_alpha,
    select_layers,
    spearman,
)
from kvviz.handoffs.kvcomm.options import NAME, OPTIONS, apply_options, calibrate_on_sample, options_of, variant_label
from kvviz.handoffs.registry import Handoff, TaskCalibration, all_of, needs_context
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import generate, prefill, read_prompt_once
from kvviz.runtime.measure import StageTimer, decode_flops, forward_flops
from kvviz.runtime.models import LoadedPair

SAME_SHAPE_SENDER = needs_same_shape_sender("KVComm", "positions and the sink must line up")


# --- the handoff ------------------------------------------------------------------------------


@dataclass
class Sent:
    """What one KVComm run chose and sent, for its result."""

    selected: list[int]
    scores: dict
    calibration: dict | None  # the importance that chose the layers, with where it was measured
    query_importance: dict  # this query's own importance (instrumentation, or the calibration)
    bytes: int


def run(pair: LoadedPair, request: HandoffRequest, io: HandoffIO) -> HandoffResult:
    options = options_of(request)
    receiver = pair.receiver
    alpha, alpha_source = resolve_alpha(options, receiver.facts.model_type)
    segments = build_segments(receiver.tokenizer, request.query, request.context)
    timer = StageTimer()
    output, sent = send_and_answer(pair, request, options, alpha, segments, timer, io)
    on_this_query = sent.calibration is not None and sent.calibration["source"] == "query"
    prompt_flops, receiver_flops, sender_flops = kvcomm_flops(pair, segments, sent.selected, len(output.token_ids), on_this_query)
    return handoff_result(
        NAME, pair, output, timer,
        seen={"sender": segments.context_text, "receiver": segments.query_text},
        communication="kv", bytes_sent=sent.bytes,
        flops={"sharer": sender_flops, "receiver": receiver_flops},
        flops_to_first_token={"sharer": sender_flops, "receiver": prompt_flops},
        tokens={"context": len(segments.context_ids), "receiver_prompt": len(segments.query_ids)},
        layers=layer_records(
            receiver.facts.num_layers, sent.selected, forced_layers(options, sent.selected),
            sent.calibration["attention"] if sent.calibration else None, sent.scores, sent.query_importance["attention"],
        ),
        details=run_details(pair, options, alpha, alpha_source, sent),
    )


CONTROL = "kvcomm_control"


def run_control(pair: LoadedPair, request: HandoffRequest, io: HandoffIO) -> HandoffResult:
    """KVComm with the same options (so, calibrated on the built-in sample, the same layers) whose
    sender reads a note of the note's length that names nothing (``content_free_note``) instead of
    the private context: what the receiver answers when the splice carries nothing about the
    question."""
    note = content_free_note(request.context)
    result = run(pair, dataclasses.replace(request, context=note), io)
    return dataclasses.replace(result, handoff=CONTROL, details={**result.details, "control_context": note})


def send_and_answer(pair, request, options, alpha, segments, timer: StageTimer, io: HandoffIO):
    """The timed handoff: the sender reads the context, the layers are chosen (on this query's own
    attention with calibration "query"), the KV is spliced in, the receiver answers. Then, outside
    every stage, this query's importance is measured (instrumentation). Returns (decode output,
    what was sent)."""
    sender, receiver = pair.same_shape_sender, pair.receiver
    num_layers = receiver.facts.num_layers
    uses_attention = alpha is not None and alpha > 0
    calibration = None
    if uses_attention and options.calibration != "query":
        # one-off per pair and sample (cached), before the question is asked: not timed here
        calibration = {**calibrate(pair, *calibration_texts(options)), "source": options.calibration}
    # the sender reads the context (once per run: AC's sender reads the same)
    sender_state = read_prompt_once(sender, segments.context_ids, timer, "sharer_prefill", io.prompts).state
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
    io.send("context tokens (the sender's KV cache, in the layers KVComm sent; the first token, "
                      "the attention sink, in every layer)", range(len(segments.context_ids)), segments.context_ids,
                      layers=selected)
    with timer.stage("receiver_prefill"):
        first, _ = prefill(receiver, state, segments.query_ids)
    with timer.stage("receiver_decode"):
        output = generate(receiver, state, first, request.generation, on_token=io.on_token, timer=timer)
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
    return prompt, prompt + answer, forward_flops(pair.same_shape_sender.facts, context_length, 0, 0)


def run_details(pair, options, alpha, alpha_source: str, sent: Sent) -> dict:
    """``HandoffResult.details`` (the keys in the module docstring, but ``stopped_by``, which
    ``handoff_result`` adds)."""
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
        "sender_model": pair.same_shape_sender.name,
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


def receiver_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult):
    """The sender's context KV spliced into the layers the run selected, then the query."""
    segments = build_segments(pair.receiver.tokenizer, request.query, request.context)
    sender_state = kv.KVState()
    prefill(pair.same_shape_sender, sender_state, segments.context_ids, need_logits=False)
    selected = set(result.details.get("selected_layers", []))
    state = kv.splice_prefix(sender_state.cache, pair.receiver.facts.num_layers, selected)
    return read_prompt(pair.receiver, segments.query_ids, state)


def control_receiver_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult):
    """The control's prompt: the unrelated sentence's KV in the layers its run selected, then the query."""
    return receiver_prompt(pair, dataclasses.replace(request, context=content_free_note(request.context)), result)


HANDOFFS = (
    Handoff(
        name=NAME,
        title="KVComm: selected layers",
        label="KVComm",
        color=COLOR,
        summary="the receiver attends to a same-model sender's context KV in selected layers",
        run=run,
        control=CONTROL,
        needs=("a private context", "a sender with the receiver's architecture, KV shape and tokenizer"),
        applicable=all_of(
            needs_context("KVComm shares the KV of a private context; this request has none."),
            SAME_SHAPE_SENDER,
        ),
        options=OPTIONS,
        apply_options=apply_options,
        task_calibration=TaskCalibration(calibrate_on_sample, unless_option="calibration"),
        variant_label=variant_label,
        receiver_prompt=receiver_prompt,
        default=True,
    ),
    Handoff(
        name=CONTROL,
        title="KVComm control: another context",
        label="KVComm control",
        color="#44AA99",  # teal, beside KVComm's green
        summary="KVComm's splice with the sender reading an unrelated sentence: what the receiver answers without the note",
        run=run_control,
        needs=("a private context", "a sender with the receiver's architecture, KV shape and tokenizer"),
        applicable=all_of(
            needs_context("The KVComm control needs a request with a private context."),
            SAME_SHAPE_SENDER,
        ),
        receiver_prompt=control_receiver_prompt,
    ),
)
