"""The kvviz lab in the browser: Gradio Blocks, layout and event wiring.

The page runs one query through every handoff side by side (receiver alone, text, C2C, KVComm,
Skyline), streams each answer, and plots what happened inside with the pure functions of
``kvviz.plots``. Nothing here knows how a handoff works: it builds a ``HandoffRequest``, calls
``kvviz.engine.run_handoff`` and shows the ``HandoffResult``.

Serving rules kept here:
* models load once per process (``kvviz.models.load_model`` caches them); per-user data lives only
  in ``gr.State`` and event arguments, never in module globals;
* every model-running event shares one queue (``concurrency_id="models"``), limit
  ``KVVIZ_CONCURRENCY`` (default 1: one model run at a time uses every core already);
* every event has an explicit ``api_name`` so scripts can drive the app with ``gradio_client``;
* user text (query, context, answers, prompts) only ever goes into text boxes or escaped
  markdown: it is shown as text, never run as HTML.
"""

from __future__ import annotations

import csv
import functools
import html
import json
import os
import queue
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import gradio as gr

from kvviz import plots
from kvviz.handoffs import DESCRIPTIONS, HANDOFFS
from kvviz.handoffs.kvcomm import STRATEGIES
from kvviz.models import EMBEDDED_MODELS, PAIRS, resolve_pair
from kvviz.presets import (
    ASSETS_DIR,
    DEFAULT_PRESET,
    PRESETS,
    SWEEP_ITEMS,
    SWEEP_METRIC,
    SWEEP_RATIOS,
    SWEEP_STRATEGIES,
    load_precomputed,
    load_precomputed_sweep,
    preset,
)
from kvviz.results import STAGES, GenerationSettings, HandoffRequest, HandoffResult, KVCommOptions

# The columns, in the order they appear on the page.
COLUMNS = ("receiver", "text", "c2c", "kvcomm", "skyline")
COLUMN_TITLES = {
    "receiver": "Receiver alone",
    "text": "Text message",
    "c2c": "C2C: cache fusion",
    "kvcomm": "KVComm: selected layers",
    "skyline": "Skyline: sees everything",
}
MODEL_QUEUE = "models"
MAX_UI_NEW_TOKENS = 256
STREAM_INTERVAL = 0.12  # seconds between streamed UI updates
DIAGRAM_DIR = ASSETS_DIR / "diagrams"

C2C_OFF_REASON = (
    "C2C is off in this build: its handoff (kvviz/handoffs/c2c.py) is not registered yet, so there is "
    "no fuser to run. The column lights up by itself once it is."
)

CSS = """
.kv-col-head {border-radius: 8px; padding: 6px 10px; color: #fff; font-weight: 600; margin-bottom: 4px; min-height: 4.9em;
  box-sizing: border-box}
.kv-col-head small {display: block; font-weight: 400; opacity: 0.95; font-size: 0.82em; line-height: 1.25}
.kv-stats {font-size: 0.9em; min-height: 3.2em}
.kv-stats p {margin: 0.15em 0}
.kv-badge {display: inline-block; padding: 1px 7px; border-radius: 9px; font-size: 0.8em; background: #fff3cd;
  color: #7a5b00; border: 1px solid #e6cf7d}
.kv-status {font-size: 0.95em}
.kv-diagram svg {max-width: 100%; height: auto}
.kv-walk {border-left: 4px solid #0072B2; padding-left: 12px}
#kv-title h1 {margin-bottom: 0}
"""


# --- pure helpers (no Gradio, testable) ---------------------------------------------------------


def c2c_registered() -> bool:
    return "c2c" in HANDOFFS


def column_names() -> tuple[str, ...]:
    return COLUMNS


def c2c_off_result(pair_name: str) -> dict:
    return HandoffResult.not_applicable("c2c", pair_name, C2C_OFF_REASON).to_dict()


def build_request(
    query: str,
    context: str | None,
    max_new_tokens: int = 32,
    sample: bool = False,
    temperature: float = 0.7,
    seed: int = 0,
    message_tokens: int = 64,
    ratio: float = 0.5,
    strategy: str = "kvcomm",
    alpha: float | None = None,
    sigma: float = 10.0,
    layers: str = "",
) -> HandoffRequest:
    """Turn the form's values into a request; a ValueError says what is wrong in plain words."""
    layer_list = None
    if layers and layers.strip():
        try:
            layer_list = tuple(sorted({int(part) for part in layers.replace(" ", ",").split(",") if part.strip()}))
        except ValueError as error:
            raise ValueError(f"Explicit layers must be numbers separated by commas, e.g. 0,3,7 (got {layers!r}).") from error
        strategy = "explicit"
    elif strategy == "explicit":
        raise ValueError("The 'explicit' strategy needs a list of layers, e.g. 0,3,7.")
    return HandoffRequest(
        query=(query or "").strip(),
        context=(context or "").strip() or None,
        generation=GenerationSettings(
            max_new_tokens=int(max_new_tokens), greedy=not sample, temperature=float(temperature), seed=int(seed)
        ),
        text_message_tokens=int(message_tokens),
        kvcomm=KVCommOptions(
            ratio=float(ratio),
            strategy=strategy,
            alpha=None if alpha is None else float(alpha),
            sigma=float(sigma),
            layers=layer_list,
            seed=int(seed),
        ),
    )


def _md(text) -> str:
    """Escape text for a markdown cell: HTML and the markdown characters that change layout."""
    escaped = str(text)
    for char in "\\`*_[]#|~<>&":
        escaped = escaped.replace(char, "\\" + char)
    return escaped


def format_seconds(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def stats_markdown(result: dict | None, state: str = "") -> str:
    """The small block under each answer: latency, bytes, tokens; or why it does not apply."""
    if result is None:
        return {"running": "*running ...*", "waiting": "*waiting for its turn*"}.get(state, "*not run yet*")
    if not result.get("applicable", True):
        return f"**Not applicable:** {_md(result.get('reason', ''))}"
    timings = result.get("timings", {})
    parts = [f"**{format_seconds(float(timings.get('total', 0.0)))}** total"]
    if result.get("first_token_seconds") is not None:
        parts.append(f"first token {format_seconds(float(result['first_token_seconds']))}")
    sent = int(result.get("bytes_communicated", 0))
    kind = result.get("communication") or "none"
    sent_text = "nothing sent" if sent == 0 else f"**{plots.human_bytes(sent)}** sent as {_md(kind)}"
    lines = [" · ".join(parts), sent_text + f" · {int(result.get('tokens', {}).get('generated', 0))} tokens answered"]
    details = result.get("details", {})
    if result.get("handoff") == "kvcomm" and "selected_layers" in details:
        lines.append(f"layers sent: {_md(', '.join(str(x) for x in details['selected_layers']))}")
    if result.get("handoff") == "text":
        lines.append(f"message: {int(result.get('tokens', {}).get('message', 0))} tokens")
    if result.get("handoff") == "c2c" and result.get("layers"):
        open_k = sum(bool(r.get("gate_k_open")) for r in result["layers"])
        open_v = sum(bool(r.get("gate_v_open")) for r in result["layers"])
        lines.append(f"gates open: {open_k} K, {open_v} V of {len(result['layers'])} layers")
    if result.get("precomputed"):
        lines.append('<span class="kv-badge">precomputed</span>')
    return "\n\n".join(lines)


def answer_text(result: dict | None, partial: str | None = None) -> str:
    if partial is not None:
        return partial
    if result is None:
        return ""
    if not result.get("applicable", True):
        return "(not applicable)"
    return result.get("answer", "")


SEEN_TITLES = {"sharer": "What the sharer read", "message": "The message it wrote", "receiver": "What the receiver read"}


def seen_text(result: dict | None) -> str:
    """What each model saw, as plain text (prompt templates included)."""
    if not result or not result.get("seen"):
        return ""
    blocks = []
    for key in ("sharer", "message", "receiver"):
        if key in result["seen"]:
            blocks.append(f"--- {SEEN_TITLES[key]} ---\n{result['seen'][key]}")
    for key, value in result["seen"].items():
        if key not in SEEN_TITLES:
            blocks.append(f"--- {key} ---\n{value}")
    return "\n\n".join(blocks)


def payload(pair: str, request: dict | None, results: list[dict], precomputed: bool, preset_key: str | None = None) -> dict:
    """The structured results of one run: what the JSON box shows and the export writes."""
    return {
        "pair": pair,
        "preset": preset_key,
        "precomputed": precomputed,
        "request": request,
        "results": results,
        "c2c_registered": c2c_registered(),
    }


CSV_FIELDS = (
    ["handoff", "applicable", "reason", "answer", "bytes_communicated", "communication"]
    + [f"{stage}_s" for stage in STAGES]
    + ["total_s", "first_token_s", "generated_tokens", "message_tokens", "selected_layers", "precomputed"]
)


def csv_rows(data: dict) -> list[dict]:
    rows = []
    for result in data.get("results", []):
        timings = result.get("timings", {})
        row = {
            "handoff": result.get("handoff"),
            "applicable": result.get("applicable", True),
            "reason": result.get("reason", ""),
            "answer": result.get("answer", ""),
            "bytes_communicated": result.get("bytes_communicated", 0),
            "communication": result.get("communication", ""),
            "total_s": timings.get("total", ""),
            "first_token_s": result.get("first_token_seconds", ""),
            "generated_tokens": result.get("tokens", {}).get("generated", ""),
            "message_tokens": result.get("tokens", {}).get("message", ""),
            "selected_layers": " ".join(str(x) for x in result.get("details", {}).get("selected_layers", [])),
            "precomputed": result.get("precomputed", False),
        }
        row.update({f"{stage}_s": timings.get(stage, "") for stage in STAGES})
        rows.append(row)
    return rows


def write_exports(data: dict, folder: str | Path) -> list[str]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    json_path = folder / f"kvviz-results-{stamp}.json"
    csv_path = folder / f"kvviz-results-{stamp}.csv"
    json_path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    with csv_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(csv_rows(data))
    return [str(json_path), str(csv_path)]


@functools.lru_cache(maxsize=32)
def model_facts_row(name: str) -> dict:
    """Architecture facts of a model without loading its weights or its (large) tokenizer: the
    loaded model's facts when this process has it, else the converted folder's config.json."""
    from kvviz import models

    for (loaded_name, _, _), loaded in list(models._loaded.items()):
        if loaded_name == name:
            return loaded.facts.to_dict()
    if name not in EMBEDDED_MODELS:
        return {"status": "loads from the Hugging Face hub when run (needs network or a warm hub cache)"}
    if not models.is_prepared(name):
        return {"status": "not prepared yet: python -m kvviz prepare (or the first run converts it)"}
    from transformers import AutoConfig

    folder = models.converted_dir(name)
    facts = models.facts_from_config(name, AutoConfig.from_pretrained(folder)).to_dict()
    template = (folder / "chat_template.jinja").exists()
    try:
        template = template or "chat_template" in json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        pass
    facts["has_chat_template"] = template
    return facts


def pair_facts_markdown(pair_name: str) -> str:
    """The pair's models and their architecture facts, without loading weights."""
    try:
        spec = resolve_pair(pair_name)
    except ValueError as error:
        return f"**{_md(error)}**"
    roles = [("sharer", spec.sharer), ("receiver", spec.receiver)]
    if spec.kvcomm_sender_name != spec.sharer:
        roles.append(("KVComm sender", spec.kvcomm_sender_name))
    lines = [
        _md(spec.description),
        "",
        "| role | model | architecture | layers | heads | KV heads | head dim | vocabulary | chat template |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for role, name in roles:
        try:
            row = model_facts_row(name)
        except Exception as error:  # a listing must not break the page
            row = {"status": f"unavailable ({type(error).__name__}: {error})"}
        if "num_layers" in row:
            lines.append(
                f"| {role} | {_md(name)} | {_md(row['architecture'])} | {row['num_layers']} | {row['num_heads']} | "
                f"{row['num_kv_heads']} | {row['head_dim']} | {row['vocab_size']:,} | {'yes' if row['has_chat_template'] else 'no'} |"
            )
        else:
            lines.append(f"| {role} | {_md(name)} | {_md(row.get('status', '?'))} | | | | | | |")
    if spec.needs_network:
        lines.append("\nThis pair needs network access (or models already in the hub cache).")
    return "\n".join(lines)


def header_html(name: str) -> str:
    """A column's coloured title (project text only, no user input)."""
    color = plots.color_of(name)
    return (
        f'<div class="kv-col-head" style="background:{color}">{html.escape(COLUMN_TITLES[name])}'
        f"<small>{html.escape(DESCRIPTIONS.get(name, ''))}</small></div>"
    )


# --- runs ---------------------------------------------------------------------------------------


class _Cancelled(Exception):
    """Raised inside a token callback to stop a run the user left or cancelled."""


def stream_handoffs(pair_name: str, request: HandoffRequest, names=COLUMNS):
    """Run the handoffs one after another in a worker thread; yield ``(kind, name, data)`` events:
    ``status``, ``start``, ``token`` (answer so far), ``done`` (result dict), ``error``.

    Closing the generator (the user cancelled or left) stops the worker at its next token.
    """
    from kvviz.engine import load_pair, run_handoff

    events: queue.Queue = queue.Queue()
    cancel = threading.Event()

    def worker():
        try:
            events.put(("status", None, f"Loading the pair '{pair_name}' (once per server) ..."))
            pair = load_pair(pair_name, progress=lambda message: events.put(("status", None, str(message))))
            for name in names:
                if cancel.is_set():
                    return
                if name == "c2c" and not c2c_registered():
                    events.put(("done", name, c2c_off_result(pair.name)))
                    continue
                events.put(("start", name, None))

                def on_token(text, _name=name):
                    if cancel.is_set():
                        raise _Cancelled()
                    events.put(("token", _name, text))

                result = run_handoff(name, pair, request, on_token=on_token)
                events.put(("done", name, result.to_dict()))
        except _Cancelled:
            pass
        except Exception as error:  # shown to the user; the server keeps running
            events.put(("error", None, f"{type(error).__name__}: {error}"))
        finally:
            events.put(("end", None, None))

    thread = threading.Thread(target=worker, name="kvviz-run", daemon=True)
    thread.start()
    try:
        while True:
            event = events.get()
            if event[0] == "end":
                return
            yield event
    finally:
        cancel.set()


def run_sweep_data(pair_name, strategies, max_new_tokens: int = 12, items=None, progress=None) -> dict:
    """KVComm accuracy against the layer ratio for each strategy on the built-in set, with the
    receiver alone and Skyline as references. Ratio 0 and ratio 1 send the same layers under every
    strategy, so they run once and are shared."""
    from kvviz.data import contains_answer
    from kvviz.engine import load_pair, run_handoff

    items = list(items or SWEEP_ITEMS)
    strategies = [s for s in (strategies or ["kvcomm"]) if s in STRATEGIES and s != "explicit"] or ["kvcomm"]
    pair = pair_name if hasattr(pair_name, "receiver") else load_pair(pair_name)  # a name or a LoadedPair
    generation = GenerationSettings(max_new_tokens=int(max_new_tokens))
    shared_ratios = [r for r in SWEEP_RATIOS if r in (0.0, 1.0)]
    inner_ratios = [r for r in SWEEP_RATIOS if r not in (0.0, 1.0)]
    total = len(items) * (2 + len(shared_ratios) + len(inner_ratios) * len(strategies))
    done = 0
    started = time.perf_counter()

    def tick(description):
        nonlocal done
        done += 1
        if progress is not None:
            progress(done / total, desc=description)

    baseline_correct = {"receiver": 0, "skyline": 0}
    correct: dict[tuple[str, float], int] = {}
    layer_counts: dict[tuple[str, float], int] = {}
    answers = []
    for index, item in enumerate(items):
        for name in ("receiver", "skyline"):
            request = HandoffRequest(query=item["query"], context=item["context"], generation=generation)
            result = run_handoff(name, pair, request)
            hit = result.applicable and contains_answer(result.answer, item["answers"])
            baseline_correct[name] += int(hit)
            answers.append({"item": index, "handoff": name, "answer": result.answer, "correct": bool(hit)})
            tick(f"question {index + 1}/{len(items)}: {name}")
        for ratio in shared_ratios + inner_ratios:
            for strategy in strategies if ratio in inner_ratios else [strategies[0]]:
                request = HandoffRequest(
                    query=item["query"],
                    context=item["context"],
                    generation=generation,
                    kvcomm=KVCommOptions(ratio=ratio, strategy=strategy),
                )
                result = run_handoff("kvcomm", pair, request)
                hit = result.applicable and contains_answer(result.answer, item["answers"])
                targets = strategies if ratio in shared_ratios else [strategy]
                for target in targets:
                    correct[(target, ratio)] = correct.get((target, ratio), 0) + int(hit)
                    layer_counts[(target, ratio)] = int(result.details.get("num_selected", 0))
                answers.append(
                    {"item": index, "handoff": "kvcomm", "strategy": strategy, "ratio": ratio, "answer": result.answer, "correct": bool(hit)}
                )
                tick(f"question {index + 1}/{len(items)}: KVComm {strategy}, ratio {ratio:.2f}")
    n = len(items)
    points = [
        {
            "strategy": strategy,
            "ratio": ratio,
            "layers": layer_counts.get((strategy, ratio), 0),
            "correct": correct.get((strategy, ratio), 0),
            "n": n,
            "accuracy": correct.get((strategy, ratio), 0) / n,
        }
        for strategy in strategies
        for ratio in SWEEP_RATIOS
    ]
    return {
        "pair": pair.name,
        "n": n,
        "metric": SWEEP_METRIC,
        "max_new_tokens": int(max_new_tokens),
        "strategies": strategies,
        "points": points,
        "baselines": {name: count / n for name, count in baseline_correct.items()},
        "answers": answers,
        "seconds": time.perf_counter() - started,
        "precomputed": False,
    }


# --- the page -----------------------------------------------------------------------------------


def _diagram(name: str) -> str:
    path = DIAGRAM_DIR / f"{name}.svg"
    try:
        return f'<div class="kv-diagram">{path.read_text(encoding="utf-8")}</div>'
    except OSError:
        return ""


HOW_IT_WORKS = {
    "receiver": (
        "The receiver model answers the question by itself. Nothing comes from the other model, so "
        "this is the floor: any handoff worth having should beat it."
    ),
    "text": (
        "The sharer reads what it knows and writes a short message in words. The receiver reads that "
        "message in front of the question. Easy to understand and tiny to send, but slow: the sharer has "
        "to write its whole message token by token before the receiver can start, and whatever the sharer "
        "leaves out is lost."
    ),
    "c2c": (
        "Cache-to-Cache. Both models read the same question. A small trained network, the fuser, turns the "
        "sharer's memory of the question (its KV cache) into something the receiver understands and adds it "
        "to the receiver's own cache, layer by layer. A gate per layer decides whether that layer takes the "
        "sharer's help at all. Then the receiver answers alone. No words are written in between."
    ),
    "kvcomm": (
        "Only the sharer reads the private context. Instead of writing a message it hands over its KV "
        "cache of the context, but only for some layers of the receiver. To pick them, KVComm measures once "
        "how much each layer of the receiver looks at the context (attention importance), mixes that with "
        "a bell curve that prefers middle layers (the prior), and sends the top-scoring share r of layers. "
        "It needs two models of the same shape."
    ),
    "skyline": (
        "The receiver gets the context and the question in one prompt, as if it knew everything itself. "
        "No handoff can do better than this, so it is the ceiling."
    ),
}

WALKTHROUGH = [
    (
        "Step 1 of 7: the puzzle",
        "locker",
        "We loaded the preset **Locker code**. A *sharer* model has read a note: *the code for locker 12 is 4471*. "
        "A *receiver* model gets only the question *What is the code for locker 12?*. The receiver must answer, "
        "so the note has to travel from one model to the other somehow. Each coloured column below is one way "
        "to make that trip.",
    ),
    (
        "Step 2 of 7: the receiver alone (grey)",
        None,
        "Look at the grey column. The receiver never saw the note, so it can only guess. Open *What each "
        "model saw* under it: the prompt holds the question and nothing else.",
    ),
    (
        "Step 3 of 7: a text message (orange)",
        None,
        "The sharer writes the facts down in words and the receiver reads them. Open *What each model saw* to "
        "read the message. Then find the orange bar in **Latency by stage**: most of its time is the sharer "
        "*writing*, before the receiver can even start.",
    ),
    (
        "Step 4 of 7: KVComm (green)",
        None,
        "Here the sharer sends no words. It sends its internal memory of the note (the *KV cache*) into some "
        "of the receiver's layers. The plot **KVComm: which layers get the context** shows, per layer, how much "
        "that layer looked at the context, the bell-curve prior, and their mix. Layers with a dark outline and "
        "a triangle were chosen.",
    ),
    (
        "Step 5 of 7: Skyline (purple) and C2C (blue)",
        None,
        "Skyline gives the receiver the note directly: the best any handoff can hope for. C2C fuses the "
        "sharer's cache into the receiver's with a small trained network; it shines on *shared questions* "
        "where both models read the same text (try the preset **Boiling water**).",
    ),
    (
        "Step 6 of 7: what it costs",
        None,
        "**What crosses between the models** compares sizes on a log scale: a text message is a few dozen "
        "bytes, a KV cache is hundreds of kilobytes. Text is small but slow to write; KV is big but needs no "
        "writing. Which is better depends on the network and on the time you have.",
    ),
    (
        "Step 7 of 7: your turn",
        None,
        "Press **Run** to run every handoff live on this machine. Then open *Settings*, change the KVComm "
        "ratio (the share of layers sent), and run again. Finally press **Run sweep** below to see how the "
        "ratio changes the number of right answers on a few built-in questions.",
    ),
]


def walkthrough_markdown(step: int) -> str:
    title, _, text = WALKTHROUGH[step]
    return f"### {title}\n\n{text}"


def build_demo(
    precomputed: dict | None = None,
    sweep: dict | None = None,
    default_pair: str = "embedded",
    default_max_new_tokens: int = 32,
) -> gr.Blocks:
    """Build the Blocks app. ``precomputed``/``sweep`` default to the files in assets/;
    ``default_max_new_tokens`` sets the slider's start value (tests use a small one)."""
    precomputed = load_precomputed() if precomputed is None else precomputed
    sweep = load_precomputed_sweep() if sweep is None else sweep
    concurrency = max(1, int(os.environ.get("KVVIZ_CONCURRENCY", "1")))
    pre_presets = precomputed.get("presets", {})
    pre_pair = precomputed.get("pair", default_pair)

    def view_for_preset(key: str) -> tuple[dict, str]:
        """The payload and status line for a preset's precomputed results (or an empty page)."""
        entry = pre_presets.get(key)
        if not entry:
            return payload(default_pair, None, [], True, key), (
                f"No precomputed results for **{_md(preset(key).title)}**: press **Run** to compute them live."
            )
        results = [dict(r, precomputed=True) for r in entry["results"]]
        if not c2c_registered() and not any(r["handoff"] == "c2c" for r in results):
            results.append(dict(c2c_off_result(pre_pair), precomputed=True))
        when = precomputed.get("generated", "")
        status = (
            f'<span class="kv-badge">precomputed</span> Showing results computed ahead of time for '
            f"**{_md(preset(key).title)}** on the pair *{_md(pre_pair)}*"
            + (f" ({_md(when)})" if when else "")
            + ". Press **Run** for a live run on this machine.\n\n"
            + f"*What to look at:* {_md(preset(key).note)}"
        )
        return payload(pre_pair, entry.get("request"), results, True, key), status

    def outputs_for(data: dict, partial: dict | None = None, states: dict | None = None) -> list:
        """Values for the per-column components and the figures, in ``run_outputs`` order."""
        partial, states = partial or {}, states or {}
        by_name = {r["handoff"]: r for r in data.get("results", [])}
        values = []
        for name in COLUMNS:
            result = by_name.get(name)
            values.append(answer_text(result, partial.get(name)))
            values.append(stats_markdown(result, states.get(name, "")))
            values.append(seen_text(result))
        figures = plots.all_figures(data.get("results", []))
        values += [figures["kvcomm"], figures["c2c"], figures["latency"], figures["bytes"]]
        return values

    initial_data, initial_status = view_for_preset(DEFAULT_PRESET)
    initial_values = outputs_for(initial_data)
    first = preset(DEFAULT_PRESET)

    with gr.Blocks(title="kvviz: watch two language models talk") as demo:
        results_state = gr.State(initial_data)
        walk_step = gr.State(0)

        gr.Markdown(
            "# kvviz: watch two language models talk\n"
            "One question, five ways for a *sharer* model to help a *receiver* model answer it: nothing, a text "
            "message, cache fusion (C2C), selected KV layers (KVComm), or the whole context (Skyline). "
            "Every column runs on the same pair; the plots show what happened inside.",
            elem_id="kv-title",
        )
        with gr.Accordion("Guided walk-through: new here? start with this", open=False, elem_id="kv-walkthrough"):
            walk_text = gr.Markdown(walkthrough_markdown(0), elem_classes=["kv-walk"])
            with gr.Row():
                walk_back = gr.Button("Back", size="sm", elem_id="kv-walk-back")
                walk_next = gr.Button("Next step", size="sm", variant="primary", elem_id="kv-walk-next")

        with gr.Row():
            with gr.Column(scale=1, min_width=220):
                pair = gr.Dropdown(
                    choices=list(PAIRS),
                    value=default_pair,
                    label="Model pair (sharer -> receiver)",
                    allow_custom_value=True,
                    info="A registered pair, or SHARER+RECEIVER with any two model names.",
                    elem_id="kv-pair",
                )
            with gr.Column(scale=3):
                with gr.Accordion("The pair's architecture facts", open=False):
                    facts = gr.Markdown(pair_facts_markdown(default_pair), elem_id="kv-facts")

        preset_choice = gr.Radio(
            choices=[(p.label, p.key) for p in PRESETS],
            value=DEFAULT_PRESET,
            label="Presets: one click loads a question (results shown are precomputed until you press Run)",
            elem_id="kv-presets",
        )
        with gr.Row():
            query = gr.Textbox(
                value=first.query,
                label="Query (both models see it)",
                lines=2,
                max_lines=6,
                elem_id="kv-query",
            )
            context = gr.Textbox(
                value=first.context or "",
                label="Private context (only the sharer sees it; leave empty for a shared question)",
                lines=2,
                max_lines=8,
                elem_id="kv-context",
            )
        with gr.Accordion("Settings", open=False, elem_id="kv-settings"):
            with gr.Row():
                max_new_tokens = gr.Slider(1, MAX_UI_NEW_TOKENS, value=int(default_max_new_tokens), step=1, label="Max new tokens (answer length bound)")
                message_tokens = gr.Slider(1, 256, value=64, step=1, label="Text handoff: message length bound (tokens)")
            with gr.Row():
                sample = gr.Checkbox(value=False, label="Sample instead of greedy decoding")
                temperature = gr.Slider(0.05, 2.0, value=0.7, step=0.05, label="Temperature (when sampling)")
                seed = gr.Number(value=0, precision=0, label="Seed (sampling and random layers)")
            with gr.Row():
                ratio = gr.Slider(0.0, 1.0, value=0.5, step=0.05, label="KVComm ratio r (share of layers sent)")
                strategy = gr.Dropdown(
                    choices=[s for s in STRATEGIES if s != "explicit"], value="kvcomm", label="KVComm layer selection"
                )
                layers = gr.Textbox(value="", label="KVComm explicit layers (e.g. 0,3,7; overrides the strategy)")
            with gr.Row():
                alpha_auto = gr.Checkbox(value=True, label="Paper's alpha for this model family")
                alpha = gr.Slider(0.0, 1.0, value=0.8, step=0.05, label="alpha (weight of attention vs prior)")
                sigma = gr.Slider(0.5, 30.0, value=10.0, step=0.5, label="sigma (width of the Gaussian prior, layers)")

        with gr.Row():
            run_button = gr.Button("Run all handoffs live", variant="primary", elem_id="kv-run", scale=2)
            stop_button = gr.Button("Stop", variant="stop", elem_id="kv-stop", scale=1)
        status = gr.Markdown(initial_status, elem_id="kv-status", elem_classes=["kv-status"])

        column_outputs: list = []
        with gr.Row(equal_height=False):
            for index, name in enumerate(COLUMNS):
                with gr.Column(min_width=180, elem_id=f"kv-col-{name}"):
                    gr.HTML(header_html(name))
                    answer_box = gr.Textbox(
                        value=initial_values[3 * index],
                        label="Answer",
                        lines=3,
                        max_lines=10,
                        interactive=False,
                        elem_id=f"kv-answer-{name}",
                    )
                    stats = gr.Markdown(initial_values[3 * index + 1], elem_id=f"kv-stats-{name}", elem_classes=["kv-stats"])
                    with gr.Accordion("What each model saw", open=False):
                        seen = gr.Textbox(
                            value=initial_values[3 * index + 2],
                            show_label=False,
                            lines=6,
                            max_lines=20,
                            interactive=False,
                            elem_id=f"kv-seen-{name}",
                        )
                    column_outputs += [answer_box, stats, seen]

        gr.Markdown("## Inside the run")
        plot_kvcomm = gr.Plot(initial_values[15], label="KVComm layers", elem_id="kv-plot-kvcomm")
        plot_c2c = gr.Plot(initial_values[16], label="C2C gates", elem_id="kv-plot-c2c")
        with gr.Row():
            plot_latency = gr.Plot(initial_values[17], label="Latency", elem_id="kv-plot-latency")
            plot_bytes = gr.Plot(initial_values[18], label="Bytes", elem_id="kv-plot-bytes")
        plot_outputs = [plot_kvcomm, plot_c2c, plot_latency, plot_bytes]

        gr.Markdown(
            "## Sweep: how many layers does KVComm need?\n"
            f"Runs KVComm on {len(SWEEP_ITEMS)} built-in private-context questions at ratios "
            f"{', '.join(str(r) for r in SWEEP_RATIOS)} for each chosen layer-selection strategy, plus the receiver "
            "alone and Skyline as references. It takes a while on a CPU; the progress bar tracks it."
        )
        with gr.Row():
            sweep_strategies = gr.CheckboxGroup(
                choices=list(SWEEP_STRATEGIES), value=["kvcomm", "contiguous", "random"], label="Strategies", scale=3
            )
            sweep_tokens = gr.Slider(2, 32, value=12, step=1, label="Max new tokens per answer", scale=2)
            sweep_button = gr.Button("Run sweep", elem_id="kv-sweep", scale=1)
        sweep_status = gr.Markdown(
            ('<span class="kv-badge">precomputed</span> Sweep computed ahead of time; press **Run sweep** to redo it live.')
            if sweep
            else "No sweep yet.",
            elem_id="kv-sweep-status",
        )
        sweep_plot = gr.Plot(plots.sweep_figure(sweep), label="Sweep", elem_id="kv-plot-sweep")
        sweep_json = gr.JSON(sweep or {}, label="Sweep data", visible=False)

        with gr.Tabs():
            with gr.Tab("How it works", elem_id="kv-tab-how"):
                for name in COLUMNS:
                    with gr.Accordion(COLUMN_TITLES[name], open=name in ("kvcomm",)):
                        with gr.Row():
                            gr.HTML(_diagram(name))
                            gr.Markdown(HOW_IT_WORKS[name])
            with gr.Tab("Results as data", elem_id="kv-tab-data"):
                export_button = gr.Button("Export JSON and CSV", elem_id="kv-export")
                export_files = gr.File(label="Downloads", file_count="multiple", interactive=False)
                results_json = gr.JSON(initial_data, label="Structured results (what the run endpoint returns)")

        run_outputs = [status, *column_outputs, *plot_outputs, results_json, results_state]
        answer_boxes, stats_boxes = column_outputs[0::3], column_outputs[1::3]
        settings_inputs = [max_new_tokens, sample, temperature, seed, message_tokens, ratio, strategy, alpha_auto, alpha, sigma, layers]

        # --- events ------------------------------------------------------------------------

        def load_preset(preset_key):
            """Fill the query and context from a preset and show its precomputed results."""
            try:
                chosen = preset(preset_key)
            except ValueError as error:
                raise gr.Error(str(error)) from error
            data, status_text = view_for_preset(preset_key)
            return [chosen.query, chosen.context or "", status_text, *outputs_for(data), data, data]

        preset_choice.change(
            load_preset,
            inputs=[preset_choice],
            outputs=[query, context, *run_outputs],
            api_name="load_preset",
            show_progress="hidden",
        )

        pair.change(pair_facts_markdown, inputs=[pair], outputs=[facts], api_name="pair_facts", show_progress="hidden")

        def run(pair, query, context, max_new_tokens, sample, temperature, seed, message_tokens, ratio, strategy,
                paper_alpha, alpha, sigma, layers):
            """Run every handoff live and stream the answers; the last update holds the structured
            results (the JSON output: pair, request, one result per column)."""
            try:
                request = build_request(
                    query, context, max_new_tokens, sample, temperature, seed or 0, message_tokens, ratio,
                    strategy, None if paper_alpha else alpha, sigma, layers,
                )
                resolve_pair(pair)
            except ValueError as error:
                raise gr.Error(str(error)) from error
            pair_name = pair
            results: dict[str, dict] = {}
            partial: dict[str, str] = {}
            states = {name: "waiting" for name in COLUMNS}
            log = "starting ..."
            last = 0.0

            def snapshot(final=False):
                """Every output: at the start, when a handoff finishes, and at the end."""
                ordered = [results[name] for name in COLUMNS if name in results]
                data = payload(pair_name, request.to_dict(), ordered, False)
                values = [header(final), *outputs_for(data, partial, states), data, data]
                return dict(zip(run_outputs, values))

            def header(final=False):
                if final:
                    return "**Live run finished.** Every number below was measured in this run."
                return f"**Live run** ({len(results)} of {len(COLUMNS)} done): {_md(log)}"

            def small(name=None):
                """While a handoff streams, only its answer box, its stats and the status change
                (the browser does not redraw four plots for every token)."""
                update = {status: header()}
                if name is not None:
                    index = COLUMNS.index(name)
                    update[answer_boxes[index]] = partial.get(name, "")
                    update[stats_boxes[index]] = stats_markdown(None, states.get(name, ""))
                return update

            yield snapshot()
            for kind, name, data in stream_handoffs(pair_name, request):
                if kind == "status":
                    log = data
                    yield small()
                elif kind == "start":
                    states[name] = "running"
                    partial[name] = ""
                    log = f"running {COLUMN_TITLES[name]} ..."
                    yield small(name)
                elif kind == "token":
                    partial[name] = data
                    if time.perf_counter() - last >= STREAM_INTERVAL:
                        last = time.perf_counter()
                        yield small(name)
                elif kind == "done":
                    results[name] = data
                    partial.pop(name, None)
                    states.pop(name, None)
                    yield snapshot()
                elif kind == "error":
                    raise gr.Error(f"The run failed: {data}")
            yield snapshot(final=True)

        run_event = run_button.click(
            run,
            inputs=[pair, query, context, *settings_inputs],
            outputs=run_outputs,
            api_name="run",
            concurrency_id=MODEL_QUEUE,
            concurrency_limit=concurrency,
            show_progress="minimal",
        )

        def sweep_run(pair, strategies, max_new_tokens, progress=gr.Progress()):
            """Run the KVComm sweep on the built-in set; returns the figure and the data."""
            progress(0.0, desc="Loading models ...")
            try:
                data = run_sweep_data(pair, strategies, int(max_new_tokens), progress=progress)
            except ValueError as error:
                raise gr.Error(str(error)) from error
            text = f"**Live sweep finished** in {data['seconds']:.0f} s ({data['n']} questions, {len(data['answers'])} runs)."
            return plots.sweep_figure(data), data, text

        sweep_event = sweep_button.click(
            sweep_run,
            inputs=[pair, sweep_strategies, sweep_tokens],
            outputs=[sweep_plot, sweep_json, sweep_status],
            api_name="sweep",
            concurrency_id=MODEL_QUEUE,
            concurrency_limit=concurrency,
        )

        stop_button.click(None, None, None, cancels=[run_event, sweep_event], api_name="stop", queue=False)

        def export(results):
            """Write the current results as JSON and CSV files to download."""
            return write_exports(results or {}, tempfile.mkdtemp(prefix="kvviz-export-"))

        export_button.click(export, inputs=[results_state], outputs=[export_files], api_name="export")

        def walk(step, delta):
            step = max(0, min(len(WALKTHROUGH) - 1, int(step) + delta))
            key = WALKTHROUGH[step][1]
            return step, walkthrough_markdown(step), (key if key else gr.skip())

        walk_next.click(lambda s: walk(s, 1), inputs=[walk_step], outputs=[walk_step, walk_text, preset_choice],
                        api_name="walkthrough_next", show_progress="hidden")
        walk_back.click(lambda s: walk(s, -1), inputs=[walk_step], outputs=[walk_step, walk_text, preset_choice],
                        api_name="walkthrough_back", show_progress="hidden")

    # light events (presets, facts, export, walk-through) run side by side; model runs share one queue
    demo.queue(max_size=64, default_concurrency_limit=4)
    return demo


THEME_KWARGS = dict(primary_hue="blue", neutral_hue="slate")


def launch_kwargs() -> dict:
    """theme and css belong to launch() in Gradio 6."""
    return {"theme": gr.themes.Soft(**THEME_KWARGS), "css": CSS}
