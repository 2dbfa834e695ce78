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

Fusers: ``request.c2c_fuser`` (a checkpoint folder) overrides the shipped ones. Shipped fusers
live in ``assets/fusers/<sharer>__<receiver>/c2c`` and ``.../control`` and are found by matching
the pair's architecture fingerprint (models, KV shapes, tokenizer hash), whatever the pair's name.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict
from pathlib import Path

import torch

from kvviz import cache as kv
from kvviz.align import align_prompt
from kvviz.decode import generate, prefill
from kvviz.fuser import C2CFuser, FuserError, checkpoint_label, fingerprints_match, load_fuser, model_fingerprint, read_config
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


def get_fuser(folder: Path, pair: LoadedPair) -> C2CFuser:
    """Load once per process (keyed by folder, file time and device)."""
    weights = folder / "fuser.safetensors"
    stamp = weights.stat().st_mtime_ns if weights.exists() else 0
    key = (str(folder.resolve()), stamp, str(pair.receiver.device), pair.sharer.name, pair.receiver.name)
    with _fusers_lock:
        if key not in _fusers:
            _fusers[key] = load_fuser(folder, pair.sharer.facts, pair.receiver.facts, pair.name, device=pair.receiver.device)
        return _fusers[key]


def resolve_fuser(pair: LoadedPair, request: HandoffRequest, control: bool) -> tuple[Path | None, str]:
    """(folder, "") or (None, reason)."""
    kind = "control" if control else "c2c"
    if request.c2c_fuser:
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
        return None, (
            f"No trained {'control ' if control else ''}C2C fuser for pair '{pair.name}' "
            f"(sharer {pair.sharer.name} -> receiver {pair.receiver.name}) in {ASSETS_DIR}. "
            "Train one with: python -m kvviz train-fuser --pair " + pair.name
        )
    return found, ""


def receiver_sees_context_for(fuser: C2CFuser) -> bool:
    """The context setting the fuser was trained in (the paper's shared input when unrecorded)."""
    return bool((fuser.config.training or {}).get("receiver_sees_context", True))


def sharer_bytes(cache, layers: list[int], positions: list[int]) -> int:
    """Bytes of the sharer KV the fuser reads: the used layers at the fused tokens."""
    total = 0
    for layer in sorted(set(layers)):
        keys, values = kv.layer_kv(cache, layer)
        per_token = (keys[..., :1, :].numel() * keys.element_size()) + (values[..., :1, :].numel() * values.element_size())
        total += per_token * len(positions)
    return total


@torch.no_grad()
def fused_state(pair: LoadedPair, fuser: C2CFuser, alignment, timer: StageTimer):
    """Sharer prefill, receiver prefill of all but the last prompt token, fusion.

    Returns (receiver state ready for the last prompt token, layer records, bytes read, fusion s).
    """
    control = fuser.config.control
    sharer_cache, sent = None, 0
    if not control:
        sharer_state = kv.KVState(next_position=alignment.sharer_start_position)
        with timer.stage("sharer_prefill"):
            prefill(pair.sharer, sharer_state, alignment.sharer_ids, need_logits=False)
        sharer_cache = sharer_state.cache
        sent = sharer_bytes(sharer_cache, fuser.config.layer_map, alignment.sharer_positions)
    state = kv.KVState()
    head = alignment.receiver_ids[:-1]
    with timer.stage("receiver_prefill"):
        if head:
            prefill(pair.receiver, state, head, need_logits=False)
    started = time.perf_counter()
    with timer.stage("transfer"):
        if head and alignment.num_fused:
            receiver_layers = [kv.layer_kv(state.cache, i) for i in range(kv.num_layers(state.cache))]
            sharer_layers = None
            if sharer_cache is not None:
                sharer_layers = [kv.layer_kv(sharer_cache, i) for i in range(kv.num_layers(sharer_cache))]
            fused, records = fuser.fuse(
                receiver_layers, sharer_layers, alignment.receiver_positions, alignment.sharer_positions, hard=True
            )
            state = kv.KVState(cache=kv.from_tensors(fused), next_position=state.next_position)
        else:
            _, records = fuser.fuse(
                [(torch.zeros(1, pair.receiver.facts.num_kv_heads, 0, pair.receiver.facts.head_dim),) * 2]
                * pair.receiver.facts.num_layers,
                None,
                [],
                [],
                hard=True,
            )
    return state, records, sent, time.perf_counter() - started


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
    alignment = align_prompt(receiver.tokenizer, sharer.tokenizer, request.query, request.context, receiver_sees_context)
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
            "fuser_path": checkpoint_label(folder),
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
            "sharer_model": sharer.name,
            "stopped_by": output.stopped_by,
        },
    )


def run_control(pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None) -> HandoffResult:
    """The control fuser (no sharer information): how much of C2C's effect is adaptation."""
    return run(pair, request, on_token=on_token, control=True)
