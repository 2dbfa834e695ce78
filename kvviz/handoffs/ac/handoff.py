"""Activation Communication (AC): one hidden-state vector crosses from the sender to the receiver.

Ramesh & Li 2025, "Communicating Activations Between Language Model Agents", and the KVComm
paper's AC baseline (REFERENCE §2):
1. The sender (the pair's same-shape sender, as for KVComm) prefills the private context. Its
   hidden state entering decoder layer k, at the last context token, is the message: one vector.
2. The receiver reads its own prompt (the question alone, as the receiver-alone baseline does).
   In that one prompt pass, the hidden state entering its decoder layer j at the last prompt token
   is merged with the sender's vector by f: ``replace`` (take the sender's), ``sum`` or ``mean``.
3. The receiver then decodes with the shared decode loop; answer tokens are not touched.

Layer numbers count decoder layers from 0; negative ones count from the end (-2: the second to
last), as in the reference code. The sender only needs its first k layers; kvviz runs them all so
that the figure can compare the two models' states at every depth.

How the merge reaches layer j: ``kvviz.handoffs.ac.merge``.
"""

from __future__ import annotations

import torch

from kvviz.core.prompts import build_segments
from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.handoffs.ac.merge import MERGES, layer_index, merge, read_layer_inputs, receive
from kvviz.handoffs.common import HandoffIO, handoff_result
from kvviz.handoffs.registry import Handoff, Option, ReceiverPrompt, all_of, needs_context, option_values
from kvviz.runtime.decode import generate
from kvviz.runtime.measure import StageTimer, answer_flops, forward_flops
from kvviz.runtime.models import LoadedPair

NAME = "ac"
COLOR = "#8C564B"  # brown
OPTIONS = (
    Option("k", "AC sender layer k (its input hidden state is sent; negative counts from the end)", -2, kind="int"),
    Option("j", "AC receiver layer j (merged into its input hidden state; negative counts from the end)", -2, kind="int"),
    Option("f", "AC merge f", "replace", kind="choice", choices=MERGES),
)
CONTEXT_REASON = "AC sends the sender's activation over a private context; this request has none."


# --- reading and editing the hidden states that enter decoder layers ---------------------------


# --- the handoff ------------------------------------------------------------------------------


def requirements(pair: LoadedPair, request: HandoffRequest) -> str | None:
    """Same hidden size, and layers k and j inside the two models."""
    sender, receiver = pair.same_shape_sender.facts, pair.receiver.facts
    if sender.hidden_size != receiver.hidden_size:
        return (
            "AC merges one hidden-state vector of the sender into the receiver's, so both need the same hidden size: "
            f"{sender.name} has {sender.hidden_size}, {receiver.name} has {receiver.hidden_size}."
        )
    values = option_values(request, NAME, OPTIONS)
    for role, facts, key in (("sender", sender, "k"), ("receiver", receiver, "j")):
        if not -facts.num_layers <= values[key] < facts.num_layers:
            return f"AC layer {key}={values[key]} does not exist: the {role} {facts.name} has layers 0..{facts.num_layers - 1}."
    return None


def _cosine(a: torch.Tensor | None, b: torch.Tensor | None) -> float | None:
    if a is None or b is None:
        return None
    return float(torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=0))


def layer_records(sender_states: list, receiver_states: list, k: int, j: int) -> list[dict]:
    """Per layer: both models' last-token states entering it (norms), how alike they are, and
    where the vector was taken (k, the sender's) and merged (j, the receiver's)."""
    records = []
    for layer in range(max(len(sender_states), len(receiver_states))):
        sent = sender_states[layer] if layer < len(sender_states) else None
        own = receiver_states[layer] if layer < len(receiver_states) else None
        records.append({
            "layer": layer,
            "sender_norm": None if sent is None else float(sent.float().norm()),
            "receiver_norm": None if own is None else float(own.float().norm()),
            "cosine": _cosine(sent, own),
            "taken": layer == k,
            "injected": layer == j,
        })
    return records


def run(pair: LoadedPair, request: HandoffRequest, io: HandoffIO) -> HandoffResult:
    values = option_values(request, NAME, OPTIONS)
    sender, receiver = pair.same_shape_sender, pair.receiver
    k = layer_index(values["k"], sender.facts.num_layers)
    j = layer_index(values["j"], receiver.facts.num_layers)
    timer = StageTimer()
    sender_segments = build_segments(sender.tokenizer, request.query, request.context)
    sender_states = read_layer_inputs(sender, sender_segments.context_ids, timer, io.prompts)
    with timer.stage("transfer"):
        activation = sender_states[k].to(receiver.device)
    segments = build_segments(receiver.tokenizer, request.query)
    with timer.stage("receiver_prefill"):
        prompt, receiver_states = receive(receiver, segments.input_ids, activation, j, values["f"])
    with timer.stage("receiver_decode"):
        output = generate(receiver, prompt.state, prompt.next_token, request.generation, on_token=io.on_token, timer=timer)

    context_length, prompt_length = len(sender_segments.context_ids), len(segments.input_ids)
    prompt_flops, receiver_flops = answer_flops(receiver.facts, prompt_length, len(output.token_ids))
    sender_flops = forward_flops(sender.facts, context_length, 0, 0)
    merged = merge(receiver_states[j].unsqueeze(0), activation.to(receiver_states[j].dtype).unsqueeze(0), values["f"])[0]
    # the receiver waits for the sender's prefill, then for one vector
    return handoff_result(
        NAME, pair, output, timer,
        seen={
            "sharer": sender_segments.context_text,
            "activation": (
                f"one hidden-state vector of {activation.numel()} numbers: what entered the sender's layer {k} at its "
                f"last context token, merged ({values['f']}) into what entered the receiver's layer {j} at its last "
                "prompt token"
            ),
            "receiver": segments.text,
        },
        communication="activation", bytes_sent=activation.numel() * activation.element_size(),
        flops={"sharer": sender_flops, "receiver": receiver_flops},
        flops_to_first_token={"sharer": sender_flops, "receiver": prompt_flops},
        tokens={"sender_prompt": context_length, "receiver_prompt": prompt_length, "vectors": 1},
        layers=layer_records(sender_states, receiver_states, k, j),
        details={
            "k": k,
            "j": j,
            "f": values["f"],
            "sender_model": sender.name,
            "cosine_at_merge": _cosine(activation, receiver_states[j]),
            "norm_before_merge": float(receiver_states[j].float().norm()),
            "norm_after_merge": float(merged.float().norm()),
        },
    )


# --- descriptor -------------------------------------------------------------------------------


def receiver_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult) -> ReceiverPrompt:
    """The receiver after its prompt with the sender's vector merged (the sender reruns: greedy,
    deterministic)."""
    details = result.details
    sender_ids = build_segments(pair.same_shape_sender.tokenizer, request.query, request.context).context_ids
    activation = read_layer_inputs(pair.same_shape_sender, sender_ids)[details["k"]]
    prompt_ids = build_segments(pair.receiver.tokenizer, request.query).input_ids
    prompt, _ = receive(pair.receiver, prompt_ids, activation, details["j"], details["f"])
    return prompt


HANDOFFS = (
    Handoff(
        name=NAME,
        title="AC: activation merge",
        label="AC",
        color=COLOR,
        summary="one hidden-state vector of the sender is merged into the receiver's at one layer",
        run=run,
        control="receiver",
        needs=("a private context", "a sender with the receiver's hidden size"),
        applicable=all_of(needs_context(CONTEXT_REASON), requirements),
        options=OPTIONS,
        receiver_prompt=receiver_prompt,
    ),
)
