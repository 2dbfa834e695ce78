"""KV-cache steering: one edit of the receiver's own cache, with vectors built from contrastive
pairs. No sharer runs and nothing is sent: it asks whether a change in an answer needs
communication at all, or only an edit of the cache.

KV cache steering (Belitsky et al. 2025, arXiv 2507.08799; code mirror nagyist/cache-steering):
1. Contrastive pairs: for each demo question, a *positive* prompt whose earlier turns (the other
   demos) show the wanted behaviour and a *negative* one whose earlier turns show the unwanted one,
   both ending with the question and the answer prompt (the reference code's few-shot contrastive
   set, ``ContrastiveDatasetConstructor``). The option ``pairs`` names the set: built-in pairs for
   "answer briefly" and "use the context", or the user's own (``my_pairs``).
2. Steering vectors, per layer: the mean over pairs of (positive - negative) cached keys and values
   at one token position, ``[kv heads, head dim]`` each (``extract_steering_kv``, mean
   aggregation). Keys are the cached ones, after RoPE, as in the reference code.
3. The edit, once: the receiver prefills its prompt (the question alone, as the receiver-alone
   baseline) except its last token; ``c_k * K_l`` and ``c_v * V_l`` are added to the cached key and
   value of the last cached position in every layer from ``first_layer`` on (the reference steers
   layer 1 and above, ``how="last"``); then the prompt's last token is read and the answer decoded
   with the shared loop. Answer tokens are never edited.

Token positions: the reference edits the last position in the cache before the prompt's final
token is read. Without its optional appended token (``append_special_token``) that position is the
prompt's second to last token, so the vectors are extracted there too (its
``extraction_method="penultimate_token"``): extraction and edit sit on the same token of the answer
prompt ("assistant" of a chat template's "<|im_start|>assistant\\n", "Answer" of a base model's
"\\nAnswer:"). So with zero coefficients the run is the receiver alone, token for token (a test).

Coefficients: ``keys`` (c_k) defaults to 0.0 and ``values`` (c_v) to 4.0: every configuration of
the reference's best_args.yaml steers values only, with c_v from 1 to 10 (4 and 6 most often for
SmolLM2-360M and Qwen2-0.5B).

The built-in pairs were written for this project (short, public-knowledge questions). The steering
vectors are built once per receiver and pair set and cached (``details["vectors"]``: seconds,
cached); that one-off is not part of the run's stages, as KVComm's calibration is not.

Per-layer records (``HandoffResult.layers``, one per receiver layer):
  layer                     receiver layer index
  steered                   whether this layer's cache was edited
  key_edit_norm             || c_k K_l || over heads (0 where not steered or c_k = 0)
  value_edit_norm           || c_v V_l || over heads
  key_norm, value_norm      the norm of the cached key / value at the edited position before the edit
``details``: the receiver alone's answer (instrumentation: run after the answer, never timed),
whether the answer changed, and the first answer token's top probabilities with and without the
edit, and their KL divergence.
"""

from __future__ import annotations

import time

import torch

from kvviz.core.prompts import build_segments
from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.handoffs.common import HandoffIO, handoff_result
from kvviz.handoffs.kv_steering.vectors import (
    PAIR_SETS,
    _top_probabilities,
    demos_of,
    read_steered,
    steering_vectors,
)
from kvviz.handoffs.registry import Handoff, Option, ReceiverPrompt, option_values
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import generate, prefill
from kvviz.runtime.measure import StageTimer, answer_flops
from kvviz.runtime.models import LoadedPair

NAME = "kv_steering"
COLOR = "#7A7A1F"  # olive
TOP_TOKENS = 5  # first-token probabilities shown with and without the edit
OPTIONS = (
    Option("pairs", "KV steering: contrastive pairs (built-in answer_briefly or use_the_context, or my_pairs below)",
           "answer_briefly", kind="choice", choices=PAIR_SETS, sweep_flag="--steering-pairs",
           sweep_default="answer_briefly,use_the_context"),
    Option("my_pairs", "KV steering: your pairs, one per line: question | wanted answer | unwanted answer "
           "(or context | question | wanted | unwanted)", "", kind="text"),
    Option("values", "KV steering: value coefficient c_v", 4.0, minimum=0.0, maximum=20.0, step=0.5,
           sweep_flag="--steering-values", sweep_default="4"),
    Option("keys", "KV steering: key coefficient c_k (the paper's configurations use 0)", 0.0, minimum=0.0,
           maximum=5.0, step=0.1),
    Option("first_layer", "KV steering: first steered layer (the reference steers layer 1 and above)", 1, kind="int",
           minimum=0),
)


# --- the steering vectors ---------------------------------------------------------------------


# --- the edit ---------------------------------------------------------------------------------


# --- the handoff ------------------------------------------------------------------------------


def requirements(pair: LoadedPair, request: HandoffRequest) -> str | None:
    """The first steered layer must exist, and "my_pairs" needs readable pairs."""
    values = option_values(request, NAME, OPTIONS)
    num_layers = pair.receiver.facts.num_layers
    if values["first_layer"] >= num_layers:
        return f"KV steering's first layer {values['first_layer']} does not exist: {pair.receiver.name} has layers 0..{num_layers - 1}."
    try:
        demos_of(values)
    except ValueError as error:
        return str(error)
    return None


def run(pair: LoadedPair, request: HandoffRequest, io: HandoffIO) -> HandoffResult:
    values = option_values(request, NAME, OPTIONS)
    receiver = pair.receiver
    # one-off per receiver and pair set (cached), before the question is asked: not timed here
    vectors, cached = steering_vectors(receiver, demos_of(values))
    segments = build_segments(receiver.tokenizer, request.query)
    prompt_ids = segments.input_ids
    timer = StageTimer()
    with timer.stage("receiver_prefill"):
        prompt, layers = read_steered(receiver, prompt_ids, vectors, values)
    steered_probabilities, steered_top = _top_probabilities(receiver, prompt.next_token, TOP_TOKENS)
    with timer.stage("receiver_decode"):
        output = generate(receiver, prompt.state, prompt.next_token, request.generation, on_token=io.on_token, timer=timer)

    # instrumentation, after the answer and outside every stage: the receiver alone, unedited
    started = time.perf_counter()
    alone_state = kv.KVState()
    alone_first, _ = prefill(receiver, alone_state, prompt_ids)
    alone_probabilities, alone_top = _top_probabilities(receiver, alone_first, TOP_TOKENS)
    alone = generate(receiver, alone_state, alone_first, request.generation)
    kl = float(torch.sum(steered_probabilities * (torch.log(steered_probabilities.clamp_min(1e-30))
                                                  - torch.log(alone_probabilities.clamp_min(1e-30)))))
    instrumentation_seconds = time.perf_counter() - started

    prompt_length = len(prompt_ids)
    prompt_flops, receiver_flops = answer_flops(receiver.facts, prompt_length, len(output.token_ids))
    steered = [record["layer"] for record in layers if record["steered"]]
    return handoff_result(
        NAME, pair, output, timer,
        seen={"receiver": segments.text,
              "steering": f"its cache at the token before the last edited once in layers {steered[0]}-{steered[-1]}"
              if steered else "no layer edited"},
        flops={"receiver": receiver_flops},
        flops_to_first_token={"receiver": prompt_flops},
        tokens={"receiver_prompt": prompt_length},
        layers=layers,
        details={
            "pairs": values["pairs"],
            "c_keys": values["keys"],
            "c_values": values["values"],
            "first_layer": values["first_layer"],
            "steered_layers": steered,
            "vectors": {"pairs": vectors.pairs, "seconds": vectors.seconds, "cached": cached},
            "receiver_alone_answer": alone.text,
            "answer_changed": alone.token_ids != output.token_ids,
            "first_token_top": steered_top,
            "first_token_top_alone": alone_top,
            "first_token_kl": kl,
            "instrumentation_seconds": instrumentation_seconds,
        },
    )


# --- descriptor -------------------------------------------------------------------------------


def receiver_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult) -> ReceiverPrompt:
    """The receiver after its prompt with the one edit (the vectors come from the cache)."""
    values = option_values(request, NAME, OPTIONS)
    vectors, _ = steering_vectors(pair.receiver, demos_of(values))
    prompt_ids = build_segments(pair.receiver.tokenizer, request.query).input_ids
    return read_steered(pair.receiver, prompt_ids, vectors, values)[0]


def variant_label(values: dict) -> str:
    """Bench rows: "kv_steering-answer_briefly@4" (pair set @ c_v) ..."""
    return f"{NAME}-{values['pairs']}@{values['values']:g}"


HANDOFFS = (
    Handoff(
        name=NAME,
        title="KV steering: one edit, no sharer",
        label="KV steering",
        color=COLOR,
        summary="steering vectors from contrastive pairs are added once to the receiver's cache; no sharer runs",
        run=run,
        control="receiver",
        needs=(),
        applicable=requirements,
        options=OPTIONS,
        variant_label=variant_label,
        receiver_prompt=receiver_prompt,
    ),
)
