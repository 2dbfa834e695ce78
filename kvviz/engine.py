"""Load a pair and run handoffs on it: what the CLI, the app and the benchmark all call."""

from __future__ import annotations

import traceback

from kvviz import limits
from kvviz.handoffs import get, parse_handoffs, registry
from kvviz.handoffs.common import TokenCallback
from kvviz.measure import PeakGpuMemory
from kvviz.models import LoadedPair, load_model, resolve_pair
from kvviz.results import HandoffRequest, HandoffResult


def load_pair(pair_name, device: str | None = None, dtype=None, progress=print) -> LoadedPair:
    spec = resolve_pair(pair_name)
    sharer = load_model(spec.sharer, device, dtype, progress)
    receiver = load_model(spec.receiver, device, dtype, progress)
    kvcomm_sender = load_model(spec.kvcomm_sender_name, device, dtype, progress)
    return LoadedPair(spec=spec, sharer=sharer, receiver=receiver, kvcomm_sender=kvcomm_sender)


def pair_devices(pair: LoadedPair) -> set:
    """Every device a layer of the pair's models sits on."""
    return {device for model in (pair.sharer, pair.receiver, pair.kvcomm_sender) for device in model.layer_devices}


def not_applicable(name: str, pair: LoadedPair, request: HandoffRequest) -> HandoffResult | None:
    """The "not applicable" result of a handoff whose requirements the pair or the request do not
    meet (its descriptor's ``applicable`` check, no model runs), or None when it can run."""
    handoff = get(name)
    reason = handoff.applicable(pair, request)
    return handoff.not_applicable(pair.name, reason) if reason else None


def run_handoff(name: str, pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None) -> HandoffResult:
    """Run one handoff; an unexpected failure becomes a result that says what went wrong.

    A handoff that cannot run says so at once, without running a model (``not_applicable``).
    On CUDA, ``details["peak_gpu_memory_bytes"]`` holds the peak allocated memory per GPU during
    the run (``torch.cuda.max_memory_allocated``, weights included).
    Any error inside a handoff becomes its result (the other handoffs of a run still run); a
    stopped run (``kvviz.stream.Cancelled``, not an ``Exception``) is not caught.
    """
    try:
        refused = not_applicable(name, pair, request)
        if refused is not None:
            return refused
        with PeakGpuMemory(pair_devices(pair)) as memory:
            result = get(name).run(pair, request, on_token=on_token)
        if memory.peak_bytes:
            result.details["peak_gpu_memory_bytes"] = memory.peak_bytes
        return result
    except Exception as error:  # one failing handoff never takes the others (or the server) down
        result = HandoffResult.not_applicable(name, pair.name, f"{type(error).__name__}: {error}")
        result.details["traceback"] = traceback.format_exc(limit=5)
        return result


def check_fits(pair: LoadedPair, request: HandoffRequest) -> None:
    """Refuse a request whose prompt is longer than the pair takes (``kvviz.limits``), counting the
    answer and the longest message any registered handoff may write before it."""
    limits.check_prompt_tokens(pair, request, registry.tokens_before_answer(request))


def run_handoffs(names, pair: LoadedPair, request: HandoffRequest) -> list[HandoffResult]:
    names = parse_handoffs(names)
    check_fits(pair, request)
    return [run_handoff(name, pair, request) for name in names]
