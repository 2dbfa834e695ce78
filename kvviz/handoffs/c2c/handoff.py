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

import torch

from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.handoffs.c2c.align import align_prompt, describe
from kvviz.handoffs.c2c.fuser import C2CFuser
from kvviz.handoffs.c2c.fusion import fuse_prompt
from kvviz.handoffs.c2c.locate import (
    CONTROL,
    NAME,
    OPTIONS,
    communication_details,
    fuser_for,
    fuser_found,
)
from kvviz.handoffs.common import HandoffIO, handoff_result, read_prompt
from kvviz.handoffs.registry import Handoff, ReceiverPrompt
from kvviz.runtime.checkpoints import checkpoint_label
from kvviz.runtime.decode import generate, prefill
from kvviz.runtime.measure import StageTimer, decode_flops, forward_flops
from kvviz.runtime.models import LoadedPair


def receiver_sees_context_for(fuser: C2CFuser) -> bool:
    """The context setting the fuser was trained in (the paper's shared input when unrecorded)."""
    return bool((fuser.config.training or {}).get("receiver_sees_context", True))


def run(pair: LoadedPair, request: HandoffRequest, io: HandoffIO, control: bool = False) -> HandoffResult:
    name = CONTROL if control else NAME
    fuser, folder = fuser_for(pair, request, control)
    timer = StageTimer()
    receiver, sharer = pair.receiver, pair.sharer
    alignment = request_alignment(pair, request, fuser)
    with torch.no_grad():  # the frozen models and the fuser at inference: no gradients
        fused = fuse_prompt(pair, fuser, alignment, sharer="right", hard=True, timer=timer, prompts=io.prompts)
    # what crossed: the fused prompt, the receiver's cache of its prompt after the fuser
    fused_length = fused.state.next_position
    io.send("fused prompt tokens (the receiver's prompt cache after the fuser"
                      + (", the control fuser" if control else "") + ")",
                      range(fused_length), alignment.receiver_ids[:fused_length])
    with timer.stage("receiver_prefill"):
        logits, _ = prefill(receiver, fused.state, alignment.receiver_ids[-1:])
    with timer.stage("receiver_decode"):
        output = generate(receiver, fused.state, logits, request.generation, on_token=io.on_token, timer=timer)
    flops, before_answer = c2c_flops(pair, fuser, alignment, len(output.token_ids), control)
    return handoff_result(
        name, pair, output, timer,
        seen={
            "sharer": "" if control else sharer.tokenizer.decode(alignment.sharer_ids),
            "receiver": alignment.receiver_segments.text,
            **({} if control else {"alignment": describe(alignment, receiver.tokenizer, sharer.tokenizer,
                                                          fuser.config.token_alignment)}),
        },
        communication="none" if control else "kv", bytes_sent=fused.bytes_read,
        flops=flops, flops_to_first_token=before_answer,
        tokens={
            "receiver_prompt": len(alignment.receiver_ids),
            "sharer_prompt": 0 if control else len(alignment.sharer_ids),
            "fused": alignment.num_fused,
        },
        layers=[asdict(record) for record in fused.records],
        details=run_details(pair, fuser, folder, alignment, fused),
    )


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
    fuser, _ = fuser_for(pair, request, control)
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
    """``HandoffResult.details`` of a run (but ``stopped_by``, which ``handoff_result`` adds)."""
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


def run_control(pair: LoadedPair, request: HandoffRequest, io: HandoffIO) -> HandoffResult:
    """The control fuser (no sharer information): how much of C2C's effect is adaptation."""
    return run(pair, request, io, control=True)


# --- descriptors ------------------------------------------------------------------------------


HANDOFFS = (
    Handoff(
        name=NAME,
        title="C2C: cache fusion",
        label="C2C",
        color="#0072B2",  # blue
        summary="a trained fuser projects the sharer's KV cache into the receiver's",
        run=run,
        control=CONTROL,
        needs=("a trained fuser for the pair",),
        applicable=fuser_found(control=False),
        options=OPTIONS,
        receiver_prompt=receiver_prompt,
        default=True,
    ),
    Handoff(
        name=CONTROL,
        title="C2C control: no sharer",
        label="C2C control",
        color="#56B4E9",  # light blue
        summary="the control fuser (trained without the sharer's information): adaptation only",
        run=run_control,
        needs=("a trained control fuser for the pair",),
        applicable=fuser_found(control=True),
        receiver_prompt=control_receiver_prompt,
        default=True,
    ),
)
