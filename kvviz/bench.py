"""The benchmark: handoffs x a dataset -> one CSV row per sample and handoff, a summary, figures.

``python -m kvviz bench --pair embedded --dataset countries --handoffs receiver,skyline,text,kvcomm
--ratios 0.3,0.5 --limit 40 --out DIR`` writes into DIR:

* ``rows.csv`` (or ``rows.part-R-of-W.csv`` per process when the run is split): one row per sample
  and handoff variant: the answer, every correctness metric, every stage time, time to first
  token, bytes communicated, FLOPs per model. Rows are appended and flushed as they are produced,
  so an interrupted run resumes where it stopped (pairs of sample and variant already in any part
  file are skipped).
* ``summary.csv`` and ``summary.md``: per variant, accuracy with 95% Wilson intervals for every
  metric, mean and median latency per stage, bytes and FLOPs.
* ``figures.html``: plotly figures (accuracy with intervals, latency per stage, accuracy against
  bytes communicated).
* ``config.json``: the settings; a resumed run must use the same ones.

Variants: every handoff named in ``--handoffs`` is one variant, except ``kvcomm``, which becomes
one variant per strategy and ratio: ``kvcomm@0.3`` (the paper's score), ``kvcomm-contiguous@0.3``,
``kvcomm-random@0.3`` ...

Metrics. Open answers (Countries, HotpotQA, ...): token F1 > 0.5 with a gold answer (the KVComm
paper's metric) and containment of a gold answer, both. Multiple choice (ARC, OpenBookQA, ...):
the letter the model writes (the choices are listed with letters in the question, C2C style) and,
as a second column, the option with the highest likelihood under the receiver in the state the
handoff left it in (log-probability of the option text after the prompt, divided by the option's
length in bytes, as lm-eval's acc_norm). The likelihood needs that state: it is rebuilt for
receiver, sharer, skyline, text (the receiver's prompt with the message) and KVComm (the sender's
context KV spliced into the selected layers); for other handoffs (C2C) the column is empty and
``likelihood_note`` says why.

Several processes each take samples ``rank::world`` (RANK / WORLD_SIZE / LOCAL_RANK from the
environment) and write their own part file; the process that finishes last (all ``.done`` markers
present) writes the merged summary. ``--summarize`` rebuilds the summary from whatever part files
DIR holds. GPUs: ``accelerate launch --multi_gpu --num_processes N -m kvviz bench ...`` (each process
uses ``cuda:LOCAL_RANK``). CPU: ``torchrun --standalone --nproc_per_node N -m kvviz bench ...``
(``accelerate launch --cpu`` starts a single process in accelerate 1.15).

``--perf`` runs the performance comparison instead (see ``kvviz.perf``).
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kvviz.results import STAGES, GenerationSettings, HandoffRequest, HandoffResult, KVCommOptions

# Handoffs that may be asked for before they exist in this checkout: rows say so instead of failing.
PENDING_HANDOFFS = {"c2c": "c2c not available in this version of kvviz", "c2c_control": "c2c not available in this version of kvviz"}

MC_INSTRUCTION = "Reply with the letter of the correct option."

# The settings a resumed run must share with the run it continues.
RESUME_KEYS = ("pair", "dataset", "dataset_options", "seed", "max_new_tokens", "message_tokens", "shuffle")

TIME_COLUMNS = [f"time_{stage}" for stage in STAGES] + ["time_total", "ttft"]
COLUMNS = [
    "dataset",
    "pair",
    "sample_index",
    "sample_id",
    "variant",
    "handoff",
    "strategy",
    "ratio",
    "applicable",
    "reason",
    "question",
    "gold",
    "answer",
    "kind",  # open | choice
    "f1",
    "correct_f1",
    "correct_contains",
    "gold_letter",
    "answer_letter",
    "correct_letter",
    "likelihood_letter",
    "correct_likelihood",
    "likelihood_note",
    "correct",  # the headline metric: correct_f1 for open answers, correct_letter for choices
    *TIME_COLUMNS,
    "bytes",
    "communication",
    "flops_sharer",
    "flops_receiver",
    "flops_total",
    "generated_tokens",
    "message",
    "selected_layers",
    "rank",
    "world_size",
    "seed",
]


# --- variants ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    label: str  # the row name: "text", "kvcomm@0.3", "kvcomm-random@0.5"
    handoff: str  # the registry name
    ratio: float | None = None
    strategy: str | None = None
    unavailable: str = ""  # non-empty: the handoff is not in this checkout; rows say why


def _ratio_label(ratio: float) -> str:
    return f"{ratio:g}"


def expand_variants(handoffs: list[str], ratios: list[float], strategies: list[str]) -> list[Variant]:
    """One variant per handoff; kvcomm becomes one per strategy and ratio."""
    from kvviz.handoffs import HANDOFFS
    from kvviz.handoffs.kvcomm import STRATEGIES

    bad = [s for s in strategies if s not in STRATEGIES or s == "explicit"]
    if bad:
        raise ValueError(f"Unknown KVComm strategy {bad}; choose from {', '.join(s for s in STRATEGIES if s != 'explicit')}.")
    for ratio in ratios:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"KVComm ratios must be between 0 and 1, got {ratio}")
    variants: list[Variant] = []
    for name in handoffs:
        if name == "kvcomm":
            for strategy in strategies:
                prefix = "kvcomm" if strategy == "kvcomm" else f"kvcomm-{strategy}"
                for ratio in ratios:
                    variants.append(Variant(f"{prefix}@{_ratio_label(ratio)}", "kvcomm", ratio, strategy))
        elif name in HANDOFFS:
            variants.append(Variant(name, name))
        elif name in PENDING_HANDOFFS:
            variants.append(Variant(name, name, unavailable=PENDING_HANDOFFS[name]))
        else:
            raise ValueError(f"Unknown handoff '{name}'; choose from {', '.join(HANDOFFS)}.")
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise ValueError(f"A handoff or ratio is listed twice: {labels}")
    return variants


# --- requests and scoring ---------------------------------------------------------------------


def record_query(record) -> str:
    """The receiver's question: for multiple choice the lettered options follow it (C2C style)."""
    if record.choices is None:
        return record.question
    from kvviz.data import format_choices

    return f"{record.question.strip()}\n{format_choices(record)}\n{MC_INSTRUCTION}"


def build_request(record, variant: Variant, args) -> HandoffRequest:
    return HandoffRequest(
        query=record_query(record),
        context=record.context,
        generation=GenerationSettings(max_new_tokens=args.max_new_tokens, greedy=True, seed=args.seed),
        text_message_tokens=args.message_tokens,
        kvcomm=KVCommOptions(
            ratio=variant.ratio if variant.ratio is not None else 0.5,
            strategy=variant.strategy or "kvcomm",
            seed=args.seed,
        ),
        c2c_fuser=getattr(args, "fuser", None),
    )


def score_answer(record, answer: str) -> dict:
    """Every correctness column that depends only on the answer text."""
    from kvviz.data import LETTERS, contains_answer, extract_choice_letter, f1_match, token_f1

    out: dict = {"gold": " | ".join(record.answers)}
    out["f1"] = round(max((token_f1(answer, gold) for gold in record.answers), default=0.0), 4)
    out["correct_f1"] = int(f1_match(answer, record.answers))
    out["correct_contains"] = int(contains_answer(answer, record.answers))
    if record.choices is None:
        out["kind"] = "open"
        out["correct"] = out["correct_f1"]
    else:
        out["kind"] = "choice"
        gold_letter = LETTERS[record.answer_index]
        letter = extract_choice_letter(answer, len(record.choices))
        out["gold"] = f"{gold_letter}. {record.choices[record.answer_index]}"
        out["gold_letter"] = gold_letter
        out["answer_letter"] = letter or ""
        out["correct_letter"] = int(letter == gold_letter)
        out["correct"] = out["correct_letter"]
    return out


def _receiver_prompt_state(pair, variant: Variant, request: HandoffRequest, result: HandoffResult):
    """(model, state before the prompt's query part, token ids still to feed) for the likelihood.

    Returns None and a note when the handoff's receiver state cannot be rebuilt here.
    """
    from kvviz import cache as kv
    from kvviz.decode import prefill
    from kvviz.handoffs import text as text_handoff
    from kvviz.prompts import build_segments

    name = variant.handoff
    if name == "receiver":
        return (pair.receiver, kv.KVState(), build_segments(pair.receiver.tokenizer, request.query).input_ids), ""
    if name == "sharer":
        segments = build_segments(pair.sharer.tokenizer, request.query, request.context)
        return (pair.sharer, kv.KVState(), segments.input_ids), ""
    if name == "skyline":
        segments = build_segments(pair.receiver.tokenizer, request.query, request.context)
        return (pair.receiver, kv.KVState(), segments.input_ids), ""
    if name == "text":
        segments = text_handoff.receiver_segments(pair, request, result.seen.get("message", ""))
        return (pair.receiver, kv.KVState(), segments.input_ids), ""
    if name == "kvcomm":
        segments = build_segments(pair.receiver.tokenizer, request.query, request.context)
        sender_state = kv.KVState()
        prefill(pair.kvcomm_sender, sender_state, segments.context_ids, need_logits=False)
        selected = set(result.details.get("selected_layers", []))
        state = kv.splice_prefix(sender_state.cache, pair.receiver.facts.num_layers, selected)
        return (pair.receiver, state, segments.query_ids), ""
    return None, f"not computed: {name} changes the receiver's cache in a way the bench does not rebuild"


def option_scores(model, state, prompt_ids: list[int], options: list[str]) -> list[float]:
    """Length-normalised log-likelihood of each option continuing the prompt (in place on copies)."""
    import torch

    from kvviz import cache as kv
    from kvviz.decode import full_logits, prefill
    from kvviz.prompts import encode

    next_token, _ = prefill(model, state, prompt_ids)
    first = torch.log_softmax(next_token.logits[0], dim=-1)
    tokenizer = model.tokenizer
    prompt_text = tokenizer.decode(prompt_ids[-1:])
    separator = "" if prompt_text.endswith((" ", "\n")) else " "
    scores = []
    for option in options:
        ids = encode(tokenizer, separator + option.strip())
        total = float(first[ids[0]])
        if len(ids) > 1:
            copy = kv.KVState(
                cache=kv.copy_cache(state.cache), next_position=state.next_position, prefix_positions=dict(state.prefix_positions)
            )
            rest = torch.log_softmax(full_logits(model, copy, ids[:-1]), dim=-1)
            total += float(sum(rest[i, ids[i + 1]] for i in range(len(ids) - 1)))
        scores.append(total / max(1, len(option.strip().encode("utf-8"))))
    return scores


def likelihood_columns(pair, record, variant: Variant, request: HandoffRequest, result: HandoffResult) -> dict:
    from kvviz.data import LETTERS

    if record.choices is None:
        return {}
    built, note = _receiver_prompt_state(pair, variant, request, result)
    if built is None:
        return {"likelihood_note": note}
    model, state, prompt_ids = built
    scores = option_scores(model, state, prompt_ids, record.choices)
    best = max(range(len(scores)), key=lambda index: (scores[index], -index))
    return {"likelihood_letter": LETTERS[best], "correct_likelihood": int(best == record.answer_index)}


def result_row(record, index: int, variant: Variant, result: HandoffResult, args, rank: int, world: int) -> dict:
    row = {column: "" for column in COLUMNS}
    row.update(
        dataset=args.dataset,
        pair=args.pair,
        sample_index=index,
        sample_id=record.id,
        variant=variant.label,
        handoff=variant.handoff,
        strategy=variant.strategy or "",
        ratio="" if variant.ratio is None else variant.ratio,
        applicable=int(result.applicable),
        reason=result.reason,
        question=record.question,
        rank=rank,
        world_size=world,
        seed=args.seed,
    )
    if not result.applicable:
        row["gold"] = " | ".join(record.answers)
        row["kind"] = "open" if record.choices is None else "choice"
        return row
    row["answer"] = result.answer
    row.update(score_answer(record, result.answer))
    for stage in STAGES:
        row[f"time_{stage}"] = round(result.timings.get(stage, 0.0), 6)
    row["time_total"] = round(result.timings.get("total", 0.0), 6)
    row["ttft"] = "" if result.first_token_seconds is None else round(result.first_token_seconds, 6)
    row["bytes"] = result.bytes_communicated
    row["communication"] = result.communication
    row["flops_sharer"] = result.flops.get("sharer", 0.0)
    row["flops_receiver"] = result.flops.get("receiver", 0.0)
    row["flops_total"] = sum(result.flops.values())
    row["generated_tokens"] = result.tokens.get("generated", len(result.answer_ids))
    row["message"] = result.seen.get("message", "")
    if "selected_layers" in result.details:
        row["selected_layers"] = ";".join(str(layer) for layer in result.details["selected_layers"])
    return row


# --- files ------------------------------------------------------------------------------------


def part_path(out: Path, rank: int, world: int) -> Path:
    return out / ("rows.csv" if world == 1 else f"rows.part-{rank}-of-{world}.csv")


def row_files(out: Path) -> list[Path]:
    return sorted(out.glob("rows*.csv"))


def read_rows(out: Path) -> list[dict]:
    rows = []
    for path in row_files(out):
        with path.open(newline="", encoding="utf-8") as handle:
            rows.extend(csv.DictReader(handle))
    return rows


def done_pairs(out: Path) -> set[tuple[str, str]]:
    return {(row["sample_id"], row["variant"]) for row in read_rows(out)}


def drop_partial_last_line(path: Path) -> None:
    """A run killed in the middle of a write leaves a line without its newline: cut it off."""
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    # csv ends records with \r\n; newlines inside quoted fields (a message) are plain \n
    if data.endswith(b"\r\n"):
        return
    cut = data.rfind(b"\r\n")
    path.write_bytes(data[: cut + 2] if cut >= 0 else b"")


def drop_variants(out: Path, variants: set[str]) -> int:
    """Remove the rows of some variants from every part file (``--redo``); returns how many."""
    dropped = 0
    for path in row_files(out):
        drop_partial_last_line(path)
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            fieldnames = reader.fieldnames or COLUMNS
            rows = list(reader)
        keep = [row for row in rows if row.get("variant") not in variants]
        dropped += len(rows) - len(keep)
        if len(keep) != len(rows):
            temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            with temporary.open("w", newline="", encoding="utf-8") as handle:
                writer = csv.DictWriter(handle, fieldnames=fieldnames)
                writer.writeheader()
                writer.writerows(keep)
            os.replace(temporary, path)
    return dropped


class RowWriter:
    """Appends rows to a CSV file and flushes each one (a killed run loses at most one row)."""

    def __init__(self, path: Path):
        self.path = path
        drop_partial_last_line(path)
        new = not path.exists() or path.stat().st_size == 0
        self.handle = path.open("a", newline="", encoding="utf-8")
        self.writer = csv.DictWriter(self.handle, fieldnames=COLUMNS)
        if new:
            self.writer.writeheader()
            self.handle.flush()

    def write(self, row: dict) -> None:
        self.writer.writerow(row)
        self.handle.flush()
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        self.handle.close()


def _atomic_write(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def check_config(out: Path, config: dict) -> None:
    """A resumed run must use the settings of the run it continues; the first run records them."""
    path = out / "config.json"
    if path.exists():
        old = json.loads(path.read_text(encoding="utf-8"))
        changed = [key for key in RESUME_KEYS if old.get(key) != config.get(key)]
        if changed:
            details = ", ".join(f"{key}: {old.get(key)!r} -> {config.get(key)!r}" for key in changed)
            raise ValueError(
                f"{out} holds a run with other settings ({details}). Use another --out, or --fresh to start over."
            )
        # the same run, extended: remember every variant (in order); the limit is the latest one
        merged = dict(config)
        merged["variants"] = list(dict.fromkeys(list(config.get("variants", [])) + list(old.get("variants", []))))
        config = merged
    _atomic_write(path, json.dumps(config, indent=2))


# --- summary ----------------------------------------------------------------------------------


def _floats(rows: list[dict], column: str) -> list[float]:
    values = []
    for row in rows:
        value = row.get(column, "")
        if value not in ("", None):
            values.append(float(value))
    return values


def _accuracy(rows: list[dict], column: str) -> dict:
    from kvviz.data import wilson_interval

    values = [int(float(row[column])) for row in rows if row.get(column, "") not in ("", None)]
    if not values:
        return {"n": 0, "correct": 0, "accuracy": None, "ci_low": None, "ci_high": None}
    low, high = wilson_interval(sum(values), len(values))
    return {"n": len(values), "correct": sum(values), "accuracy": sum(values) / len(values), "ci_low": low, "ci_high": high}


def summarize(rows: list[dict], order: list[str] | None = None) -> list[dict]:
    """One summary row per variant, in ``order`` (then any others, sorted)."""
    by_variant: dict[str, list[dict]] = {}
    for row in rows:
        by_variant.setdefault(row["variant"], []).append(row)
    names = [name for name in (order or []) if name in by_variant]
    names += sorted(name for name in by_variant if name not in names)
    summary = []
    for name in names:
        group = by_variant[name]
        ok = [row for row in group if str(row.get("applicable")) in ("1", "True", "true")]
        kind = group[0].get("kind") or "open"
        entry: dict = {
            "variant": name,
            "handoff": group[0].get("handoff", ""),
            "kind": kind,
            "samples": len(group),
            "applicable": len(ok),
            "not_applicable_reason": next((row["reason"] for row in group if row not in ok and row.get("reason")), ""),
        }
        metrics = ["correct_f1", "correct_contains"] + (["correct_letter", "correct_likelihood"] if kind == "choice" else [])
        for metric in metrics:
            stats = _accuracy(ok, metric)
            short = metric.removeprefix("correct_")
            entry[f"acc_{short}"] = stats["accuracy"]
            entry[f"acc_{short}_low"] = stats["ci_low"]
            entry[f"acc_{short}_high"] = stats["ci_high"]
            entry[f"n_{short}"] = stats["n"]
        if kind == "choice":
            entry["likelihood_note"] = next((row["likelihood_note"] for row in ok if row.get("likelihood_note")), "")
        for column in TIME_COLUMNS + ["bytes", "flops_sharer", "flops_receiver", "flops_total", "generated_tokens"]:
            values = _floats(ok, column)
            entry[f"{column}_mean"] = statistics.fmean(values) if values else None
            entry[f"{column}_median"] = statistics.median(values) if values else None
        summary.append(entry)
    return summary


def _fmt_acc(entry: dict, short: str) -> str:
    accuracy = entry.get(f"acc_{short}")
    if accuracy is None:
        return "n/a"
    return f"{accuracy:.2f} [{entry[f'acc_{short}_low']:.2f}, {entry[f'acc_{short}_high']:.2f}]"


def _fmt_seconds(value) -> str:
    return "" if value is None else f"{value:.3f}"


def _fmt_count(value) -> str:
    if value is None:
        return ""
    if value >= 1e9:
        return f"{value / 1e9:.2f} G"
    if value >= 1e6:
        return f"{value / 1e6:.2f} M"
    if value >= 1e3:
        return f"{value / 1e3:.1f} k"
    return f"{value:.0f}"


def accuracy_headers(kind: str) -> list[tuple[str, str]]:
    if kind == "choice":
        return [("letter", "acc (letter)"), ("likelihood", "acc (likelihood)")]
    return [("f1", "acc (F1>0.5)"), ("contains", "acc (contains)")]


def summary_markdown(summary: list[dict], title: str = "") -> str:
    """The summary as a markdown table: accuracy with 95% Wilson intervals, latency, bytes, FLOPs."""
    if not summary:
        return "(no rows)\n"
    kind = summary[0]["kind"]
    acc = accuracy_headers(kind)
    header = (
        ["handoff", "n"]
        + [name for _, name in acc]
        + [f"{stage} s (mean / median)" for stage in STAGES]
        + ["total s (mean / median)", "TTFT s (median)", "bytes (mean)", "FLOPs (mean)"]
    )
    lines = []
    if title:
        lines += [title, ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    notes = []
    for entry in summary:
        if entry["applicable"] == 0:
            cells = [entry["variant"], str(entry["samples"])] + ["n/a"] * (len(header) - 2)
            notes.append(f"{entry['variant']}: {entry['not_applicable_reason']}")
            lines.append("| " + " | ".join(cells) + " |")
            continue
        cells = [entry["variant"], str(entry["applicable"])]
        cells += [_fmt_acc(entry, short) for short, _ in acc]
        for column in [f"time_{stage}" for stage in STAGES] + ["time_total"]:
            cells.append(f"{_fmt_seconds(entry[column + '_mean'])} / {_fmt_seconds(entry[column + '_median'])}")
        cells += [_fmt_seconds(entry["ttft_median"]), _fmt_count(entry["bytes_mean"]), _fmt_count(entry["flops_total_mean"])]
        lines.append("| " + " | ".join(cells) + " |")
        if entry["applicable"] < entry["samples"]:
            notes.append(f"{entry['variant']}: {entry['samples'] - entry['applicable']} sample(s) not applicable: {entry['not_applicable_reason']}")
        if entry.get("likelihood_note"):
            notes.append(f"{entry['variant']}: likelihood {entry['likelihood_note']}")
    if notes:
        lines += [""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def write_summary(out: Path, order: list[str] | None = None, title: str = "") -> list[dict]:
    rows = read_rows(out)
    summary = summarize(rows, order)
    if summary:
        columns = list(dict.fromkeys(key for entry in summary for key in entry))
        temporary = out / f".summary.csv.{os.getpid()}.tmp"
        with temporary.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(summary)
        os.replace(temporary, out / "summary.csv")
    _atomic_write(out / "summary.md", summary_markdown(summary, title))
    write_figures(out / "figures.html", summary, title)
    return summary


def figures(summary: list[dict]) -> list:
    """Plotly figures from summary rows (data in, figures out; lists, not numpy arrays)."""
    import plotly.graph_objects as go

    shown = [entry for entry in summary if entry["applicable"]]
    if not shown:
        return []
    kind = shown[0]["kind"]
    short = "letter" if kind == "choice" else "f1"
    names = [entry["variant"] for entry in shown]
    accuracy = [entry[f"acc_{short}"] or 0.0 for entry in shown]
    upper = [(entry[f"acc_{short}_high"] or 0.0) - a for entry, a in zip(shown, accuracy)]
    lower = [a - (entry[f"acc_{short}_low"] or 0.0) for entry, a in zip(shown, accuracy)]
    metric = dict(accuracy_headers(kind))[short]
    accuracy_figure = go.Figure(
        go.Bar(x=names, y=accuracy, error_y=dict(type="data", array=upper, arrayminus=lower), name=metric)
    )
    accuracy_figure.update_layout(title=f"Accuracy, {metric}, with 95% Wilson intervals", yaxis=dict(range=[0, 1]))

    latency_figure = go.Figure()
    for stage in STAGES:
        latency_figure.add_bar(x=names, y=[entry[f"time_{stage}_mean"] or 0.0 for entry in shown], name=stage)
    latency_figure.update_layout(barmode="stack", title="Mean latency per stage (s)", yaxis_title="seconds")

    cost_figure = go.Figure(
        go.Scatter(
            x=[entry["bytes_mean"] or 0.0 for entry in shown],
            y=accuracy,
            text=names,
            mode="markers+text",
            textposition="top center",
        )
    )
    cost_figure.update_layout(
        title="Accuracy against bytes communicated", xaxis_title="bytes per sample (mean)", yaxis_title=metric
    )
    return [accuracy_figure, latency_figure, cost_figure]


def write_figures(path: Path, summary: list[dict], title: str = "") -> None:
    parts = []
    for index, figure in enumerate(figures(summary)):
        parts.append(figure.to_html(full_html=False, include_plotlyjs=index == 0))
    body = "\n".join(parts) or "<p>No applicable rows.</p>"
    _atomic_write(path, f"<!doctype html><html><head><meta charset='utf-8'><title>{title or 'kvviz bench'}</title></head><body>\n{body}\n</body></html>\n")


# --- the run ----------------------------------------------------------------------------------


def distributed_rank() -> tuple[int, int, int]:
    """(rank, world size, local rank) from the environment that accelerate launch / torchrun set."""
    rank = int(os.environ.get("RANK", os.environ.get("ACCELERATE_PROCESS_INDEX", "0")) or 0)
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("ACCELERATE_NUM_PROCESSES", "1")) or 1)
    local = int(os.environ.get("LOCAL_RANK", str(rank)) or 0)
    if not 0 <= rank < world:
        raise ValueError(f"RANK {rank} is outside WORLD_SIZE {world}")
    return rank, world, local


def parse_floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def parse_names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_dataset_options(items: list[str] | None) -> dict:
    options = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--dataset-option takes KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        lowered = value.strip().lower()
        options[key.strip()] = {"true": True, "false": False}.get(lowered, value.strip())
    return options


def load_records(args):
    from kvviz.data import load_dataset_with_report

    options = parse_dataset_options(args.dataset_option)
    records, report = load_dataset_with_report(
        args.dataset, limit=args.limit, seed=args.seed if args.shuffle else None, **options
    )
    if report.problems:
        print(report.summary(), file=sys.stderr)
    return records


def run_bench(args) -> int:
    from kvviz import engine

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rank, world, local = distributed_rank()
    if args.fresh and rank == 0:
        for path in row_files(out) + list(out.glob(".done-*")) + [out / "config.json"]:
            path.unlink(missing_ok=True)
    variants = expand_variants(parse_names(args.handoffs), parse_floats(args.ratios), parse_names(args.strategies))
    config = {
        "pair": args.pair,
        "dataset": args.dataset,
        "dataset_options": parse_dataset_options(args.dataset_option),
        "seed": args.seed,
        "shuffle": args.shuffle,
        "max_new_tokens": args.max_new_tokens,
        "message_tokens": args.message_tokens,
        "limit": args.limit,
        "variants": [v.label for v in variants],
    }
    if rank == 0 or world == 1:
        check_config(out, config)
    else:
        # the other ranks check against what rank 0 wrote (or will write: same command line)
        if (out / "config.json").exists():
            check_config(out, config)
    marker = out / f".done-{rank}-of-{world}"
    marker.unlink(missing_ok=True)
    if args.redo and rank == 0:
        dropped = drop_variants(out, set(parse_names(args.redo)))
        print(f"--redo: removed {dropped} row(s) of {args.redo} to run them again", file=sys.stderr)

    records = load_records(args)
    mine = [(index, record) for index, record in enumerate(records) if index % world == rank]
    done = done_pairs(out)
    todo = [(index, record, variant) for index, record in mine for variant in variants if (record.id, variant.label) not in done]
    skipped = len(mine) * len(variants) - len(todo)
    if skipped:
        print(f"resuming: {skipped} sample/handoff pair(s) already in {out}", file=sys.stderr)

    pair = None
    if any(not variant.unavailable for _, _, variant in todo):
        device = args.device
        if device is None and world > 1:
            import torch

            device = f"cuda:{local}" if torch.cuda.is_available() else "cpu"
        pair = engine.load_pair(args.pair, device, args.dtype, progress=lambda message: print(message, file=sys.stderr))

    from tqdm.auto import tqdm

    writer = RowWriter(part_path(out, rank, world))
    try:
        bar = tqdm(todo, desc=f"bench {args.dataset}" + (f" [{rank}/{world}]" if world > 1 else ""), position=rank if world > 1 else 0, disable=args.quiet)
        for index, record, variant in bar:
            bar.set_postfix_str(variant.label, refresh=False)
            if variant.unavailable:
                result = HandoffResult.not_applicable(variant.handoff, args.pair, variant.unavailable)
                request = None
            else:
                request = build_request(record, variant, args)
                result = engine.run_handoff(variant.handoff, pair, request)
            row = result_row(record, index, variant, result, args, rank, world)
            if result.applicable and record.choices is not None and request is not None and not args.no_likelihood:
                row.update(likelihood_columns(pair, record, variant, request, result))
            elif record.choices is not None and args.no_likelihood:
                row["likelihood_note"] = "not computed: --no-likelihood"
            writer.write(row)
    finally:
        writer.close()
    marker.write_text(time.strftime("%Y-%m-%dT%H:%M:%S"), encoding="utf-8")
    finished = all((out / f".done-{r}-of-{world}").exists() for r in range(world))
    if finished:
        summary = write_summary(out, [v.label for v in variants], title=f"{args.dataset} on pair {args.pair}")
        if not args.quiet:
            print(summary_markdown(summary, f"{args.dataset} on pair {args.pair} (limit {args.limit}, seed {args.seed})"))
        print(f"wrote {out}/summary.csv, summary.md, figures.html and {part_path(out, rank, world).name}", file=sys.stderr)
    else:
        print(f"rank {rank}: rows written to {part_path(out, rank, world)}; the last process to finish writes the summary", file=sys.stderr)
    return 0


# --- CLI --------------------------------------------------------------------------------------


def configure_parser(parser) -> None:
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--dataset", default="countries", help="a registered dataset name or a JSONL file")
    parser.add_argument("--dataset-option", action="append", default=None, metavar="KEY=VALUE",
                        help="loader option, e.g. with_fact=true (openbookqa), all_paragraphs=true (hotpotqa)")
    parser.add_argument("--handoffs", default="receiver,skyline,text,kvcomm")
    parser.add_argument("--limit", type=int, default=40, help="number of samples (after the seeded shuffle)")
    parser.add_argument("--ratios", default="0.3,0.5,0.7", help="KVComm ratios; each is its own row")
    parser.add_argument("--strategies", default="kvcomm", help="KVComm strategies: kvcomm,attention,prior,contiguous,random")
    parser.add_argument("--seed", type=int, default=0, help="sample order, random layer choice and sampling")
    parser.add_argument("--no-shuffle", dest="shuffle", action="store_false", help="take the first --limit samples in file order")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--message-tokens", type=int, default=64, help="text handoff: message length bound")
    parser.add_argument("--no-likelihood", action="store_true", help="skip the multiple-choice likelihood column")
    parser.add_argument("--out", default=None, help="output folder (default runs/bench-DATASET)")
    parser.add_argument("--fresh", action="store_true", help="delete earlier rows in --out instead of resuming")
    parser.add_argument("--redo", default=None, metavar="VARIANTS",
                        help="run these variants again (e.g. c2c,kvcomm@0.3): their rows in --out are removed first")
    parser.add_argument("--summarize", action="store_true", help="only rebuild the summary from the rows in --out")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or printed table")
    parser.add_argument("--perf", action="store_true", help="run the performance comparison instead (kvviz.perf)")
    parser.add_argument("--json", action="store_true", help="--perf: print JSON")
    parser.add_argument("--lengths", default="128,256,512,1024,2048", help="--perf: context lengths in tokens")
    parser.add_argument("--repeats", type=int, default=5, help="--perf: repeats per measurement")
    parser.add_argument("--fuser", default=None, help="C2C fuser checkpoint folder (default: the pair's shipped one)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: torch's choice; 1 is much faster on a busy shared machine)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)


def main(args) -> int:
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    if args.perf:
        from kvviz import perf

        return perf.main(args)
    if args.out is None:
        args.out = str(Path("runs") / f"bench-{Path(args.dataset).stem}")
    if args.summarize:
        out = Path(args.out)
        if not row_files(out):
            raise FileNotFoundError(f"no rows*.csv in {out}")
        order = None
        if (out / "config.json").exists():
            order = json.loads((out / "config.json").read_text(encoding="utf-8")).get("variants")
        summary = write_summary(out, order, title=f"{args.dataset} on pair {args.pair}")
        print(summary_markdown(summary))
        return 0
    return run_bench(args)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m kvviz.bench")
    configure_parser(parser)
    raise SystemExit(main(parser.parse_args()))


# --- docs/RESULTS.md --------------------------------------------------------------------------

HEADLINE = {"open": (("f1", "F1>0.5"), ("contains", "contains")), "choice": (("letter", "letter"), ("likelihood", "likelihood"))}


def _summary_entries(folder: Path) -> tuple[list[dict], dict]:
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    return summarize(read_rows(folder), config.get("variants")), config


def variant_sort_key(label: str):
    """Baselines first, then C2C, then KVComm by strategy and ratio."""
    fixed = ["receiver", "sharer", "skyline", "text", "c2c", "c2c_control"]
    if label in fixed:
        return (0, fixed.index(label), 0.0, label)
    name, _, ratio = label.partition("@")
    strategies = ["kvcomm", "kvcomm-attention", "kvcomm-prior", "kvcomm-contiguous", "kvcomm-random"]
    try:
        value = float(ratio)
    except ValueError:
        value = 0.0
    return (1, strategies.index(name) if name in strategies else len(strategies), value, label)


def results_markdown(runs: list[tuple[str, Path]], perf_dir: Path | None, machine: dict, command: str) -> str:
    """docs/RESULTS.md: the accuracy table over datasets, the targets, the perf table, details."""
    tables = [(title, *_summary_entries(folder)) for title, folder in runs]
    variants = sorted(dict.fromkeys(entry["variant"] for _, summary, _ in tables for entry in summary), key=variant_sort_key)
    lines = [
        "# kvviz results",
        "",
        f"Generated by `{command}` on {machine.get('date', '?')}.",
        f"Machine: `{machine.get('uname', '?')}`, {machine.get('cpu_cores', '?')} cores, device {machine.get('device', 'cpu')}, "
        f"torch {machine.get('torch', '?')}, transformers {machine.get('transformers', '?')}; git commit "
        f"`{machine.get('git_commit', '?')}`" + (" (uncommitted changes present)" if machine.get("dirty") else "") + ".",
        "",
        "## Accuracy of the embedded pair",
        "",
        "Sharer SmolLM2-135M-Instruct, receiver Gemma-3-270M (base); KVComm uses Gemma-3-270M as its own sender. "
        "Greedy decoding. Cells: share correct [95% Wilson interval]. Open answers: token F1 > 0.5 (the KVComm "
        "paper's metric) / the gold answer contained in the answer. Multiple choice: the letter the model writes / "
        "the option with the highest length-normalised likelihood under the receiver in the state the handoff left. "
        "n/a: the handoff does not apply (the notes under the table say why).",
        "",
        "Reading these numbers: the samples are few (see n), so the intervals are wide; differences inside them are "
        "noise. Containment rewards answers that list several candidates (token F1 does not), so read the two open-answer "
        "columns together. Gemma-3-270M is a base model and often does not write a letter after the lettered options; "
        "for it the likelihood column is the informative multiple-choice metric. Latencies are wall-clock on the "
        "machine named above, shared with other jobs while it ran: compare handoffs within one run, not across runs.",
        "",
    ]
    header = ["handoff"]
    for title, summary, config in tables:
        kind = summary[0]["kind"] if summary else "open"
        samples = max((entry["samples"] for entry in summary), default=0)
        for _, name in HEADLINE[kind]:
            header.append(f"{title} ({name}, n={samples})")
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for variant in variants:
        cells = [variant]
        for _, summary, _ in tables:
            entry = next((e for e in summary if e["variant"] == variant), None)
            kind = summary[0]["kind"] if summary else "open"
            for short, _ in HEADLINE[kind]:
                if entry is None:
                    cells.append("not run")
                elif entry["applicable"] == 0 or entry.get(f"acc_{short}") is None:
                    cells.append("n/a")
                else:
                    cells.append(_fmt_acc(entry, short))
        lines.append("| " + " | ".join(cells) + " |")
    lines += [""]
    for title, summary, config in tables:
        options = ", ".join(f"{k}={v}" for k, v in (config.get("dataset_options") or {}).items())
        lines.append(
            f"- {title}: dataset `{config['dataset']}`{' (' + options + ')' if options else ''}, limit {config.get('limit')}, "
            f"{max((entry['samples'] for entry in summary), default=0)} samples run "
            f"(seeded shuffle, seed {config['seed']}), answers up to {config['max_new_tokens']} tokens, text messages up to "
            f"{config['message_tokens']} tokens."
        )
    reasons = {}
    for _, summary, _ in tables:
        for entry in summary:
            if entry["applicable"] == 0 and entry["not_applicable_reason"]:
                reasons.setdefault(entry["variant"], set()).add(entry["not_applicable_reason"])
    for variant, why in reasons.items():
        lines.append(f"- n/a for {variant}: " + " / ".join(sorted(why)))
    notes = {entry.get("likelihood_note") for _, summary, _ in tables for entry in summary if entry.get("likelihood_note")}
    for note in sorted(notes):
        lines.append(f"- likelihood column {note}")

    perf = None
    if perf_dir and (perf_dir / "perf.json").exists():
        perf = json.loads((perf_dir / "perf.json").read_text(encoding="utf-8"))
    lines += ["", "## Targets (benchmark goals of issue 6)", "", "| target | measured | verdict |", "|---|---|---|"]
    if perf:
        shared = perf["shared_question"]
        if shared["c2c_unavailable"]:
            lines.append(f"| C2C latency <= 0.4x text | {shared['c2c_unavailable']} | not measurable |")
        else:
            value = shared["ratios"]["c2c / text"]["median"]
            lines.append(f"| C2C latency <= 0.4x text | {value:.2f}x | {'met' if value <= 0.4 else 'missed'} |")
        row = next((r for r in perf["context_curve"] if r["target_tokens"] == 1024), None)
        if row:
            label = next(iter(row["kvcomm"]))
            value = row["kvcomm"][label]["ttft_ratio_receiver"]["median"]
            e2e = row["kvcomm"][label]["ttft_ratio_e2e"]["median"]
            lines.append(
                f"| KVComm receiver-side TTFT <= 0.3x Skyline at 1024 tokens | {label}: {value:.3f}x (end to end {e2e:.2f}x) "
                f"| {'met' if value <= 0.3 else 'missed'} |"
            )
    countries = next((summary for title, summary, config in tables if config["dataset"] == "countries"), None)
    if countries:
        by = {entry["variant"]: entry for entry in countries}
        sky, kv3 = by.get("skyline"), by.get("kvcomm@0.3")
        if sky and kv3 and sky.get("acc_f1"):
            share = kv3["acc_f1"] / sky["acc_f1"]
            lines.append(
                f"| KVComm r=0.3 accuracy >= 80% of Skyline's on Countries | {kv3['acc_f1']:.2f} vs {sky['acc_f1']:.2f} "
                f"({share:.0%}) | {'met' if share >= 0.8 else 'missed'} |"
            )
    if perf:
        from kvviz import perf as perf_module

        lines += ["", "## Performance (`python -m kvviz bench --perf`)", "", perf_module.markdown(perf)]
    lines += ["", "## Per-dataset details (latency per stage, bytes, FLOPs)", ""]
    for title, summary, config in tables:
        lines += [summary_markdown(summary, f"### {title}"), ""]
    return "\n".join(lines).rstrip() + "\n"


def write_results_markdown(path: str, runs: list[str], perf_dir: str | None, command: str) -> None:
    """``runs``: "Title=FOLDER" items. Called by scripts/make_results.sh."""
    import subprocess

    from kvviz.perf import machine_facts

    pairs = []
    for item in runs:
        title, _, folder = item.partition("=")
        pairs.append((title, Path(folder)))
    machine = machine_facts("cpu")
    if perf_dir and (Path(perf_dir) / "perf.json").exists():
        machine = json.loads((Path(perf_dir) / "perf.json").read_text(encoding="utf-8"))["machine"]
        machine["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")  # this page; the perf section has its own date
        machine["git_commit"] = machine_facts("cpu")["git_commit"]
    try:
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parents[1]).stdout
        machine["dirty"] = bool(status.strip())
    except OSError:
        pass
    text = results_markdown(pairs, Path(perf_dir) if perf_dir else None, machine, command)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text, encoding="utf-8")
