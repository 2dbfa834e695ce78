"""Summarising benchmark rows: one line per variant (accuracy with 95% Wilson intervals for every
metric, mean and median latency per stage, bytes, FLOPs), as a DataFrame, a CSV, a markdown
table and plotly figures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from kvviz.core.results import STAGES
from kvviz.data import wilson_interval
from kvviz.studies.bench.content import content_markdown, content_summary
from kvviz.studies.bench.contradiction import contradiction_markdown, contradiction_summary
from kvviz.studies.bench.rows import TIME_COLUMNS, read_rows, write_frame

COST_COLUMNS = TIME_COLUMNS + ["bytes", "flops_sharer", "flops_receiver", "flops_total", "generated_tokens"]
APPLICABLE = ("1", "True", "true")


def markdown_table(frame: pd.DataFrame) -> str:
    """A DataFrame of display strings as a markdown table (pandas' ``to_markdown`` needs tabulate)."""
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def records(summary: pd.DataFrame) -> list[dict]:
    """Summary rows as dicts, with None where a value is missing (not NaN)."""
    return summary.astype(object).where(summary.notna(), None).to_dict("records")


def _accuracy(values: pd.Series) -> dict:
    values = pd.to_numeric(values[values != ""], errors="coerce").dropna().astype(int)
    if values.empty:
        return {"n": 0, "accuracy": None, "ci_low": None, "ci_high": None}
    correct, n = int(values.sum()), len(values)
    low, high = wilson_interval(correct, n)
    return {"n": n, "accuracy": correct / n, "ci_low": low, "ci_high": high}


def _summarize_variant(name: str, group: pd.DataFrame) -> dict:
    ok = group[group["applicable"].astype(str).isin(APPLICABLE)]
    failed = group[~group.index.isin(ok.index)]
    kind = group["kind"].iloc[0] or "open"
    reasons = [reason for reason in failed.get("reason", []) if reason]
    entry: dict = {
        "variant": name,
        "handoff": group["handoff"].iloc[0],
        "kind": kind,
        "samples": len(group),
        "applicable": len(ok),
        "not_applicable_reason": reasons[0] if reasons else "",
    }
    metrics = ["correct_f1", "correct_contains"] + (["correct_letter", "correct_likelihood"] if kind == "choice" else [])
    for metric in metrics:
        stats = _accuracy(ok[metric]) if metric in ok else _accuracy(pd.Series(dtype=str))
        short = metric.removeprefix("correct_")
        entry[f"acc_{short}"] = stats["accuracy"]
        entry[f"acc_{short}_low"] = stats["ci_low"]
        entry[f"acc_{short}_high"] = stats["ci_high"]
        entry[f"n_{short}"] = stats["n"]
    if kind == "choice":
        notes = [note for note in ok.get("likelihood_note", []) if note]
        entry["likelihood_note"] = notes[0] if notes else ""
    for column in COST_COLUMNS:
        values = pd.to_numeric(ok[column], errors="coerce").dropna() if column in ok else pd.Series(dtype=float)
        entry[f"{column}_mean"] = float(values.mean()) if len(values) else None
        entry[f"{column}_median"] = float(values.median()) if len(values) else None
    return entry


def summarize(rows: pd.DataFrame | list[dict], order: list[str] | None = None) -> pd.DataFrame:
    """One summary row per variant, in ``order`` (then any others, sorted)."""
    rows = pd.DataFrame(rows).fillna("")
    if rows.empty:
        return pd.DataFrame()
    groups = dict(tuple(rows.groupby("variant", sort=False)))
    names = [name for name in (order or []) if name in groups]
    names += sorted(name for name in groups if name not in names)
    return pd.DataFrame([_summarize_variant(name, groups[name]) for name in names])


def format_accuracy(entry: dict, short: str) -> str:
    accuracy = entry.get(f"acc_{short}")
    if accuracy is None:
        return "n/a"
    return f"{accuracy:.2f} [{entry[f'acc_{short}_low']:.2f}, {entry[f'acc_{short}_high']:.2f}]"


def _seconds(value) -> str:
    return "" if value is None else f"{value:.3f}"


def _count(value) -> str:
    if value is None:
        return ""
    for scale, unit, digits in ((1e9, " G", 2), (1e6, " M", 2), (1e3, " k", 1)):
        if value >= scale:
            return f"{value / scale:.{digits}f}{unit}"
    return f"{value:.0f}"


def accuracy_headers(kind: str) -> list[tuple[str, str]]:
    if kind == "choice":
        return [("letter", "acc (letter)"), ("likelihood", "acc (likelihood)")]
    return [("f1", "acc (F1>0.5)"), ("contains", "acc (contains)")]


def summary_markdown(summary: pd.DataFrame, title: str = "") -> str:
    """The summary as a markdown table: accuracy with 95% Wilson intervals, latency, bytes, FLOPs;
    then notes on what did not apply."""
    entries = records(summary)
    if not entries:
        return "(no rows)\n"
    acc = accuracy_headers(entries[0]["kind"])
    header = (
        ["handoff", "n"]
        + [name for _, name in acc]
        + [f"{stage} s (mean / median)" for stage in STAGES]
        + ["total s (mean / median)", "TTFT s (median)", "bytes (mean)", "FLOPs (mean)"]
    )
    cells, notes = [], []
    for entry in entries:
        if entry["applicable"] == 0:
            cells.append([entry["variant"], str(entry["samples"])] + ["n/a"] * (len(header) - 2))
            notes.append(f"{entry['variant']}: {entry['not_applicable_reason']}")
            continue
        row = [entry["variant"], str(entry["applicable"])] + [format_accuracy(entry, short) for short, _ in acc]
        for column in [f"time_{stage}" for stage in STAGES] + ["time_total"]:
            row.append(f"{_seconds(entry[column + '_mean'])} / {_seconds(entry[column + '_median'])}")
        row += [_seconds(entry["ttft_median"]), _count(entry["bytes_mean"]), _count(entry["flops_total_mean"])]
        cells.append(row)
        if entry["applicable"] < entry["samples"]:
            notes.append(f"{entry['variant']}: {entry['samples'] - entry['applicable']} sample(s) not applicable: "
                         f"{entry['not_applicable_reason']}")
        if entry.get("likelihood_note"):
            notes.append(f"{entry['variant']}: likelihood {entry['likelihood_note']}")
    lines = ([title, ""] if title else []) + [markdown_table(pd.DataFrame(cells, columns=header))]
    if notes:
        lines += [""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def figures(summary: pd.DataFrame) -> list:
    """Plotly figures from summary rows (data in, figures out; lists, not numpy arrays)."""
    import plotly.graph_objects as go

    shown = [entry for entry in records(summary) if entry["applicable"]]
    if not shown:
        return []
    kind = shown[0]["kind"]
    short = "letter" if kind == "choice" else "f1"
    names = [entry["variant"] for entry in shown]
    accuracy = [entry[f"acc_{short}"] or 0.0 for entry in shown]
    upper = [(entry[f"acc_{short}_high"] or 0.0) - a for entry, a in zip(shown, accuracy)]
    lower = [a - (entry[f"acc_{short}_low"] or 0.0) for entry, a in zip(shown, accuracy)]
    metric = dict(accuracy_headers(kind))[short]
    accuracy_figure = go.Figure(go.Bar(x=names, y=accuracy, error_y=dict(type="data", array=upper, arrayminus=lower), name=metric))
    accuracy_figure.update_layout(title=f"Accuracy, {metric}, with 95% Wilson intervals", yaxis=dict(range=[0, 1]))

    latency_figure = go.Figure()
    for stage in STAGES:
        latency_figure.add_bar(x=names, y=[entry[f"time_{stage}_mean"] or 0.0 for entry in shown], name=stage)
    latency_figure.update_layout(barmode="stack", title="Mean latency per stage (s)", yaxis_title="seconds")

    cost_figure = go.Figure(
        go.Scatter(x=[entry["bytes_mean"] or 0.0 for entry in shown], y=accuracy, text=names, mode="markers+text",
                   textposition="top center")
    )
    cost_figure.update_layout(title="Accuracy against bytes communicated", xaxis_title="bytes per sample (mean)", yaxis_title=metric)
    return [accuracy_figure, latency_figure, cost_figure]


def _atomic_text(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def write_figures(path: Path, summary: pd.DataFrame, title: str = "") -> None:
    parts = [figure.to_html(full_html=False, include_plotlyjs=index == 0) for index, figure in enumerate(figures(summary))]
    body = "\n".join(parts) or "<p>No applicable rows.</p>"
    _atomic_text(path, f"<!doctype html><html><head><meta charset='utf-8'><title>{title or 'kvviz bench'}</title></head>"
                       f"<body>\n{body}\n</body></html>\n")


def write_summary(out: Path, order: list[str] | None = None, title: str = "") -> pd.DataFrame:
    """summary.csv, summary.md and figures.html from every rows file in ``out``; with a swap arm
    (``bench --swap``) also content.json and the content table in summary.md, with a contradiction
    arm (``--contradict``) contradiction.json and its table."""
    rows = read_rows(out)
    summary = summarize(rows, order)
    if not summary.empty:
        write_frame(out / "summary.csv", summary)
    text = summary_markdown(summary, title)
    content = content_summary(rows, order) if not rows.empty else []
    if content:
        _atomic_text(out / "content.json", json.dumps(content, indent=2))
        text += "\n" + content_markdown(content)
    contradicted = contradiction_summary(rows, order) if not rows.empty else []
    if contradicted:
        _atomic_text(out / "contradiction.json", json.dumps(contradicted, indent=2))
        text += "\n" + contradiction_markdown(contradicted)
    _atomic_text(out / "summary.md", text)
    write_figures(out / "figures.html", summary, title)
    return summary
