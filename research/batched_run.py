"""Phase-A prototype of the shared decode: the handoffs of one run decode with their model's batch.

The handoffs run unchanged, each in its own thread; only ``generate`` is replaced (patched into
the handoff modules here) by one that hands each decode step to its model's ``DecodeBatch``. The
batch is a barrier: when every sequence of that model that is decoding has handed in its next
token, the last one to arrive runs one batched step (``research.lean_step.LeanStepper``) for all
of them and wakes the others with their next token. A sequence that finishes leaves; a sequence
whose prefill finishes later joins at the next step. The first answer token comes from the
handoff's own prefill, chosen in its own thread, so no sequence waits for the batch before its
first token.

    PYTHONPATH=. python research/batched_run.py [--repeats 3] [--threads 1]

prints, interleaved (A B A B ...): the page's six default handoffs on the locker preset, warm,
(a) today, one after another (kvviz.speed.full_run's loop), (b) today through kvviz.stream with two
side by side, (c) all six in threads with the batched decode; wall seconds, and whether (c) gives
every handoff the tokens it gets alone.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from kvviz.decode import DecodeOutput
from kvviz.measure import clock
from research.lean_step import GrowingKV, LeanStepper


class ComputeGate:
    """At most ``permits`` forwards at once (one per core), prefills before decode steps: a decode step
    waits while any prefill waits, so the prompts of a run are read first and the batch then holds
    every sequence (and every column gets its first token as early as the cores allow)."""

    def __init__(self, permits: int = 2):
        self.cond = threading.Condition()
        self.free = permits
        self.waiting_prefills = 0

    def run(self, function, prefill: bool):
        with self.cond:
            if prefill:
                self.waiting_prefills += 1
            while self.free == 0 or (not prefill and self.waiting_prefills):
                self.cond.wait()
            if prefill:
                self.waiting_prefills -= 1
            self.free -= 1
        try:
            return function()
        finally:
            with self.cond:
                self.free += 1
                self.cond.notify_all()


GATE: ComputeGate | None = None


def gated_decoders(models):
    """Route every decoder forward (every prefill) of these models through GATE."""
    for loaded in models:
        decoder = loaded.model.model
        if getattr(decoder, "_gated", False):
            continue
        plain = decoder.forward

        def forward(*args, _plain=plain, **kwargs):
            if GATE is None:
                return _plain(*args, **kwargs)
            return GATE.run(lambda: _plain(*args, **kwargs), prefill=True)

        decoder.forward = forward
        decoder._gated = True


class Sequence:
    def __init__(self, state, token):
        self.state = state
        self.buffers = GrowingKV(state.cache)
        self.feed = token
        self.next = None


class DecodeBatch:
    """One model's batched decode, shared by every thread that decodes with it."""

    def __init__(self, stepper: LeanStepper):
        self.stepper = stepper
        self.cond = threading.Condition()
        self.live: set[Sequence] = set()
        self.ready: list[Sequence] = []
        self.steps = []  # batch size of every step

    def join(self, sequence):
        with self.cond:
            self.live.add(sequence)

    def leave(self, sequence):
        with self.cond:
            self.live.discard(sequence)
            self._maybe_step()

    def step(self, sequence, token) -> int:
        """Hand in ``token`` for ``sequence``; returns its next token once a batched step ran."""
        with self.cond:
            sequence.feed, sequence.next = token, None
            self.ready.append(sequence)
            self._maybe_step()
            while sequence.next is None:
                self.cond.wait()
            return sequence.next

    def _maybe_step(self):
        # the last live sequence to hand in its token runs the step (the lock is held meanwhile:
        # nobody else has anything to do for this model until it is done)
        if not self.ready or len(self.ready) < len(self.live):
            return
        batch, self.ready = self.ready, []

        def step():
            hidden = self.stepper.step([s.state for s in batch], [s.feed for s in batch], [s.buffers for s in batch])
            return self.stepper.greedy_tokens(hidden)

        tokens = step() if GATE is None else GATE.run(step, prefill=False)
        self.steps.append(len(batch))
        for sequence, token in zip(batch, tokens):
            sequence.next = token
        self.cond.notify_all()


_batches: dict[str, DecodeBatch] = {}
_batches_lock = threading.Lock()


def batch_for(loaded) -> DecodeBatch:
    with _batches_lock:
        if loaded.name not in _batches:
            _batches[loaded.name] = DecodeBatch(LeanStepper(loaded))
        return _batches[loaded.name]


@torch.no_grad()
def batched_generate(loaded, state, first, settings, on_token=None, max_new_tokens=None, stop_at_newline=None):
    """kvviz.decode.generate's rules (greedy only here), each step through the model's batch."""
    from kvviz.prompts import has_chat_template, stop_token_ids

    tokenizer = loaded.tokenizer
    limit = max_new_tokens or settings.max_new_tokens
    stop_ids = stop_token_ids(tokenizer)
    if stop_at_newline is None:
        stop_at_newline = not has_chat_template(tokenizer)
    started = clock()
    token = first.greedy_token()
    first_token_seconds = clock() - started
    batch = batch_for(loaded)
    sequence = Sequence(state, token)
    batch.join(sequence)
    token_ids, text, stopped_by = [], "", "length"
    try:
        while True:
            if token in stop_ids:
                stopped_by = "eos"
                break
            token_ids.append(token)
            text = tokenizer.decode(token_ids, skip_special_tokens=True)
            if stop_at_newline and "\n" in text.lstrip():
                text = text.lstrip().split("\n", 1)[0]
                stopped_by = "newline"
                break
            if on_token is not None:
                on_token(text)
            if len(token_ids) >= limit:
                break
            token = batch.step(sequence, token)
    finally:
        batch.leave(sequence)
    return DecodeOutput(token_ids=token_ids, text=text.strip(), seconds=clock() - started,
                        first_token_seconds=first_token_seconds, stopped_by=stopped_by)


def patched(function):
    from kvviz.handoffs import ac, c2c, cipher, common, kvcomm

    modules = (common, c2c, kvcomm, ac, cipher)
    originals = [m.generate for m in modules]

    class Patch:
        def __enter__(self):
            for m in modules:
                m.generate = function

        def __exit__(self, *exc):
            for m, original in zip(modules, originals):
                m.generate = original

    return Patch()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from kvviz import engine
    from kvviz.engine import load_pair, run_handoff
    from kvviz.handoffs.registry import default_handoffs
    from kvviz.results import GenerationSettings, HandoffRequest
    from kvviz.speed import FULL_RUN_CONTEXT, FULL_RUN_QUERY, FULL_RUN_TOKENS
    from kvviz.stream import run_events

    pair = load_pair("embedded", "cpu", "float32", progress=lambda *a: None)
    engine.load_pair = lambda name, progress=None, **kw: pair
    names = default_handoffs()
    request = HandoffRequest(query=FULL_RUN_QUERY, context=FULL_RUN_CONTEXT,
                             generation=GenerationSettings(max_new_tokens=FULL_RUN_TOKENS))

    def sequential():
        return {n: run_handoff(n, pair, request) for n in names}

    def streamed_two():
        results = {}
        for kind, name, data in run_events("embedded", request, names, workers=2):
            if kind == "done":
                results[name] = data
        return results

    def batched_all():
        with patched(batched_generate), ThreadPoolExecutor(max_workers=len(names)) as pool:
            futures = {n: pool.submit(run_handoff, n, pair, request) for n in names}
            return {n: f.result() for n, f in futures.items()}

    def batched_gated():
        global GATE
        GATE = ComputeGate(2)
        try:
            return batched_all()
        finally:
            GATE = None

    def alone_batched():
        with patched(batched_generate):
            return {n: run_handoff(n, pair, request) for n in names}

    variants = {"today, one after another": sequential, "today, stream 2 side by side": streamed_two,
                "batched decode, all six in threads": batched_all,
                "batched decode + prefill-first gate (2 permits)": batched_gated}
    gated_decoders([pair.sharer, pair.receiver, pair.kvcomm_sender])
    for function in variants.values():
        function()  # warm-up (calibration, fusers, head index, packed weights)
    walls = {label: [] for label in variants}
    ttft = {label: [] for label in variants}
    for _ in range(args.repeats):
        for label, function in variants.items():
            started = time.perf_counter()
            results = function()
            walls[label].append(time.perf_counter() - started)
    print(f"warm run of {', '.join(names)} on the locker preset, {args.threads} torch thread(s), wall s "
          f"(median [min, max] of {args.repeats}, interleaved):")
    for label, values in walls.items():
        print(f"  {label}: {statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]")
    batch = _batches.get(pair.receiver.name)
    if batch:
        print(f"  receiver batch sizes over the last run's steps (gated run): {batch.steps[-40:]}")
    today = sequential()
    together = batched_all()
    alone = alone_batched()
    for name in names:
        a, b, c = today[name].answer_ids, together[name].answer_ids, alone[name].answer_ids
        print(f"  {name}: batched == alone {b == c}; == today {b == a}; answer {together[name].answer!r}; "
              f"first token {together[name].first_token_seconds:.2f} s; total {together[name].total_seconds:.2f} s")


if __name__ == "__main__":
    main()
