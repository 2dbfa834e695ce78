"""Results as text and tables for people: the page's stats lines, what each model saw, the pair's
facts, and the structured results as a DataFrame and as JSON/CSV downloads.

Pure functions over result dicts (``HandoffResult.to_dict()``) and the registry; no Gradio, no
models. User text (queries, contexts, answers, prompts) only ever goes out escaped (``md``) or
into plain text boxes: it is shown as text, never run as HTML.
"""

from __future__ import annotations

import functools
import html
import json
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from kvviz.handoffs import registry
from kvviz import models
from kvviz.facts import facts_from_config
from kvviz.models import EMBEDDED_MODELS, resolve_pair
from kvviz.plotkit import human_bytes
from kvviz.results import STAGES


def md(text) -> str:
    """Escape text for a markdown cell: HTML and the markdown characters that change layout."""
    escaped = str(text)
    for char in "\\`*_[]#|~<>&":
        escaped = escaped.replace(char, "\\" + char)
    return escaped


def format_seconds(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def notes_of(result: dict) -> list[str]:
    """The handoff's own facts about a run (layers sent, gates open, the message ...)."""
    handoff = registry.HANDOFFS.get(result.get("handoff"))
    if handoff is None or handoff.notes is None or not result.get("applicable", True):
        return []
    return handoff.notes(result)


def stats_markdown(result: dict | None, state: str = "") -> str:
    """The small block under each answer: latency, bytes, tokens; or why it does not apply."""
    if result is None:
        return {"running": "*running ...*", "waiting": "*waiting for its turn*"}.get(state, "*not run yet*")
    if not result.get("applicable", True):
        return f"**Not applicable:** {md(result.get('reason', ''))}"
    timings = result.get("timings", {})
    parts = [f"**{format_seconds(float(timings.get('total', 0.0)))}** total"]
    if result.get("first_token_seconds") is not None:
        parts.append(f"first token {format_seconds(float(result['first_token_seconds']))}")
    if result.get("receiver_first_token_seconds") is not None and result.get("receiver_first_token_seconds") != result.get(
        "first_token_seconds"
    ):
        parts.append(f"receiver side {format_seconds(float(result['receiver_first_token_seconds']))}")
    sent = int(result.get("bytes_communicated", 0))
    kind = result.get("communication") or "none"
    sent_text = "nothing sent" if sent == 0 else f"**{human_bytes(sent)}** sent as {md(kind)}"
    lines = [" · ".join(parts), sent_text + f" · {int(result.get('tokens', {}).get('generated', 0))} tokens answered"]
    lines += [md(note) for note in notes_of(result)]
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


SEEN_TITLES = {
    "sharer": "What the sharer read",
    "sender": "What KVComm's sender (a copy of the receiver's model, not the sharer) read",
    "message": "The message it wrote",
    "receiver": "What the receiver read",
}


def seen_text(result: dict | None) -> str:
    """What each model saw, as plain text (prompt templates included)."""
    if not result or not result.get("seen"):
        return ""
    blocks = []
    for key in ("sharer", "sender", "message", "receiver"):
        if key in result["seen"]:
            blocks.append(f"--- {SEEN_TITLES[key]} ---\n{result['seen'][key]}")
    for key, value in result["seen"].items():
        if key not in SEEN_TITLES:
            blocks.append(f"--- {key} ---\n{value}")
    return "\n\n".join(blocks)


def payload(pair: str, request: dict | None, results: list[dict], precomputed: bool, preset_key: str | None = None) -> dict:
    """The structured results of one run: what the JSON box shows and the export writes."""
    return {"pair": pair, "preset": preset_key, "precomputed": precomputed, "request": request, "results": results}


RESULT_COLUMNS = (
    ["handoff", "title", "applicable", "reason", "answer", "bytes_communicated", "communication"]
    + [f"{stage}_s" for stage in STAGES]
    + ["total_s", "first_token_s", "receiver_first_token_s", "generated_tokens", "message_tokens", "notes", "precomputed"]
)


def results_frame(data: dict) -> pd.DataFrame:
    """One row per handoff of a payload: the page's "Results as data" table and the CSV export."""
    rows = []
    for result in data.get("results", []):
        timings, tokens = result.get("timings", {}), result.get("tokens", {})
        row = {
            "handoff": result.get("handoff"),
            "title": registry.title_of(result.get("handoff", "")),
            "applicable": result.get("applicable", True),
            "reason": result.get("reason", ""),
            "answer": result.get("answer", ""),
            "bytes_communicated": result.get("bytes_communicated", 0),
            "communication": result.get("communication", ""),
            "total_s": timings.get("total"),
            "first_token_s": result.get("first_token_seconds"),
            "receiver_first_token_s": result.get("receiver_first_token_seconds"),
            "generated_tokens": tokens.get("generated"),
            "message_tokens": tokens.get("message"),
            "notes": "; ".join(notes_of(result)),
            "precomputed": result.get("precomputed", False),
        }
        row.update({f"{stage}_s": timings.get(stage) for stage in STAGES})
        rows.append(row)
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def write_exports(data: dict, folder: str | Path) -> list[str]:
    """The payload as a JSON file and its table as a CSV file, in ``folder``; returns both paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    json_path = folder / f"kvviz-results-{stamp}.json"
    csv_path = folder / f"kvviz-results-{stamp}.csv"
    json_path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    results_frame(data).to_csv(csv_path, index=False)
    return [str(json_path), str(csv_path)]


@functools.lru_cache(maxsize=32)
def model_facts_row(name: str) -> dict:
    """Architecture facts of a model without loading its weights or its (large) tokenizer: the
    loaded model's facts when this process has it, else the converted folder's config.json."""
    loaded = models.loaded_facts(name)
    if loaded is not None:
        return loaded.to_dict()
    if name not in EMBEDDED_MODELS:
        return {"status": "loads from the Hugging Face hub when run (needs network or a warm hub cache)"}
    if not models.is_prepared(name):
        return {"status": "not prepared yet: python -m kvviz prepare (or the first run converts it)"}
    from transformers import AutoConfig

    folder = models.converted_dir(name)
    facts = facts_from_config(name, AutoConfig.from_pretrained(folder)).to_dict()
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
        return f"**{md(error)}**"
    roles = [("sharer", spec.sharer), ("receiver", spec.receiver)]
    if spec.kvcomm_sender_name != spec.sharer:
        roles.append(("same-shape sender", spec.kvcomm_sender_name))
    lines = [
        md(spec.description),
        "",
        "| role | model | architecture | layers | hidden | heads | KV heads | head dim | vocabulary | chat template |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for role, name in roles:
        try:
            row = model_facts_row(name)
        except Exception as error:  # a listing must not break the page
            row = {"status": f"unavailable ({type(error).__name__}: {error})"}
        if "num_layers" in row:
            lines.append(
                f"| {role} | {md(name)} | {md(row['architecture'])} | {row['num_layers']} | {row['hidden_size']} | "
                f"{row['num_heads']} | {row['num_kv_heads']} | {row['head_dim']} | {row['vocab_size']:,} | "
                f"{'yes' if row['has_chat_template'] else 'no'} |"
            )
        else:
            lines.append(f"| {role} | {md(name)} | {md(row.get('status', '?'))} | | | | | | | |")
    if spec.needs_network:
        lines.append("\nThis pair needs network access (or models already in the hub cache).")
    return "\n".join(lines)


def header_html(name: str) -> str:
    """A column's coloured title (project text only, no user input)."""
    handoff = registry.get(name)
    return (
        f'<div class="kv-col-head" style="background:{handoff.color}">{html.escape(handoff.title)}'
        f"<small>{html.escape(handoff.summary)}</small></div>"
    )


def how_it_works_markdown(name: str) -> str:
    """A handoff's explanation and what it needs."""
    handoff = registry.get(name)
    text = handoff.explanation
    if handoff.needs:
        text += "\n\n*Needs:* " + "; ".join(handoff.needs) + "."
    return text


def diagram_html(name: str) -> str:
    path = registry.get(name).diagram
    if path is None:
        return ""
    try:
        return f'<div class="kv-diagram">{Path(path).read_text(encoding="utf-8")}</div>'
    except OSError:
        return ""
