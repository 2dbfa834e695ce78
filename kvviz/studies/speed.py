"""How fast each model runs here, beside what this machine allows: the speed part of ``bench --perf``.

For every model of the pair, measured in one process and reported as the median [min, max] over
repeats:

* ``decode_ms_per_token``: one greedy decode step as the decode loop runs it (the decoder stack on
  one new token, then the next token chosen by the output head), after a prompt of
  ``PROMPT_TOKENS`` tokens; split into the decoder stack and the head; tokens per second.
* ``batched_decode_ms``: the same step for 1, 2, 4 and 6 sequences at once (``BATCH_SIZES``), as
  the handoffs of a run share it (``kvviz.runtime.decode``; each sequence its own copy of the prompt's
  state), stack and head; ``decode_path`` says how the step is computed.
* ``prefill_ms_per_token``: a ``PREFILL_TOKENS``-token prompt through the decoder stack, per token.
* the machine's limits, measured in the same run:
  - ``stream_weights_ms``: reading every weight of the model once (a sum over each parameter
    tensor: the memory traffic of a decode step with no compute to speak of);
  - ``stack_stream_ms``: the same for the decoder stack's weights alone (what one decode step of the
    stack must read; the head has its own limit);
  - ``head_product_ms``: the full output-head product (hidden state x vocabulary) at the model's
    precision, the product the fast greedy head avoids;
  and the ratios ``decode / stream`` (1.0 would mean a decode step as fast as memory allows),
  ``stack / stack stream`` (``stack_stream_ratio``), ``head / head product`` and ``6 / 1`` (six
  sequences' step against one's).
* the warm run of the page's default handoffs on the locker preset (32 new tokens at most), after
  one warm-up run, wall time per repeat:
  - ``warm_full_run_seconds``: in this process, through the page's engine (``kvviz.engine.stream``: every
    handoff at once, decode steps shared per model), with each handoff's own total and the wall time
    from the start to its first streamed answer token (``first_token_wall_seconds``);
  - ``warm_serial_run_seconds``: in this process, one handoff after another (each alone);
  - ``warm_page_run_seconds``: through the page (``python app.py`` served on a free loopback port,
    its ``/run`` endpoint called with ``gradio_client``, computing every request: it keeps no
    finished run), when asked for (``bench --perf --speed-only``), and ``page_over_process_ratio``:
    that over ``warm_full_run_seconds`` (what the page adds to the same run).

Timings are wall-clock (``kvviz.runtime.measure.clock``, which waits for the GPU first), taken on whatever
else the machine is doing: compare the ratios, which are measured side by side, rather than
absolute values across runs.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch

from kvviz.core import paths
from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine.events import Done, Failed, Stopped, Token
from kvviz.engine.runner import run_handoff
from kvviz.engine.stream import default_workers, run
from kvviz.handoffs.registry import default_handoffs
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import decode_batch, decode_path, prefill
from kvviz.runtime.measure import clock, spread

PROMPT_TOKENS = 32
PREFILL_TOKENS = 128
DECODE_STEPS = 16
BATCH_SIZES = (1, 2, 4, 6)
PAGE_START_SECONDS = 300  # the served page must answer within this (it loads the models first)
FULL_RUN_QUERY = "What is the code for locker 12?"
FULL_RUN_CONTEXT = "The code for locker 12 is 4471."
FULL_RUN_TOKENS = 32


def _timed(function) -> float:
    started = clock()
    function()
    return clock() - started


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


def _decode_steps(loaded, base: kv.KVState, token: int, count: int) -> tuple[float, float]:
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
    limits beside them."""
    device = loaded.device
    parameters = [p for p in loaded.model.parameters()]
    stack = [p for p in loaded.model.model.layers.parameters()]
    weight_bytes = sum(p.numel() * p.element_size() for p in parameters)
    head = loaded.head
    head.scan_index()  # built (or read from disk) before timing
    sizes = BATCH_SIZES if decode_batch(loaded) is not None else (1,)  # (builds the batched step first)
    prompt = prompt_ids(loaded, PROMPT_TOKENS)
    long_prompt = prompt_ids(loaded, PREFILL_TOKENS)

    rounds = []  # per repeat: stack and head seconds per batch size, the limits, the prefill
    for _ in range(repeats + 1):  # the first round warms up and is dropped
        base = kv.KVState()
        first, _ = prefill(loaded, base, prompt)
        token = first.greedy_token()
        steps = {count: _decode_steps(loaded, base, token, count) for count in sizes}
        hidden = first.hidden
        rounds.append({
            "steps": steps,
            "full_head": _timed(lambda: head.logits(hidden)),
            "stream": _timed(lambda: [p.sum() for p in parameters]),
            "stack_stream": _timed(lambda: [p.sum() for p in stack]),
            "prefill": _timed(lambda: prefill(loaded, kv.KVState(), long_prompt, need_logits=False)) / len(long_prompt),
        })
    rounds = rounds[1:]
    ms = lambda values: spread([1000 * v for v in values])  # noqa: E731
    stack_s = [r["steps"][1][0] for r in rounds]
    head_s = [r["steps"][1][1] for r in rounds]
    step_s = [a + b for a, b in zip(stack_s, head_s)]
    batched = {str(count): ms([sum(r["steps"][count]) for r in rounds]) for count in sizes}
    batched_stack = {str(count): ms([r["steps"][count][0] for r in rounds]) for count in sizes}
    ratios = {
        "decode / stream weights": spread([s / r["stream"] for s, r in zip(step_s, rounds)]),
        "stack / stack stream": spread([s / r["stack_stream"] for s, r in zip(stack_s, rounds)]),
        "head / head product": spread([h / r["full_head"] for h, r in zip(head_s, rounds)]),
    }
    if 6 in sizes:
        ratios["6 / 1 sequences"] = spread([sum(r["steps"][6]) / sum(r["steps"][1]) for r in rounds])
    return {
        "model": loaded.name,
        "dtype": str(loaded.dtype).replace("torch.", ""),
        "device": str(device),
        "parameters": sum(p.numel() for p in parameters),
        "weight_bytes": weight_bytes,
        "stack_weight_bytes": sum(p.numel() * p.element_size() for p in stack),
        "fast_greedy_head": head.scan_index() is not None,
        "decode_path": decode_path(loaded),
        "decode_ms_per_token": ms(step_s),
        "decode_stack_ms": ms(stack_s),
        "decode_head_ms": ms(head_s),
        "tokens_per_second": spread([1 / s for s in step_s]),
        "batched_decode_ms": batched,
        "batched_decode_stack_ms": batched_stack,
        "prefill_ms_per_token": ms([r["prefill"] for r in rounds]),
        "prefill_tokens": len(long_prompt),
        "limits": {
            "stream_weights_ms": ms([r["stream"] for r in rounds]),
            "stack_stream_ms": ms([r["stack_stream"] for r in rounds]),
            "head_product_ms": ms([r["full_head"] for r in rounds]),
        },
        "ratios": ratios,
    }


def full_run_request() -> HandoffRequest:
    return HandoffRequest(
        query=FULL_RUN_QUERY, context=FULL_RUN_CONTEXT, generation=GenerationSettings(max_new_tokens=FULL_RUN_TOKENS)
    )


def full_run(pair, repeats: int, handoffs: list[str] | None = None) -> dict:
    """The page's default handoffs (or ``handoffs``) on the locker preset, warm, in this process:
    through the page's engine (``kvviz.engine.stream.run``, the page's default workers) and, in the
    same repeats, one after another (each alone)."""
    handoffs = list(handoffs or default_handoffs())
    request = full_run_request()
    together, serial, per_handoff, answers, tokens, batches = [], [], {name: [] for name in handoffs}, {}, {}, {}
    first_seen = {name: [] for name in handoffs}
    for repeat in range(repeats + 1):  # the first run warms up (calibration, fusers, head index)
        started = clock()
        done, first = {}, {}
        for event in (event for batch in run(pair.name, request, handoffs, default_workers(), loaded=pair) for event in batch):
            match event:
                case Token(name) if name not in first:
                    first[name] = clock() - started  # its first streamed token
                case Done(name, result):
                    first.setdefault(name, clock() - started)  # its result, if no token came first
                    done[name] = result
                case Failed(reason) | Stopped(reason):
                    raise RuntimeError(f"the warm full run could not finish: {reason}")
        if repeat:
            together.append(clock() - started)
            for name, seconds in first.items():
                first_seen[name].append(seconds)
        for name, data in done.items():
            if repeat:
                per_handoff[name].append(data["timings"].get("total", 0.0) if data["applicable"] else 0.0)
            answers[name] = data["answer"] if data["applicable"] else f"(not applicable: {data['reason']})"
            tokens[name] = data["tokens"].get("generated", 0)
            batches[name] = data["details"].get("decode_batches", [])
        started = clock()
        alone = {name: run_handoff(name, pair, request) for name in handoffs}
        if repeat:
            serial.append(clock() - started)
        for name, result in alone.items():
            if result.applicable and result.answer != answers.get(name):
                answers[name] += f" (alone: {result.answer!r})"
    return {
        "handoffs": list(handoffs),
        "query": FULL_RUN_QUERY,
        "context": FULL_RUN_CONTEXT,
        "max_new_tokens": FULL_RUN_TOKENS,
        "workers": default_workers(),
        "warm_full_run_seconds": spread(together),
        "warm_serial_run_seconds": spread(serial),
        "handoff_seconds": {name: spread(values) for name, values in per_handoff.items()},
        # wall seconds from the start of the run to each column's first streamed answer token
        "first_token_wall_seconds": {name: spread(values) for name, values in first_seen.items()},
        "generated_tokens": tokens,
        "decode_batches": batches,
        "answers": answers,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PageNotServed(RuntimeError):
    """``python app.py`` exited, or did not answer in time (the message says which)."""


def serve_page(pair_name: str, checkout: Path = paths.PROJECT_ROOT) -> tuple[subprocess.Popen, str]:
    """``python app.py`` of ``checkout`` (importing that checkout's kvviz) served on a free loopback
    port, once it answers: (the server, its URL). Stop it with ``stop_page``. It keeps no finished
    run (``KVVIZ_RUN_CACHE_MB=0``), so that every timed request is computed."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    # KVVIZ_RUN_CACHE_MB=0: a repeated request is computed again, not served from the finished runs
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", KVVIZ_RUN_CACHE_MB="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")])))
    server = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--host", "127.0.0.1", "--pair", pair_name],
                              cwd=checkout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + PAGE_START_SECONDS
    while True:
        if server.poll() is not None:
            raise PageNotServed(f"python app.py exited with code {server.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2).read(64)
            return server, url
        except OSError:
            if time.monotonic() > deadline:
                stop_page(server)
                raise PageNotServed(f"the page did not answer within {PAGE_START_SECONDS} s") from None
            time.sleep(1)


def stop_page(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()


def page_run(pair_name: str, repeats: int) -> dict:
    """The same warm run through the page: ``python app.py`` served on a free loopback port (one
    torch thread per handoff, as it serves; ``serve_page``), its ``/run`` endpoint called with
    ``gradio_client`` once to warm up, then ``repeats`` times; wall seconds of each call."""
    app = paths.PROJECT_ROOT / "app.py"
    if not app.is_file():
        return {"warm_page_run_seconds": spread([]), "skipped": f"{app} is not here (an installed package)"}
    from gradio_client import Client

    try:
        server, url = serve_page(pair_name)
    except PageNotServed as error:
        return {"warm_page_run_seconds": spread([]), "skipped": str(error)}
    try:
        client = Client(url, verbose=False)
        walls = []
        for repeat in range(repeats + 1):
            started = time.perf_counter()
            try:
                client.predict(pair=pair_name, query=FULL_RUN_QUERY, context=FULL_RUN_CONTEXT,
                               max_new_tokens=FULL_RUN_TOKENS, api_name="/run")
            except Exception as error:  # the page refused or failed: say so, measure nothing
                return {"warm_page_run_seconds": spread([]), "skipped": f"the page's /run failed: {error}"}
            if repeat:
                walls.append(time.perf_counter() - started)
        return {"warm_page_run_seconds": spread(walls), "how": "python app.py, /run through gradio_client"}
    finally:
        stop_page(server)


def measure(pair, repeats: int, progress=None, page: bool = False) -> dict:
    """The speed report; ``page``: also the warm run through the served page (``page_run``)."""
    progress = progress or (lambda message: None)
    models = {}
    for loaded in (pair.sharer, pair.receiver, pair.same_shape_sender):
        if loaded.name not in models:
            progress(f"speed of {loaded.name}")
            models[loaded.name] = model_speed(loaded, repeats)
    progress("warm full run of the page's handoffs")
    report = {
        "threads": torch.get_num_threads(),
        "models": list(models.values()),
        "full_run": full_run(pair, repeats),
    }
    if page:
        progress("the same run through the page (python app.py)")
        report["page_run"] = page_run(pair.name, repeats)
    report["decode_ms_per_token"] = {name: entry["decode_ms_per_token"]["median"] for name, entry in models.items()}
    report["batched_decode_ms"] = {
        name: {count: value["median"] for count, value in entry["batched_decode_ms"].items()} for name, entry in models.items()
    }
    report["stack_stream_ratio"] = {name: entry["ratios"]["stack / stack stream"]["median"] for name, entry in models.items()}
    report["warm_full_run_seconds"] = report["full_run"]["warm_full_run_seconds"]["median"]
    report["warm_serial_run_seconds"] = report["full_run"]["warm_serial_run_seconds"]["median"]
    report["warm_page_run_seconds"] = report["page_run"]["warm_page_run_seconds"]["median"] if page else None
    # what the page adds to the same run (the target: at most 1.2x), both measured in this report
    in_process = report["warm_full_run_seconds"]
    report["page_over_process_ratio"] = (report["warm_page_run_seconds"] / in_process
                                         if report["warm_page_run_seconds"] and in_process else None)
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
        "stack stream ms | head product ms | decode / stream | stack / stack stream | head / head product |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in speed["models"]:
        head_kind = "fast greedy" if entry["fast_greedy_head"] else "full"
        lines.append(
            f"| {entry['model']} | {entry['dtype']} | {_fmt(entry['decode_ms_per_token'])} | {_fmt(entry['decode_stack_ms'])} | "
            f"{_fmt(entry['decode_head_ms'])} ({head_kind}) | {_fmt(entry['tokens_per_second'])} | "
            f"{_fmt(entry['prefill_ms_per_token'], 2)} | {_fmt(entry['limits']['stream_weights_ms'])} | "
            f"{_fmt(entry['limits']['stack_stream_ms'])} | {_fmt(entry['limits']['head_product_ms'])} | "
            f"{_fmt(entry['ratios']['decode / stream weights'], 2)} | {_fmt(entry['ratios']['stack / stack stream'], 2)} | "
            f"{_fmt(entry['ratios']['head / head product'], 2)} |"
        )
    sizes = list(BATCH_SIZES)
    lines += [
        "",
        "**Decode steps shared by several sequences** (ms per step, stack + head, each sequence its own copy of the "
        "prompt's state; how the step is computed after the table)",
        "",
        "| model | " + " | ".join(f"{count} sequence{'s' if count > 1 else ''}" for count in sizes) + " | 6 / 1 |",
        "|---|" + "---|" * (len(sizes) + 1),
    ]
    for entry in speed["models"]:
        cells = [_fmt(entry["batched_decode_ms"].get(str(count), {})) for count in sizes]
        lines.append(f"| {entry['model']} | " + " | ".join(cells) + f" | {_fmt(entry['ratios'].get('6 / 1 sequences', {}), 2)} |")
    for entry in speed["models"]:
        path = entry["decode_path"]
        how = (f"batched step, {path['products']}, at least {path['rows_at_least']} rows a call"
               if path["batched"] else f"the model's own forward, one sequence at a time ({path['reason']})")
        lines.append(f"- {entry['model']}: {how}")
    run = speed["full_run"]
    per = ", ".join(f"{name} {_fmt(value, 2)} s" for name, value in run["handoff_seconds"].items())
    side_by_side = "all at once" if run["workers"] == 0 else f"{run['workers']} at a time"
    lines += [
        "",
        f"**Warm run** of {', '.join(run['handoffs'])} on the locker preset ({run['max_new_tokens']} new tokens at most), "
        f"in this process: through the page's engine ({side_by_side}, decode steps shared per model) "
        f"**{_fmt(run['warm_full_run_seconds'], 2)} s**; one after another **{_fmt(run['warm_serial_run_seconds'], 2)} s**. "
        f"Each handoff's own total in the shared run: {per}. Its first answer token streamed after "
        + ", ".join(f"{name} {_fmt(value, 2)} s" for name, value in run["first_token_wall_seconds"].items()) + " (wall, from the start).",
    ]
    page = speed.get("page_run")
    if page is not None:
        measured = _fmt(page["warm_page_run_seconds"], 2)
        ratio = speed.get("page_over_process_ratio")
        lines.append(f"Through the page (python app.py, its /run endpoint): **{measured} s**"
                     + (f" (not measured: {page['skipped']})" if "skipped" in page else "")
                     + (f", {ratio:.2f}x the run in this process" if ratio else "") + ".")
    return "\n".join(lines) + "\n"
