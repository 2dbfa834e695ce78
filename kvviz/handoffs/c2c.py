"""C2C handoff: the sharer's KV cache, projected and fused into the receiver's (REFERENCE §1).

Both models read the same user message. The sharer prefills its prompt prefix plus one aligned
token per receiver message token (``kvviz.align``); the receiver prefills its prompt except the
last token; a trained fuser (``kvviz.fuser``) rewrites the receiver's KV at the message tokens
in every layer (``K' = K_r + g·w·K_proj``); the receiver then runs its last prompt token on the
fused cache and decodes with the shared decode loop. Generated tokens are not fused.

``c2c_control`` runs the control fuser: same architecture, data, steps and seed, trained with the
sharer's KV replaced by zeros. It is an adapter on the receiver's own cache; the gap between
``c2c`` and ``c2c_control`` is what the sharer's knowledge adds.

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

import threading
from dataclasses import asdict
from pathlib import Path

import torch

from kvviz import fuser_reference
from kvviz.align import align_prompt
from kvviz.decode import generate, prefill
from kvviz.fuser import C2CFuser, FuserError, checkpoint_label, fingerprints_match, load_fuser, model_fingerprint, read_config
from kvviz.fusion import fuse_prompt
from kvviz.handoffs.common import LoadedPair, TokenCallback
from kvviz.measure import StageTimer, decode_flops, forward_flops
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
    """(folder, "") or (None, reason). A hub path comes back as a Path of the hub path's text."""
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


def communication_details(fuser: C2CFuser) -> dict | None:
    """The fuser's measured communication gain (``eval-fuser``), as recorded in its config."""
    measured = (fuser.config.training or {}).get("communication")
    return dict(measured) if measured else None


def run(
    pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None, control: bool = False
) -> HandoffResult:
    name = "c2c_control" if control else "c2c"
    folder, reason = resolve_fuser(pair, request, control)
    if folder is None:
        return HandoffResult.not_applicable(name, pair.name, reason)
    try:
        fuser = get_fuser(folder, pair)
    except FuserError as error:
        return HandoffResult.not_applicable(name, pair.name, str(error))
    if fuser.config.control != control:
        kind = "a control" if fuser.config.control else "a real (non-control)"
        return HandoffResult.not_applicable(name, pair.name, f"The fuser at {folder} is {kind} fuser; {name} needs the other kind.")

    timer = StageTimer()
    receiver, sharer = pair.receiver, pair.sharer
    receiver_sees_context = receiver_sees_context_for(fuser)
    alignment = align_prompt(
        receiver.tokenizer, sharer.tokenizer, request.query, request.context, receiver_sees_context,
        fuser.config.token_alignment, fuser.config.fuse_template,
    )
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
            "communication": communication_details(fuser),
            "sharer_model": sharer.name,
            "stopped_by": output.stopped_by,
        },
    )


def run_control(pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None) -> HandoffResult:
    """The control fuser (no sharer information): how much of C2C's effect is adaptation."""
    return run(pair, request, on_token=on_token, control=True)
