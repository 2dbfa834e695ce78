"""Results as text and tables for people: the page's answer cards (mark, stats line), verdict strip
and status lines, what each model saw, the pair's facts, and the structured results as a DataFrame
and as JSON/CSV downloads.

Pure functions over result dicts (``HandoffResult.to_dict()``) and the registry; no Gradio, no
models. User text (queries, contexts, answers, prompts) only ever goes out escaped (``md``) or
into plain text boxes: it is shown as text, never run as HTML.
"""

from __future__ import annotations

import functools
import html
import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from kvviz.app.lessons import mark, timed_of
from kvviz.app.methods import registry as methods
from kvviz.core.facts import facts_from_config
from kvviz.core.plotkit import human_bytes, ink
from kvviz.core.results import STAGES
from kvviz.engine.stream import ALL_AT_ONCE
from kvviz.handoffs import registry
from kvviz.runtime import models
from kvviz.runtime.models import EMBEDDED_MODELS, resolve_pair


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
    page = methods.page_of(result.get("handoff"))
    if page is None or page.notes is None or not result.get("applicable", True):
        return []
    return page.notes(result)


def stats_markdown(result: dict | None, state: str = "") -> str:
    """The small block under each answer: latency, bytes, tokens; or why it does not apply."""
    if result is None:
        return {"running": "*running ...*", "waiting": "*waiting for its turn*"}.get(state, "*not run yet*")
    if not result.get("applicable", True):
        return f"**Not applicable:** {md(result.get('reason', ''))}"
    parts = [f"**{time_text(result)}**"]
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
    "alignment": "How the sharer's tokens line up with the receiver's",
}


def seen_text(result: dict | None) -> str:
    """What each model saw, as plain text (prompt templates included)."""
    if not result or not result.get("seen"):
        return ""
    blocks = []
    for key in SEEN_TITLES:
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


def reading_frame(data: dict) -> pd.DataFrame:
    """The page's "Results as data" table: ``results_frame`` with its seconds rounded to the
    millisecond for reading (the CSV export and the JSON keep full precision)."""
    return results_frame(data).round(3)


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


def write_exports(data: dict, folder: str | Path, attention: dict | None = None) -> list[str]:
    """The payload as a JSON file and its table as a CSV file, in ``folder``, and, given the
    per-token attention apart (``attention``: column -> its ``token_attention``, the large part of
    a run: ``data`` then holds its shape only), that as a third file; returns the paths, small first."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    json_path = folder / f"kvviz-results-{stamp}.json"
    csv_path = folder / f"kvviz-results-{stamp}.csv"
    json_path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    results_frame(data).to_csv(csv_path, index=False)
    paths = [str(json_path), str(csv_path)]
    if attention:
        attention_path = folder / f"kvviz-attention-{stamp}.json"
        attention_path.write_text(json.dumps(attention, ensure_ascii=False), encoding="utf-8")
        paths.append(str(attention_path))
    return paths


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
    if spec.same_shape_sender_name != spec.sharer:
        roles.append(("same-shape sender", spec.same_shape_sender_name))
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


# --- the answer cards and the verdict strip -------------------------------------------------------

# A card's mark: a symbol and a word (never colour alone), and ``data-verdict`` for tests and CSS.
MARK_WORDS = {
    "right": "✓ right",
    "wrong": "✗ wrong",
    "none": "∅ no answer",
    "na": "n/a",
    "failed": "⚠ failed",
    "unmarked": "unmarked",
    "waiting": "waiting",
    "running": "running…",
    "stopped": "■ stopped",
    "notstarted": "not started",
    "notrun": "not run",
    "stale": "other question",
}
MARK_HINTS = {
    "right": "the answer states an expected answer",
    "wrong": "the answer does not state an expected answer (or only denies it, or lists it among other candidates)",
    "none": "the answer is empty",
    "na": "this handoff does not apply to this pair or question",
    "failed": "the handoff failed: its details say why",
    "unmarked": "no expected answer to mark it by: type one beside the question",
    "stopped": "stopped by you before it finished",
    "notstarted": "the run was stopped before this handoff started",
    "notrun": "the run did not reach this handoff",
    "stale": "this answer is to the results' own question (or pair), not to what the page asks now: press Run live",
}


def mark_of(result: dict | None, answers) -> str:
    """A finished result's mark: right / wrong / none by ``kvviz.data.metrics.verdict``, "na" when
    the handoff does not apply, "failed" when it raised, "unmarked" with no expected answer."""
    if result is None:
        return "notrun"
    if not result.get("applicable", True):
        return "failed" if "traceback" in (result.get("details") or {}) else "na"
    return mark(result, answers) or "unmarked"


def card_head_html(name: str, kind: str, swap_row: str = "") -> str:
    """A card's head: the handoff's title in its ink shade (>= 4.5:1), its summary on hover, and the
    mark (project text only, no user input); ``swap_row`` (``swap_row_html``) below them."""
    handoff = registry.get(name)
    word, hint = MARK_WORDS[kind], MARK_HINTS.get(kind, "")
    return (
        f'<div class="kv-card-head" style="--kv-hue:{handoff.color};--kv-ink:{ink(handoff.color)}">'
        f'<span class="kv-card-title" title="{html.escape(handoff.title)}: {html.escape(handoff.summary)}">'
        f"{html.escape(handoff.label)}</span>"
        f'<span class="kv-mark kv-mark-{kind}" id="kv-mark-{name}" data-verdict="{kind}" title="{html.escape(hint)}">'
        f"{html.escape(word)}</span></div>{swap_row}"
    )


def time_text(result: dict) -> str:
    """A result's time as what it is: "alone" (this handoff timed by itself on a warm process, as
    a precomputed preset is, or the only column of a live run) or "in a shared run" (a live run's
    wall clock while its columns shared the CPU: not this handoff's own cost), with the time alone
    beside it where one was measured for this question (``alone_total``, a precomputed preset)."""
    total = format_seconds(float(result.get("timings", {}).get("total", 0.0)))
    if timed_of(result) == "alone":
        return f"{total} alone"
    if result.get("alone_total") is not None:
        return f"{format_seconds(float(result['alone_total']))} alone (precomputed) · {total} in this shared run"
    return f"{total} in this shared run"


def card_stats(result: dict | None, state: str = "", message: str | None = None) -> str:
    """The card's one line under the answer: time, first token and bytes; while it runs, what it
    is doing (the message as its sharer writes it); why it does not apply."""
    if message is not None:
        return f"✎ the sharer writes: “{md(message)}”"
    if result is None:
        return {"running": "*running …*", "waiting": "*waiting for its turn*", "stopped": "*stopped before it finished*",
                "notstarted": "*not started*"}.get(state, "")
    if not result.get("applicable", True):
        return md(result.get("reason", ""))
    parts = [time_text(result)]
    if result.get("first_token_seconds") is not None:
        parts.append(f"first token {format_seconds(float(result['first_token_seconds']))}")
    sent = int(result.get("bytes_communicated", 0))
    parts.append("nothing sent" if sent == 0 else f"{human_bytes(sent)} sent")
    return " · ".join(parts)


# --- the swapped note ------------------------------------------------------------------------------

SWAP_WORDS = {"followed": "⇄ followed", "kept": "= kept", "neither": "≠ neither", "none": "no swap run"}
SWAP_MEANINGS = {
    "followed": "followed the swap: what it answers is the note's content",
    "kept": "kept its answer: it did not come from this fact of the note",
    "neither": "gave neither the old answer nor the swapped one: no sign it read this fact",
}


def swap_outcome_of(result: dict | None) -> str:
    """followed / kept / neither, or "none" when no swapped note ran (or it could not be judged)."""
    return ((result or {}).get("swap") or {}).get("outcome") or "none"


def swap_meaning(result: dict) -> str:
    """One line: what the column did with the swapped note and what that says ("KVComm followed
    the swap: what it answers is the note's content")."""
    outcome = swap_outcome_of(result)
    return f"{registry.label_of(result.get('handoff', ''))} {SWAP_MEANINGS[outcome]}" if outcome in SWAP_MEANINGS else ""


def swap_row_html(name: str, result: dict | None) -> str:
    """Under a card's title, once the swapped note ran: the outcome's mark (``data-swap`` for tests
    and CSS; what it means on hover) and the answer on the swapped note (escaped: model text)."""
    outcome = swap_outcome_of(result)
    record = (result or {}).get("swap") or {}
    answer = record.get("answer", "") if record.get("applicable", True) else "(does not apply)"
    hint = swap_meaning(result or {}) or "the swapped note did not run for this column"
    return (f'<div class="kv-swap-row"><span class="kv-swap kv-swap-{outcome}" id="kv-swap-{name}" data-swap="{outcome}" '
            f'title="{html.escape(hint)}">{html.escape(SWAP_WORDS[outcome])}</span>'
            f'<span class="kv-swap-answer" title="its answer on the swapped note">on the swapped note: '
            f"“{html.escape(answer)}”</span></div>")


def what_if_label(label: str) -> str:
    """A stored run's short name on a card: its label's parenthesis ("7 of 18 layers" -> "7 layers"),
    else the label after "at" ("ratio 0.35"), else the label."""
    if "(" in label and label.endswith(")"):
        return re.sub(r"^(\d+) of \d+ layers$", r"\1 layers", label[label.index("(") + 1:-1])
    return label.split(" at ", 1)[-1]


def what_if_html(name: str, runs: list[tuple[str, dict]], answers) -> str:
    """Under a card's answer: this column's answer in the preset's stored runs at other settings
    (``runs``: (label, result)), each with its mark, painted from the stored runs without a model.
    Model text is escaped."""
    if not runs:
        return ""
    items = []
    for label, result in runs:
        kind, answer = mark_of(result, answers), answer_text(result)
        answer = answer if len(answer) <= 40 else answer[:39] + "…"
        items.append(f'<span class="kv-whatif-item" data-verdict="{kind}" title="{html.escape(label)}: stored run, '
                     f'no model needed">{html.escape(what_if_label(label))}: {html.escape(answer)} '
                     f'<span class="kv-mark-{kind} kv-whatif-mark">{html.escape(MARK_WORDS[kind].split()[0])}</span></span>')
    return f'<div class="kv-whatif" id="kv-whatif-{name}"><span class="kv-whatif-lead">what if</span> {" · ".join(items)}</div>'


# the status line's clause per outcome, for the columns that had it
SWAP_SUMMARIES = {
    "followed": "followed the swap (what they answer is the note's content)",
    "kept": "kept their answer (it did not come from this fact)",
    "neither": "gave neither answer (no sign they read this fact)",
}


def swap_status(swap: dict, results: list[dict]) -> str:
    """The status line once the swapped note ran: what changed, which columns followed it, and
    what each outcome means."""
    by = {kind: ", ".join(registry.label_of(r["handoff"]) for r in results if swap_outcome_of(r) == kind)
          for kind in SWAP_SUMMARIES}
    said = "; ".join(f"{SWAP_SUMMARIES[kind]}: **{names}**" for kind, names in by.items() if names)
    answers = " or ".join(f"“{md(a)}”" for a in swap.get("answers") or [])
    return (f'<span class="kv-badge">swapped note</span> **{md(swap.get("changed", ""))}**, so the note now answers '
            f"{answers}. {said[:1].upper() + said[1:] if said else 'No column could be judged'}.")


VERDICT_RULE_HINT = ("read as a person reads it (markup and Unicode forms read through); an answer that only "
                     "denies it (\"not X\") or offers it as one of several candidates (\"X or Y\") is wrong")


def _evidence_parts(evidence: dict[str, str]) -> list[str]:
    """The strip's clauses for the right answers that are not evidence that the note got through."""
    named = lambda kind: ", ".join(registry.label_of(n) for n, e in evidence.items() if e == kind)  # noqa: E731
    controls = lambda kind: "; ".join(f"{registry.label_of(n)} (and {registry.label_of(registry.control_of(n))})"  # noqa: E731
                                      for n, e in evidence.items() if e == kind)
    parts = []
    if named("not needed"):
        parts.append(f"right, and so is its control (not evidence that anything crossed): <b>{controls('not needed')}</b>")
    if named("did not follow"):
        parts.append(f"right, but it did not follow the swapped fact: <b>{named('did not follow')}</b>")
    if named("unchecked"):
        parts.append(f"right, its control not run (tick it to tell): <b>{named('unchecked')}</b>")
    if named("own"):
        parts.append(f"right without anything sent: <b>{named('own')}</b>")
    return parts


def stale_strip_html(held_query: str, held_pair: str, pair: str) -> str:
    """The strip while the cards answer another question or pair than the page now asks: what they
    answer, and how to get this question's answers (the question is user text: escaped)."""
    held = f"“{html.escape(held_query)}”" + (f" on the pair {html.escape(held_pair)}" if held_pair != pair else "")
    return (f'<div class="kv-verdict kv-stale">The greyed answers are to {held}, not to this question'
            f"{'' if held_pair == pair else ' and pair'}: press <b>Run live</b> to answer it.</div>")


def verdict_strip_html(subject: str, marks: dict[str, str], answers, evidence: dict[str, str] | None = None) -> str:
    """One line: which columns got the answer through and which did not (``marks``: column -> mark,
    in page order), and what "right" means here. "Got through by" lists only the right answers the
    note's content carried (``evidence``: column -> ``evidence_of``; without it, every right one);
    the other right ones are named with why they are not evidence. Expected answers may be user
    text: escaped."""
    if not answers:
        return ('<div class="kv-verdict">No expected answer: type one beside the question to mark the columns '
                "(alternatives split by ;).</div>")
    label = lambda kinds: ", ".join(registry.label_of(n) for n, k in marks.items() if k in kinds)  # noqa: E731
    finished = [k for k in marks.values() if k in ("right", "wrong", "none")]
    evidence = {n: evidence.get(n, "carried") for n, k in marks.items() if k == "right"} if evidence is not None else \
        {n: "carried" for n, k in marks.items() if k == "right"}
    carried = ", ".join(registry.label_of(n) for n, e in evidence.items() if e == "carried")
    parts = []
    if finished:
        parts = [f"{html.escape(subject)} got through by: <b>{carried or 'none'}</b>", *_evidence_parts(evidence),
                 f"not by: <b>{label({'wrong', 'none'}) or 'none'}</b>"]
    pending = label({"waiting", "running"})
    if pending:
        parts.append(("still running: " if finished else "Running: each card gets its mark when it finishes: ") + pending)
    cut = label({"stopped", "notstarted", "notrun", "failed"})
    if cut:
        parts.append(f"unfinished: {cut}")
    gold = " or ".join(f"“{html.escape(answer)}”" for answer in answers)
    sentence = "; ".join(parts)
    return (f'<div class="kv-verdict">{sentence[:1].upper() + sentence[1:]}. <span class="kv-verdict-rule" '
            f'title="{html.escape(VERDICT_RULE_HINT)}">Right means the answer states {gold}.</span></div>')


# --- the status line ------------------------------------------------------------------------------


def precomputed_status(title: str, pair: str, when: str = "") -> str:
    stamp = f'<span class="kv-when"> ({md(when)})</span>' if when else ""  # left out on a phone
    return f'<span class="kv-badge">precomputed</span> **{md(title)}** on *{md(pair)}*{stamp}. **Run live** runs it here.'



def live_status(done: int, total: int, states: dict[str, str], log: str = "") -> str:
    """A live run's line as it stands: how many columns are done, which are running now (all of
    them, not the last one started) and how many wait; ``log``: what the run does before any column
    starts (loading the pair, only while it loads)."""
    running = [registry.title_of(name) for name, state in states.items() if state == "running"]
    waiting = sum(state == "waiting" for state in states.values())
    parts = ([f"running {', '.join(running)}"] if running else []) + ([f"{waiting} waiting"] if waiting else [])
    now = "; ".join(parts) if running or not log else md(log)
    return f"**Live run** ({done} of {total} done): {now or 'finishing …'}"


def finished_status(seconds: float, workers: int, stopped: str = "", shared: str = "") -> str:
    """A finished live run's line; ``shared``: how it shares another learner's run
    (``kvviz.engine.shared_runs.shared_line``), said instead of "measured in this run"."""
    wall = format_seconds(seconds)
    if shared:
        return f"**Live run finished** in {wall} (wall time): {md(shared)}."
    if stopped:
        return f"**{md(stopped)}** ({wall}) Every number below was measured in this run."
    if workers == ALL_AT_ONCE:
        side_by_side = (" The handoffs ran side by side, those of one model sharing its decode steps, so each one's"
                        " own times include sharing the CPU.")
    else:
        side_by_side = (f" The handoffs ran {workers} at a time, so each one's own times include sharing the CPU."
                        if workers > 1 else "")
    return f"**Live run finished** in {wall} (wall time). Every number below was measured in this run." + side_by_side


def stopped_status(seconds: float, states: dict[str, str]) -> str:
    """After Stop: how long it ran and each column's state (finished, stopped, not started)."""
    named = lambda kind: ", ".join(registry.title_of(n) for n, state in states.items() if state == kind)  # noqa: E731
    parts = [f"{word} {named(kind)}" for kind, word in (("finished", "finished"), ("stopped", "stopped"),
                                                         ("notstarted", "not started")) if named(kind)]
    return f"**Stopped by you** after {format_seconds(seconds)}: " + "; ".join(parts) + "."


def refused_status(reason: str) -> str:
    """A request the server refused: the one place the learner reads why (nothing else changes)."""
    return f'<span class="kv-refused">**Not run:** {md(reason)}</span>'


def how_it_works_markdown(name: str) -> str:
    """A handoff's explanation and what it needs."""
    handoff = registry.get(name)
    text = methods.page_of(name).explanation
    if handoff.needs:
        text += "\n\n*Needs:* " + "; ".join(handoff.needs) + "."
    return text


HOW_INTRO = (
    "One question, several ways for a *sharer* model to help a *receiver* model answer it. Text and C2C go from "
    "the pair's sharer to its receiver; KVComm needs a sender of the receiver's own shape, so its sender is a "
    "second copy of the receiver's model. Open a handoff to read how it works."
)


# Every term the page uses before it explains it: How it works ends with them, the setup line hovers one.
GLOSSARY = {
    "KV cache": "the keys and values a model computes for every token it has read, per layer: what its attention reads "
                "later. Handing it over lets the receiver attend to text it never read.",
    "layer": "one of the model's stacked blocks (attention, then a small network); Gemma-3-270M has 18.",
    "control": "the same handoff with the note's content taken out: what the receiver answers anyway. A right answer "
               "whose control is right too is no evidence that the note crossed.",
    "swapped note": "the same note with its answer-bearing fact changed: an answer that follows it came from the note.",
    "logit lens": "the receiver's own output head read after each layer: how likely the answer's first token is there.",
    "attention sink": "the first token, which attention heads look at when they look at nothing in particular; left "
                      "out of the per-token sums.",
    "nats": "log-probability in natural-log units; +1 nat per token makes each answer token e (2.7) times likelier.",
    "softmax": "turns a model's scores into probabilities that sum to one.",
    "Spearman": "a rank correlation, from -1 to 1: whether two orderings agree.",
}


def glossary_markdown() -> str:
    return "**Words used on this page**\n\n" + "\n".join(f"- **{term}**: {meaning}" for term, meaning in GLOSSARY.items())


def how_it_works_page(names: list[str]) -> str:
    """The "How it works" tab: an introduction, then one folded section per handoff with its
    diagram and explanation (project text only: the descriptors and their flows)."""
    sections = [HOW_INTRO]
    for name in names:
        sections.append(f'<details id="kv-how-{name}"><summary><b>{html.escape(registry.get(name).title)}</b></summary>\n\n'
                        f"{diagram_html(name)}\n\n{how_it_works_markdown(name)}\n\n</details>")
    return "\n\n".join(sections + [glossary_markdown()])


def diagram_html(name: str) -> str:
    return f'<div class="kv-diagram">{methods.page_of(name).diagram()}</div>'
