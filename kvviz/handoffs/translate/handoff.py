"""C2C translation: the sharer's KV of a private context, translated into the receiver's KV space.

The sharer reads the context; a trained per-layer translator (``kvviz.handoffs.translate.translator``) maps the
sharer's keys and values at every context token into the receiver's; the receiver attends to them
as a prefix in front of its question (its own one-token sink and context-free ``<bos>Context:``
first, as KVComm keeps a sink) and answers. The receiver never reads the context: no text of it
reaches the receiver, only the translated KV.

``c2c_translate_control`` runs the same translator on a note of the note's length that names nothing
(``kvviz.handoffs.common.content_free_note``):
whatever it answers comes from the receiver and the question,
not from this request's context.

Translators: the ``translator`` option (a folder; ``--translator DIR``) or the pair's shipped one
in ``assets/translators/`` (found by the pair's fingerprints), with its held-out numbers in
``measured.json`` beside it. Without one the result is "not applicable" and says why.
"""

from __future__ import annotations

import torch

from kvviz.core.prompts import build_segments
from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.handoffs.common import HandoffIO, content_free_note, handoff_result
from kvviz.handoffs.registry import Handoff, NotApplicable, all_of, needs_context
from kvviz.handoffs.translate import align as tr_align
from kvviz.handoffs.translate import prefix as tr_prefix
from kvviz.handoffs.translate import translator as tr
from kvviz.handoffs.translate.locate import CONTROL, NAME, OPTIONS, get_translator, locate, measured_numbers, translator_found
from kvviz.runtime.checkpoints import checkpoint_label
from kvviz.runtime.decode import generate, prefill
from kvviz.runtime.measure import StageTimer, decode_flops, forward_flops
from kvviz.runtime.models import LoadedPair


def run(pair: LoadedPair, request: HandoffRequest, io: HandoffIO, control: bool = False) -> HandoffResult:
    name = CONTROL if control else NAME
    folder, reason = locate(pair, request)
    if folder is None:
        raise NotApplicable(reason)
    try:
        translator = get_translator(folder, pair)
    except tr.TranslatorError as error:
        raise NotApplicable(str(error)) from error
    if translator.side:
        raise NotApplicable(SIDE_REFUSAL.format(folder=folder))
    receiver, sharer = pair.receiver, pair.sharer
    context = content_free_note(request.context) if control else request.context
    timer = StageTimer()
    alignment = tr_align.align_context(receiver.tokenizer, sharer.tokenizer, context, translator.config.sharer_start)
    with torch.no_grad():
        with timer.stage("sharer_prefill"):
            sharer_kv = tr_align.read_kv(sharer, [alignment.sharer_ids])
        with timer.stage("transfer"):
            features = tr_align.features(sharer_kv, alignment, translator.config.sharer_layers, translator.config.neighbours)
            keys, values, weights = translator(features.to(translator.up.device))
            prefix = tr_prefix.build_prefix(receiver, alignment, keys, values, weights, translator.open_gates().float().tolist())
    # what crossed: the translated context keys (shown with the receiver's tokens of the context,
    # which the receiver never read), in the layers whose gate is open
    io.send("context tokens (the sharer's KV cache translated into the receiver's; shown as the receiver's "
                      "tokens of the context, which it never read)",
                      range(alignment.own_count, len(alignment.receiver_ids)), alignment.receiver_ids[alignment.own_count:],
                      layers=[layer for layer, gate in enumerate(prefix.gates) if gate > 0])
    segments = build_segments(receiver.tokenizer, request.query)
    state = prefix.state
    with timer.stage("receiver_prefill"):
        first, _ = prefill(receiver, state, segments.query_ids)
    with timer.stage("receiver_decode"):
        output = generate(receiver, state, first, request.generation, on_token=io.on_token, timer=timer)
    flops, before_answer = translation_flops(pair, translator, alignment, prefix, len(segments.query_ids), len(output.token_ids))
    return handoff_result(
        name, pair, output, timer,
        seen={"sharer": sharer.tokenizer.decode(alignment.sharer_ids), "receiver": segments.text},
        communication="kv", bytes_sent=tr_prefix.read_bytes(translator.config, len(alignment.sharer_ids), sharer.dtype),
        flops=flops, flops_to_first_token=before_answer,
        tokens={"context": len(alignment.sharer_ids), "translated": alignment.translated_count,
                "receiver_prompt": len(segments.query_ids)},
        layers=layer_records(translator, prefix),
        details=run_details(pair, translator, folder, alignment, prefix, context if control else None),
    )


def translation_flops(pair, translator, alignment, prefix, query_length: int, generated: int) -> tuple[dict, dict]:
    """(FLOPs per model, the same before the first answer token): a closed layer reads only its sink."""
    receiver = pair.receiver
    prefix_lengths = [len(alignment.receiver_ids) if gate > 0 else 1 for gate in prefix.gates]
    prompt = forward_flops(receiver.facts, query_length, prefix_lengths, 1)
    before = {"sharer": forward_flops(pair.sharer.facts, len(alignment.sharer_ids), 0, 0), "receiver": prompt,
              "translator": 2.0 * translator.num_parameters * alignment.translated_count}
    decode = decode_flops(receiver.facts, generated, [n + query_length for n in prefix_lengths])
    return dict(before, receiver=prompt + decode), before


def layer_records(translator, prefix) -> list[dict]:
    """One record per receiver layer: its gate (1: it attends to the translated context) and the
    translated tokens' weights."""
    return [
        {"layer": layer, "gate": gate, "open": gate > 0, "gate_logit": float(translator.gate_logits[layer].detach()),
         "weight_mean": (sum(w) / len(w)) if w else None, "weights": w}
        for layer, (gate, w) in enumerate(zip(prefix.gates, prefix.weights))
    ]


def run_details(pair, translator, folder, alignment, prefix, control_context: str | None) -> dict:
    """``HandoffResult.details`` of a run (but ``stopped_by``)."""
    receiver, sharer = pair.receiver, pair.sharer
    return {
        "translator_path": checkpoint_label(folder),
        "control": control_context is not None,
        "control_context": control_context,
        "open_gates": sum(g > 0 for g in prefix.gates),
        "layers": len(prefix.gates),
        "applied_gates": [int(g > 0) for g in prefix.gates],
        "translated_bytes": sum(len(w) for w in prefix.weights) * 2 * translator.config.kv_width * receiver.dtype.itemsize,
        "sharer_kv_bytes_all_layers": tr_prefix.kv_bytes(sharer.facts, len(alignment.sharer_ids), sharer.dtype),
        "sharer_layers_read": list(translator.config.sharer_layers),
        "translated_tokens": [receiver.tokenizer.decode([i]) for i in alignment.receiver_ids[alignment.own_count:]],
        "parameters": translator.num_parameters,
        "trained": dict(translator.config.training),
        "measured": measured_numbers(folder),
    }


def run_control(pair: LoadedPair, request: HandoffRequest, io: HandoffIO) -> HandoffResult:
    return run(pair, request, io, control=True)


SIDE_REFUSAL = ("The translator at {folder} is read through a gated side branch (attach = side), which this handoff "
                "does not run: the batched decode step has no side branch (eval-translator and train-translator run it).")
NO_LIKELIHOOD = "not computed: {name} builds the receiver's cache from translated KV, which the bench does not rebuild"
NEEDS = ("a private context", "a trained KV translator for the pair")

HANDOFFS = (
    Handoff(
        name=NAME,
        title="C2C translation: the context's KV",
        label="C2C translate",
        color="#AA4499",  # magenta (Tol)
        summary="a trained translator maps the sharer's KV of the context into the receiver's",
        run=run,
        control=CONTROL,
        needs=NEEDS,
        applicable=all_of(needs_context("The translation carries a private context; this request has none."), translator_found),
        options=OPTIONS,
        no_receiver_prompt=NO_LIKELIHOOD.format(name=NAME),
    ),
    Handoff(
        name=CONTROL,
        title="C2C translation control: another context",
        label="Translate control",
        color="#CC6677",
        summary="the same translator fed an unrelated context: what the receiver answers without this note",
        run=run_control,
        needs=NEEDS,
        applicable=all_of(needs_context("The translation control needs a request with a private context."), translator_found),
        no_receiver_prompt=NO_LIKELIHOOD.format(name=CONTROL),
    ),
)
