"""Load a pair and run handoffs on it: what the CLI, the app and the benchmark all call."""

from __future__ import annotations

import logging
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field

from kvviz.core import limits
from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.data.swaps import OPPOSITE
from kvviz.engine.events import Lens, Scored
from kvviz.handoffs import get, registry
from kvviz.handoffs.common import HandoffIO, TokenCallback
from kvviz.runtime import crossed
from kvviz.runtime.decode import SharedPrompts, answer_logprobs, lens_at_first_content_token
from kvviz.runtime.measure import PeakGpuMemory
from kvviz.runtime.models import LoadedPair, load_model, resolve_pair
from kvviz.runtime.recording import recording

LOG = logging.getLogger("kvviz.engine.runner")


def load_pair(pair_name, device: str | None = None, dtype=None, progress=print, numeric_mode: str | None = None) -> LoadedPair:
    """The pair's models, loaded once per process (``numeric_mode``: see ``load_model``)."""
    spec = resolve_pair(pair_name)
    sharer = load_model(spec.sharer, device, dtype, progress, numeric_mode)
    receiver = load_model(spec.receiver, device, dtype, progress, numeric_mode)
    same_shape_sender = load_model(spec.same_shape_sender_name, device, dtype, progress, numeric_mode)
    return LoadedPair(spec=spec, sharer=sharer, receiver=receiver, same_shape_sender=same_shape_sender)


def swap_pair(pair: LoadedPair, swap) -> LoadedPair:
    """The pair a swap's arm runs on: the pair its ``pair`` names (a sharer that learned other
    facts, ``kvviz.data.swaps.Swap.pair``; ``OPPOSITE``: this pair's ``opposite``), loaded on this
    pair's device and dtype; else this pair."""
    name = getattr(swap, "pair", None)
    if name == OPPOSITE:
        name = pair.spec.opposite
        if not name:
            raise ValueError(f"Pair '{pair.name}' has no pair whose sharer learned the opposite facts "
                             "(its PairSpec.opposite), so its sharer cannot be swapped.")
    if not name or name == pair.name:
        return pair
    return load_pair(name, str(pair.receiver.device), pair.receiver.dtype, progress=lambda message: None)


def pair_devices(pair: LoadedPair) -> set:
    """Every device a layer of the pair's models sits on."""
    return {device for model in (pair.sharer, pair.receiver, pair.same_shape_sender) for device in model.layer_devices}


def not_applicable(name: str, pair: LoadedPair, request: HandoffRequest) -> HandoffResult | None:
    """The "not applicable" result of a handoff whose requirements the pair or the request do not
    meet (its descriptor's ``applicable`` check, no model runs), or None when it can run."""
    handoff = get(name)
    reason = handoff.applicable(pair, request)
    return handoff.not_applicable(pair.name, reason) if reason else None


@dataclass
class RunContext:
    """One run of several handoffs, passed to each ``run_handoff``: the prompts they read once
    (``kvviz.runtime.decode.SharedPrompts``) and what each recorded of its answer, for scoring it
    against its control as soon as both have finished (``kvviz.runtime.crossed.RunRecords``)."""

    prompts: SharedPrompts = field(default_factory=SharedPrompts)
    records: crossed.RunRecords = field(default_factory=crossed.RunRecords)


def run_handoff(
    name: str, pair: LoadedPair, request: HandoffRequest, on_token: TokenCallback | None = None,
    on_message: TokenCallback | None = None, run: RunContext | None = None,
) -> HandoffResult:
    """Run one handoff; an unexpected failure becomes a result that says what went wrong.

    ``on_token`` receives the answer so far after every token; ``on_message`` the message so far,
    for a handoff that writes one before its answer (both reach the handoff in its ``HandoffIO``).
    ``run``: the run this handoff is part of (its other handoffs share the prompts they read, and
    each answer is scored against its control's, ``score_against_controls``); None: a run of one.

    A handoff that cannot run says so at once, without running a model (``not_applicable``): the
    engine alone checks a handoff's requirements; what a run can only find while running (a
    checkpoint that will not load) it raises as ``registry.NotApplicable``, with the reason.
    On CUDA, ``details["peak_gpu_memory_bytes"]`` holds the peak allocated memory per GPU during
    the run (``torch.cuda.max_memory_allocated``, weights included). ``details["decode_batches"]``
    says, per decode loop the handoff ran (a message, then the answer), how many sequences shared
    its decode steps (``kvviz.runtime.decode``: steps, mean and largest batch).
    When the request asks (``HandoffRequest.inspect``), the result's ``token_attention`` and
    ``logit_lens`` say what crossed (``kvviz.runtime.crossed``), recorded in this run.
    Any error inside a handoff becomes its result (the other handoffs of a run still run); a
    stopped run (``kvviz.engine.stream.Cancelled``, not an ``Exception``) is not caught.
    """
    try:
        refused = not_applicable(name, pair, request)
        if refused is not None:
            return refused
        run = run or RunContext()
        io = HandoffIO(on_token=on_token, on_message=on_message, prompts=run.prompts)
        with PeakGpuMemory(pair_devices(pair)) as memory, recording(request, pair.receiver) as recorded:
            result = get(name).run(pair, request, io)
        costs = CrossedCosts()
        with costs.part("lens_position"):
            lens_at_first_content_token(recorded.inspection)
        with costs.part("attention_and_lens"):
            crossed.attach(result, recorded.inspection, io.sent, NOTHING_SENT)
        try:
            with costs.part("scoring"):
                score_against_controls(result, recorded.inspection, run.records)
        except Exception:  # noqa: BLE001 (the answer stands without its token-by-token comparison)
            LOG.exception("scoring %s against its control failed", name)
        if recorded.inspection is not None:
            result.details["crossed_seconds"] = costs.seconds
        if memory.peak_bytes:
            result.details["peak_gpu_memory_bytes"] = memory.peak_bytes
        if result.applicable:
            result.details["decode_batches"] = [batch_summary(output.batch_sizes) for output in recorded.decodes]
        return result
    except registry.NotApplicable as refusal:  # found only while running (a checkpoint that will not load)
        return get(name).not_applicable(pair.name, str(refusal))
    except Exception as error:  # one failing handoff never takes the others (or the server) down
        result = HandoffResult.not_applicable(name, pair.name, f"{type(error).__name__}: {error}")
        result.details["traceback"] = traceback.format_exc(limit=5)
        return result


class CrossedCosts:
    """The CPU seconds this thread spends on each part of what crossed after a handoff's run (the
    speed report's breakdown of what recording costs: ``details["crossed_seconds"]``)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def part(self, name: str):
        started = time.thread_time()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.thread_time() - started


NOTHING_SENT = "nothing was sent as tokens: no key the receiver attends to came from the sharer in this handoff"


def batch_summary(sizes: list[int] | None) -> dict:
    """How many sequences shared one decode loop's steps (``batched`` False: the model's own forward)."""
    if sizes is None:
        return {"batched": False}
    return {"batched": True, "steps": len(sizes), "mean_size": sum(sizes) / len(sizes) if sizes else 0.0,
            "max_size": max(sizes, default=0)}


def check_fits(pair: LoadedPair, request: HandoffRequest) -> None:
    """Refuse a request whose prompt is longer than the pair takes (``kvviz.core.limits``), counting the
    answer and the longest message any registered handoff may write before it."""
    limits.check_prompt_tokens(pair, request, registry.tokens_before_answer(request))


def score_against_controls(result: HandoffResult, inspection, records: crossed.RunRecords) -> None:
    """In a run that records what crossed, as ``result`` finishes: every pair it completes (it and
    its control, or a handoff it is the control of, both recorded on one receiver) gets its
    ``token_change``, in this thread: the method's answer scored as its decode chose it and,
    teacher-forced, on the control's prompt (``decode.answer_logprobs``)."""
    if inspection is None or inspection.prompt is None or not inspection.wants("scores"):
        return
    recorded = {r.handoff: (r, i) for r, i in records.add(result, inspection)}
    name = result.handoff
    for method, control in [(name, registry.control_of(name)), *((m, name) for m in registry.controlled_by(name))]:
        if method not in recorded or control not in recorded:
            continue
        (method_result, mine), (_, theirs) = recorded[method], recorded[control]
        if not mine.answer_ids or theirs.model is not mine.model:
            continue
        ids = mine.answer_ids[: crossed.MAX_CHANGE_TOKENS]
        own = mine.model.head.log_probabilities(mine.chose[: len(ids)], ids)
        under_control = answer_logprobs(mine.model, *theirs.prompt, ids)
        method_result.token_change = crossed.change_record(mine, control, registry.title_of(control), own, under_control)


def finish_crossed(run: RunContext) -> list[Scored | Lens]:
    """After every handoff of a run that recorded what crossed: a ``Scored`` event (its
    ``token_change``) for each scored answer (a method that finished before its control got its
    score after its ``Done``) and a ``Lens`` event (its ``logit_lens``) for each recorded result;
    the prompts kept for scoring are dropped."""
    records = run.records
    events: list[Scored | Lens] = [Scored(r.handoff, r.token_change) for r, _ in records.entries if r.token_change]
    events += [Lens(r.handoff, r.logit_lens) for r, _ in records.entries if r.logit_lens]
    for _, inspection in records.entries:
        inspection.prompt = inspection.chose = None
    return events
