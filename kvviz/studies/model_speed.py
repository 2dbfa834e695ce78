"""How fast each model decodes here, beside what the memory allows: the speed report's per-model part.

For every model of the pair, in each numeric mode asked for (``kvviz.runtime.numerics``: fp32 and the
mode this CPU picks), measured in one process and reported as the median [min, max] over repeats:

* ``decode_ms_per_token``: one greedy decode step as the decode loop runs it (the decoder stack on
  one new token, then the next token chosen by the output head), after a prompt of
  ``PROMPT_TOKENS`` tokens; split into the decoder stack and the head; tokens per second.
* ``batched_decode_ms``: the same step for 1, 2, 4 and 6 sequences at once (``BATCH_SIZES``), as
  the handoffs of a run share it (``kvviz.runtime.decode``; each sequence its own copy of the prompt's
  state), stack and head; ``decode_path`` says how the step is computed.
* ``prefill_ms_per_token``: a ``PREFILL_TOKENS``-token prompt through the decoder stack, per token.
* the machine's limits, measured in the same rounds (``kvviz.runtime.measure.read_once``: every byte
  read once):
  - ``stream_weights_ms``: every weight of the model;
  - ``stack_stream_ms``: the decoder stack's weights in the mode's precision (what one decode step of
    the stack must read);
  - ``head_scan_stream_ms``: the head's copy its greedy scan reads (the int4 index; the fp32 head
    where there is none);
  - ``head_product_ms``: the full output-head product, the product the fast greedy head avoids;
  and the ratios ``stack / stack stream`` (``stack_stream_ratio``), ``step / weights a step reads``
  (the step over the stack's and the head scan's streams), ``head / head product`` and ``6 / 1``.

On a CPU the model runs on one torch thread here, as the page serves it (one thread per handoff), and
every timing is that thread's CPU time (``time.thread_time``): a busy machine's other processes then
do not count, only their share of the memory bandwidth does; on a GPU, wall clock after a
synchronisation (``kvviz.runtime.measure.clock``). Compare the ratios, measured side by side, rather
than absolute values across runs.
"""

from __future__ import annotations

import statistics
import time

import torch

from kvviz.runtime import cache as kv
from kvviz.runtime.batching import decode_batch, decode_path
from kvviz.runtime.decode import prefill
from kvviz.runtime.measure import bytes_of, clock, read_once, spread
from kvviz.runtime.models import ModelLoadError, load_model
from kvviz.runtime.numerics import describe

PROMPT_TOKENS = 32
PREFILL_TOKENS = 128
DECODE_STEPS = 16
BATCH_SIZES = (1, 2, 4, 6)


class Clock:
    """The report's clock for one model: this thread's CPU time on a CPU (the model on one torch
    thread), wall clock after a synchronisation elsewhere."""

    def __init__(self, device: torch.device):
        self.cpu = device.type == "cpu"
        self.name = "thread CPU time, one torch thread" if self.cpu else "wall clock"

    def __call__(self) -> float:
        return time.thread_time() if self.cpu else clock()

    def timed(self, function) -> float:
        started = self()
        function()
        return self() - started


def prompt_ids(loaded, count: int) -> list[int]:
    """``count`` token ids of plain English text (repeated as needed): the prompt every speed
    measurement decodes after, the same for every model of a pair (its tokenizer's ids, no special
    tokens). Raises ``ValueError`` when the text is too short for ``count``."""
    text = (
        "The morning train left the station a few minutes after the bakery opened its doors, and "
        "several visitors stopped to read the notice about the new opening hours of the museum. "
    ) * (count // 20 + 2)
    ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < count:
        raise ValueError(f"could not build a {count}-token prompt for {loaded.name}")
    return ids[:count]


def _copy(state: kv.KVState) -> kv.KVState:
    return kv.KVState(cache=kv.copy_cache(state.cache), next_position=state.next_position)


def _decode_steps(loaded, base: kv.KVState, token: int, count: int, clock: Clock) -> tuple[float, float]:
    """Median seconds of the decoder stack and of the head over ``DECODE_STEPS`` decode steps of
    ``count`` sequences (copies of ``base``) at once, as ``kvviz.runtime.decode.generate`` takes them: through
    the model's batched step where there is one, else its own forward (one sequence only)."""
    batch = decode_batch(loaded)
    states = [_copy(base) for _ in range(count)]
    tokens = [token] * count
    stacks, heads = [], []
    for _ in range(DECODE_STEPS):
        started = clock()
        if batch is None:
            next_tokens = [prefill(loaded, state, [t])[0] for state, t in zip(states, tokens)]
            middle = clock()
            tokens = [n.greedy_token() for n in next_tokens]
        else:
            hidden = batch.step_function(states, tokens)
            middle = clock()
            tokens = loaded.head.greedy_tokens(hidden)
        stopped = clock()
        stacks.append(middle - started)
        heads.append(stopped - middle)
    return statistics.median(stacks), statistics.median(heads)


@torch.no_grad()
def model_speed(loaded, repeats: int) -> dict:
    """Decode (one sequence and several at once) and prefill speed of one model, with the machine's
    limits beside them (on a CPU on one torch thread, in its CPU time: ``Clock``)."""
    clock = Clock(loaded.device)
    threads = torch.get_num_threads()
    if clock.cpu:
        torch.set_num_threads(1)
    try:
        return _model_speed(loaded, repeats, clock)
    finally:
        torch.set_num_threads(threads)


def _model_speed(loaded, repeats: int, clock: Clock) -> dict:
    timed = clock.timed
    parameters = list(loaded.model.parameters())
    stack = list(loaded.model.model.layers.parameters())
    head = loaded.head
    index = head.scan_index()  # built (or read from disk) before timing
    scanned = list(index) if index is not None else [head.linear.weight]
    sizes = BATCH_SIZES if decode_batch(loaded) is not None else (1,)  # (builds the batched step first)
    prompt = prompt_ids(loaded, PROMPT_TOKENS)
    long_prompt = prompt_ids(loaded, PREFILL_TOKENS)

    rounds = []  # per repeat: stack and head seconds per batch size, the limits, the prefill
    for _ in range(repeats + 1):  # the first round warms up and is dropped
        base = kv.KVState()
        first, _ = prefill(loaded, base, prompt)
        token = first.greedy_token()
        steps = {count: _decode_steps(loaded, base, token, count, clock) for count in sizes}
        hidden = first.hidden
        rounds.append({
            "steps": steps,
            "full_head": timed(lambda: head.logits(hidden)),
            "stream": timed(lambda: read_once(parameters)),
            "stack_stream": timed(lambda: read_once(stack)),
            "head_scan_stream": timed(lambda: read_once(scanned)),
            "prefill": timed(lambda: prefill(loaded, kv.KVState(), long_prompt, need_logits=False)) / len(long_prompt),
        })
    rounds = rounds[1:]
    ms = lambda values: spread([1000 * v for v in values])  # noqa: E731
    stack_s = [r["steps"][1][0] for r in rounds]
    head_s = [r["steps"][1][1] for r in rounds]
    step_s = [a + b for a, b in zip(stack_s, head_s)]
    ratios = {
        "decode / stream weights": spread([s / r["stream"] for s, r in zip(step_s, rounds)]),
        "stack / stack stream": spread([s / r["stack_stream"] for s, r in zip(stack_s, rounds)]),
        "step / weights a step reads": spread([s / (r["stack_stream"] + r["head_scan_stream"]) for s, r in zip(step_s, rounds)]),
        "head / head product": spread([h / r["full_head"] for h, r in zip(head_s, rounds)]),
    }
    if 6 in sizes:
        ratios["6 / 1 sequences"] = spread([sum(r["steps"][6]) / sum(r["steps"][1]) for r in rounds])
    return {
        "model": loaded.name,
        "numeric_mode": loaded.numerics,
        "numerics": describe(loaded.numerics, loaded.dtype),
        "dtype": str(loaded.dtype).replace("torch.", ""),
        "device": str(loaded.device),
        "clock": clock.name,
        "parameters": sum(p.numel() for p in parameters),
        "weight_bytes": bytes_of(parameters),
        "stack_weight_bytes": bytes_of(stack),
        "head_scan_bytes": bytes_of(scanned),
        "fast_greedy_head": index is not None,
        "decode_path": decode_path(loaded),
        "decode_ms_per_token": ms(step_s),
        "decode_stack_ms": ms(stack_s),
        "decode_head_ms": ms(head_s),
        "tokens_per_second": spread([1 / s for s in step_s]),
        "batched_decode_ms": {str(count): ms([sum(r["steps"][count]) for r in rounds]) for count in sizes},
        "batched_decode_stack_ms": {str(count): ms([r["steps"][count][0] for r in rounds]) for count in sizes},
        "prefill_ms_per_token": ms([r["prefill"] for r in rounds]),
        "prefill_tokens": len(long_prompt),
        "limits": {
            "stream_weights_ms": ms([r["stream"] for r in rounds]),
            "stack_stream_ms": ms([r["stack_stream"] for r in rounds]),
            "head_scan_stream_ms": ms([r["head_scan_stream"] for r in rounds]),
            "head_product_ms": ms([r["full_head"] for r in rounds]),
        },
        "ratios": ratios,
    }


def speed_by_mode(pair, modes: list[str], repeats: int, progress) -> dict[str, list[dict]]:
    """``model_speed`` of every model of the pair in each numeric mode (its models loaded once more
    per mode, on the pair's device and dtype; only model-level work runs on them: a handoff's caches
    are kept per model name, so runs stay in this process's own mode), one mode after the other per
    model."""
    models = list({m.name: m for m in (pair.sharer, pair.receiver, pair.same_shape_sender)}.values())
    device, dtype = str(pair.receiver.device), pair.receiver.dtype
    by_mode: dict[str, list[dict]] = {mode: [] for mode in modes}
    for own in models:
        for mode in modes:
            progress(f"speed of {own.name}, numerics {mode}")
            if mode == own.numerics:
                loaded = own
            else:
                try:
                    loaded = load_model(own.name, device, dtype, progress=lambda *_: None, numeric_mode=mode)
                except (ModelLoadError, ValueError) as error:  # a model built in memory (tests) has no other mode
                    by_mode[mode].append({"model": own.name, "numeric_mode": mode, "skipped": str(error)})
                    continue
            by_mode[mode].append(model_speed(loaded, repeats))
    return by_mode
