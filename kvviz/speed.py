"""How fast each model runs here, beside what this machine allows: the speed part of ``bench --perf``.

For every model of the pair, measured in one process and reported as the median [min, max] over
repeats:

* ``decode_ms_per_token``: one greedy decode step as the decode loop runs it (the decoder stack on
  one new token, then the next token chosen by the output head), after a prompt of
  ``PROMPT_TOKENS`` tokens; split into the decoder stack and the head; tokens per second.
* ``prefill_ms_per_token``: a ``PREFILL_TOKENS``-token prompt through the decoder stack, per token.
* the machine's limits, measured in the same run:
  - ``stream_weights_ms``: reading every weight of the model once (a sum over each parameter
    tensor: the memory traffic of a decode step with no compute to speak of);
  - ``head_product_ms``: the full output-head product (hidden state x vocabulary) at the model's
    precision, the product the fast greedy head avoids;
  and the ratios ``decode / stream`` (1.0 would mean a decode step as fast as memory allows) and
  ``head / head product``.
* ``warm_full_run_seconds``: the page's default handoffs run one after another on the locker
  preset (32 new tokens at most), after one warm-up run, wall time per repeat; and each handoff's
  own total.

Timings are wall-clock (``kvviz.measure.clock``, which waits for the GPU first), taken on whatever
else the machine is doing: compare the ratios, which are measured side by side, rather than
absolute values across runs.
"""

from __future__ import annotations

import statistics

import torch

from kvviz import cache as kv
from kvviz.decode import prefill
from kvviz.engine import run_handoff
from kvviz.handoffs.registry import default_handoffs
from kvviz.measure import clock, spread
from kvviz.results import GenerationSettings, HandoffRequest

PROMPT_TOKENS = 32
PREFILL_TOKENS = 128
DECODE_STEPS = 16
FULL_RUN_QUERY = "What is the code for locker 12?"
FULL_RUN_CONTEXT = "The code for locker 12 is 4471."
FULL_RUN_TOKENS = 32


def _timed(function) -> float:
    started = clock()
    function()
    return clock() - started


def _prompt_ids(loaded, count: int) -> list[int]:
    """``count`` token ids of plain English text (repeated as needed)."""
    text = (
        "The morning train left the station a few minutes after the bakery opened its doors, and "
        "several visitors stopped to read the notice about the new opening hours of the museum. "
    ) * (count // 20 + 2)
    ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < count:
        raise ValueError(f"could not build a {count}-token prompt for {loaded.name}")
    return ids[:count]


@torch.no_grad()
def model_speed(loaded, repeats: int) -> dict:
    """Decode and prefill speed of one model, with the machine's limits beside them."""
    device = loaded.device
    parameters = [p for p in loaded.model.parameters()]
    weight_bytes = sum(p.numel() * p.element_size() for p in parameters)
    head = loaded.head
    head.scan_index()  # built (or read from disk) before timing
    prompt = _prompt_ids(loaded, PROMPT_TOKENS)
    long_prompt = _prompt_ids(loaded, PREFILL_TOKENS)

    step_s, stack_s, head_s, full_head_s, stream_s, prefill_s = [], [], [], [], [], []
    for _ in range(repeats + 1):  # the first round warms up and is dropped
        state = kv.KVState()
        first, _ = prefill(loaded, state, prompt)
        token = first.greedy_token()
        steps, stacks, heads = [], [], []
        for _ in range(DECODE_STEPS):
            started = clock()
            next_token, _ = prefill(loaded, state, [token])
            middle = clock()
            token = next_token.greedy_token()
            stopped = clock()
            steps.append(stopped - started)
            stacks.append(middle - started)
            heads.append(stopped - middle)
        hidden = next_token.hidden
        full = _timed(lambda: head.logits(hidden))
        stream = _timed(lambda: [p.sum() for p in parameters])
        whole = _timed(lambda: prefill(loaded, kv.KVState(), long_prompt, need_logits=False))
        step_s.append(statistics.median(steps))
        stack_s.append(statistics.median(stacks))
        head_s.append(statistics.median(heads))
        full_head_s.append(full)
        stream_s.append(stream)
        prefill_s.append(whole / len(long_prompt))
    step_s, stack_s, head_s, full_head_s, stream_s, prefill_s = (
        values[1:] for values in (step_s, stack_s, head_s, full_head_s, stream_s, prefill_s)
    )
    ms = lambda values: [1000 * v for v in values]  # noqa: E731
    return {
        "model": loaded.name,
        "dtype": str(loaded.dtype).replace("torch.", ""),
        "device": str(device),
        "parameters": sum(p.numel() for p in parameters),
        "weight_bytes": weight_bytes,
        "fast_greedy_head": head.scan_index() is not None,
        "decode_ms_per_token": spread(ms(step_s)),
        "decode_stack_ms": spread(ms(stack_s)),
        "decode_head_ms": spread(ms(head_s)),
        "tokens_per_second": spread([1 / s for s in step_s]),
        "prefill_ms_per_token": spread(ms(prefill_s)),
        "prefill_tokens": len(long_prompt),
        "limits": {
            "stream_weights_ms": spread(ms(stream_s)),
            "head_product_ms": spread(ms(full_head_s)),
        },
        "ratios": {
            "decode / stream weights": spread([s / w for s, w in zip(step_s, stream_s)]),
            "head / head product": spread([h / f for h, f in zip(head_s, full_head_s)]),
        },
    }


def full_run(pair, repeats: int, handoffs: list[str] | None = None) -> dict:
    """The page's default handoffs (or ``handoffs``) one after another on the locker preset, warm."""
    handoffs = list(handoffs or default_handoffs())
    request = HandoffRequest(
        query=FULL_RUN_QUERY, context=FULL_RUN_CONTEXT, generation=GenerationSettings(max_new_tokens=FULL_RUN_TOKENS)
    )
    walls, per_handoff, answers, tokens = [], {name: [] for name in handoffs}, {}, {}
    for repeat in range(repeats + 1):  # the first run warms up (calibration, fusers, head index)
        started = clock()
        for name in handoffs:
            result = run_handoff(name, pair, request)
            if repeat:
                per_handoff[name].append(result.total_seconds if result.applicable else 0.0)
            answers[name] = result.answer if result.applicable else f"(not applicable: {result.reason})"
            tokens[name] = result.tokens.get("generated", 0)
        if repeat:
            walls.append(clock() - started)
    return {
        "handoffs": list(handoffs),
        "query": FULL_RUN_QUERY,
        "context": FULL_RUN_CONTEXT,
        "max_new_tokens": FULL_RUN_TOKENS,
        "warm_full_run_seconds": spread(walls),
        "handoff_seconds": {name: spread(values) for name, values in per_handoff.items()},
        "generated_tokens": tokens,
        "answers": answers,
    }


def measure(pair, repeats: int, progress=None) -> dict:
    progress = progress or (lambda message: None)
    models = {}
    for loaded in (pair.sharer, pair.receiver, pair.kvcomm_sender):
        if loaded.name not in models:
            progress(f"speed of {loaded.name}")
            models[loaded.name] = model_speed(loaded, repeats)
    progress("warm full run of the page's handoffs")
    report = {
        "threads": torch.get_num_threads(),
        "models": list(models.values()),
        "full_run": full_run(pair, repeats),
    }
    report["decode_ms_per_token"] = {name: entry["decode_ms_per_token"]["median"] for name, entry in models.items()}
    report["warm_full_run_seconds"] = report["full_run"]["warm_full_run_seconds"]["median"]
    return report


def _fmt(entry: dict, digits: int = 1) -> str:
    if not entry or entry.get("median") is None:
        return "n/a"
    return f"{entry['median']:.{digits}f} [{entry['min']:.{digits}f}, {entry['max']:.{digits}f}]"


def markdown(speed: dict) -> str:
    lines = [
        f"**Speed of each model** ({speed['threads']} torch thread(s); a decode step = the decoder stack on one new "
        f"token + choosing the next token; after a {PROMPT_TOKENS}-token prompt; machine limits measured in the same run)",
        "",
        "| model | dtype | decode ms/token | stack ms | head ms | tokens/s | prefill ms/token | stream weights ms | "
        "head product ms | decode / stream | head / head product |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in speed["models"]:
        head_kind = "fast greedy" if entry["fast_greedy_head"] else "full"
        lines.append(
            f"| {entry['model']} | {entry['dtype']} | {_fmt(entry['decode_ms_per_token'])} | {_fmt(entry['decode_stack_ms'])} | "
            f"{_fmt(entry['decode_head_ms'])} ({head_kind}) | {_fmt(entry['tokens_per_second'])} | "
            f"{_fmt(entry['prefill_ms_per_token'], 2)} | {_fmt(entry['limits']['stream_weights_ms'])} | "
            f"{_fmt(entry['limits']['head_product_ms'])} | {_fmt(entry['ratios']['decode / stream weights'], 2)} | "
            f"{_fmt(entry['ratios']['head / head product'], 2)} |"
        )
    run = speed["full_run"]
    per = ", ".join(f"{name} {_fmt(value, 2)} s" for name, value in run["handoff_seconds"].items())
    lines += [
        "",
        f"**Warm full run** of {', '.join(run['handoffs'])} one after another on the locker preset "
        f"({run['max_new_tokens']} new tokens at most): **{_fmt(run['warm_full_run_seconds'], 2)} s**; {per}.",
    ]
    return "\n".join(lines) + "\n"
