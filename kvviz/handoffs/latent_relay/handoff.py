"""Latent relay: a same-shape sender reads the context, "thinks" N latent steps, and its whole KV
cache (context + latent steps) becomes the receiver's prefix.

LatentMAS (Gen-Verse/LatentMAS; REFERENCE §7), reduced to one sender and one receiver:
1. The sender (the pair's ``same_shape_sender``: the receiver's architecture, KV shape and tokenizer)
   prefills the receiver's context segment, exactly as KVComm's sender does.
2. Latent steps: the final hidden state at the last position (after the final norm, what
   ``hidden_states[-1]`` is in transformers) goes through the *alignment map* and is fed back to
   the sender as its next input embedding; N steps add N positions to its cache and write no token.
3. The receiver reads its question on top of the sender's cache of context + latent steps in every
   layer (KVComm's splice with every layer sent); its positions continue after |C| + N.
   With N = 0 this is KVComm with every layer, which is Skyline (a test). The reference code's last
   agent drops the shared cache when ``latent_steps=0`` (its issues #13, #37); here it never does.

The alignment map (LatentMAS's ``_build_latent_realign_matrix``): the matrix M that maps an output
state to the input-embedding space, least squares over the vocabulary,
``M = (W_out^T W_out + 1e-5 I)^-1 W_out^T W_in`` (W_out: the output head [vocab, d], W_in: the
input embeddings); a latent vector is ``h M`` rescaled to the mean norm of the input embeddings.
Computed once per model and cached. One departure, for models that scale their embeddings (Gemma
multiplies them by sqrt(d) inside the embedding layer, and ``inputs_embeds`` skip that layer):
W_in is taken at the scale the embedding layer outputs, as CIPHER does, so a latent vector has the
size of a real input. For Qwen and Llama the scale is 1 and nothing changes.

On a model with tied embeddings (W_out = W_in: Gemma 3, SmolLM2, Qwen3-0.6B) M is the identity up
to the 1e-5 ridge (times the embedding scale), so the identity control is the method itself there;
``details["alignment"]["distance_from_identity"]`` says how far M is from a scaled identity.

Controls (option ``control``; the ones its users asked for, after spraldev/LatentMAS-interp):
  off           the method
  no_transfer   the sender reads and thinks as usual, nothing reaches the receiver: the receiver
                alone, answer for answer (a test), at the sender's cost
  identity_map  M = I (still rescaled to the embedding norm: the reference code's path when
                ``latent_space_realign`` is off)
  random_map    a random map with the computed map's singular values: Q1 diag(s) Q2^T with Haar
                random orthogonal Q1, Q2 (seeded by the generation seed), rescaled likewise

Per-step records (``details["steps"]``): the latent vector's nearest tokens by cosine over the input
embeddings (what the sender "thought" read as the tokens it lies nearest to, not words it wrote),
the norm of ``h M`` before rescaling, and the cosine with the previous latent vector.

Per-layer records (``HandoffResult.layers``, one per receiver layer), measured after the answer in
an instrumentation pass (kvviz.runtime.attention's capture; never timed in the stages):
  layer                 receiver layer index
  attention_on_latent   mean over heads and question tokens of the attention mass on the N latent
                        positions
  attention_on_context  the same on the context keys (the first one, the attention sink, excluded)
Both are None under ``no_transfer`` (the receiver saw nothing).
"""

from __future__ import annotations

import time

from kvviz.core.prompts import build_segments
from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.handoffs.common import HandoffIO, handoff_result, needs_same_shape_sender, read_prompt
from kvviz.handoffs.latent_relay.thinking import (
    CONTROLS,
    alignment_map,
    layer_records,
    receiver_state,
    shown,
    think,
)
from kvviz.handoffs.registry import Handoff, Option, ReceiverPrompt, all_of, needs_context, option_values
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import generate, prefill
from kvviz.runtime.measure import StageTimer, answer_flops, decode_flops, forward_flops
from kvviz.runtime.models import LoadedPair

NAME = "latent_relay"
COLOR = "#882255"  # wine
MAX_STEPS = 16
OPTIONS = (
    Option("steps", "Latent relay: latent steps N (vectors the sender thinks after the context)", 4, kind="int",
           minimum=0, maximum=MAX_STEPS, sweep_flag="--latent-steps", sweep_default="2,4,8"),
    Option("control", "Latent relay control (off: the method; no_transfer: the receiver gets nothing; identity_map "
           "or random_map: another alignment map)", "off", kind="choice", choices=CONTROLS,
           sweep_flag="--latent-controls", sweep_default="off"),
)
CONTEXT_REASON = "The latent relay hands over the sender's KV of a private context; this request has none."


# --- the alignment map ------------------------------------------------------------------------


# --- thinking ---------------------------------------------------------------------------------


# --- the handoff ------------------------------------------------------------------------------


SAME_SHAPE_SENDER = needs_same_shape_sender(
    "The latent relay, which hands the receiver a cache of the receiver's own shape,", "the question continues the sender's positions"
)


def run(pair: LoadedPair, request: HandoffRequest, io: HandoffIO) -> HandoffResult:
    values = option_values(request, NAME, OPTIONS)
    steps, control = values["steps"], values["control"]
    sender, receiver = pair.same_shape_sender, pair.receiver
    segments = build_segments(receiver.tokenizer, request.query, request.context)
    # one-off per model (cached), before the question is asked: not timed here
    alignment = alignment_map(sender, control, request.generation.seed)
    timer = StageTimer()
    thought = think(sender, segments.context_ids, steps, alignment, timer)
    transferred = control != "no_transfer"
    with timer.stage("transfer"):
        state = receiver_state(pair, thought) if transferred else kv.KVState()
        sent_bytes = kv.kv_bytes(state.cache) if transferred else 0
    prompt_ids = segments.query_ids if transferred else build_segments(receiver.tokenizer, request.query).input_ids
    if transferred:
        # what crossed: the sender's cache of the context at positions 0..|C|-1 (its latent steps
        # follow; they have no tokens to show, so the view counts them with the receiver's own keys)
        io.send(f"context tokens (the sender's KV cache; its {steps} latent steps after them are not shown)",
                          range(len(segments.context_ids)), segments.context_ids)
    with timer.stage("receiver_prefill"):
        first, _ = prefill(receiver, state, prompt_ids)
    with timer.stage("receiver_decode"):
        output = generate(receiver, state, first, request.generation, on_token=io.on_token, timer=timer)
    started = time.perf_counter()
    layers = layer_records(pair, thought if transferred else None, segments.query_ids)
    instrumentation_seconds = time.perf_counter() - started

    context_length, prefix_length = thought.context_length, thought.context_length + steps
    receiver_past = prefix_length if transferred else 0
    prompt_flops, receiver_flops = answer_flops(receiver.facts, len(prompt_ids), len(output.token_ids), receiver_past)
    width = sender.facts.hidden_size
    sender_flops = (forward_flops(sender.facts, context_length, 0, 0) + decode_flops(sender.facts, steps, context_length)
                    + 2.0 * width * width * steps)  # the alignment map per step
    nearest = " / ".join(shown(step["nearest"][0]["token"]) for step in thought.steps)
    latent_seen = f"[{steps} latent vectors, read as nearest tokens: {nearest}]" if steps else "[no latent steps]"
    return handoff_result(
        NAME, pair, output, timer,
        seen={
            "sender": segments.context_text,
            "latent": latent_seen,
            "receiver": (f"[the sender's KV of the context and {steps} latent steps] " + segments.query_text
                         if transferred else build_segments(receiver.tokenizer, request.query).text),
        },
        communication="kv" if transferred else "none", bytes_sent=sent_bytes,
        flops={"sharer": sender_flops, "receiver": receiver_flops},
        flops_to_first_token={"sharer": sender_flops, "receiver": prompt_flops},  # the sender thinks first
        tokens={"context": context_length, "vectors": steps, "receiver_prompt": len(prompt_ids)},
        layers=layers,
        details={
            "steps": thought.steps,
            "latent_steps": steps,
            "control": control,
            "seconds_per_latent_step": timer.seconds["sharer_decode"] / steps if steps else None,
            "alignment": {
                "map": alignment.kind,
                "seconds": alignment.seconds,
                "distance_from_identity": alignment.distance_from_identity,
                "target_norm": alignment.target_norm,
            },
            "instrumentation_seconds": instrumentation_seconds,
            "sender_model": sender.name,
        },
    )


# --- descriptor -------------------------------------------------------------------------------


def receiver_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult) -> ReceiverPrompt:
    """The receiver after its question on the sender's cache (the sender thinks again: deterministic)."""
    values = option_values(request, NAME, OPTIONS)
    if values["control"] == "no_transfer":
        return read_prompt(pair.receiver, build_segments(pair.receiver.tokenizer, request.query).input_ids)
    segments = build_segments(pair.receiver.tokenizer, request.query, request.context)
    alignment = alignment_map(pair.same_shape_sender, values["control"], request.generation.seed)
    thought = think(pair.same_shape_sender, segments.context_ids, values["steps"], alignment)
    return read_prompt(pair.receiver, segments.query_ids, receiver_state(pair, thought))


def latent_steps(request: HandoffRequest) -> int:
    """The positions the sender adds before the receiver answers (each about one decode step): the
    prompt budget and ZeroGPU's duration count them (``Handoff.message_tokens``)."""
    return option_values(request, NAME, OPTIONS)["steps"]


def variant_label(values: dict) -> str:
    """Bench rows: "latent_relay@4" (the method), "latent_relay-random_map@4" ..."""
    prefix = NAME if values["control"] == "off" else f"{NAME}-{values['control']}"
    return f"{prefix}@{values['steps']}"


HANDOFFS = (
    Handoff(
        name=NAME,
        title="Latent relay: context + latent thoughts (LatentMAS)",
        label="Latent relay",
        color=COLOR,
        summary="a same-model sender reads the context, thinks N latent steps, and hands over its whole KV cache",
        run=run,
        control="receiver",
        needs=("a private context", "a sender with the receiver's architecture, KV shape and tokenizer"),
        applicable=all_of(needs_context(CONTEXT_REASON), SAME_SHAPE_SENDER),
        options=OPTIONS,
        message_tokens=latent_steps,
        variant_label=variant_label,
        receiver_prompt=receiver_prompt,
    ),
)
