"""A run as data: the payload the page keeps and ``/run`` returns, its table (one row per
handoff, the page's "Results as data" and the CSV export) and the export files."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from kvviz.app.present.text import notes_of
from kvviz.app.reading import catalog
from kvviz.app.reading.reading import Reading
from kvviz.core.results import STAGES


def payload(pair: str, request: dict | None, results: list[dict], precomputed: bool, preset_key: str | None = None) -> dict:
    """The structured results of one run: what the JSON box shows and the export writes."""
    return {"pair": pair, "preset": preset_key, "precomputed": precomputed, "request": request, "results": results}


RESULT_COLUMNS = (
    ["handoff", "title", "applicable", "reason", "answer", "bytes_communicated", "communication"]
    + [f"{stage}_s" for stage in STAGES]
    + ["total_s", "first_token_s", "receiver_first_token_s", "generated_tokens", "message_tokens", "notes", "precomputed"]
)


def results_frame(reading: Reading) -> pd.DataFrame:
    """One row per handoff of a run: the page's "Results as data" table and the CSV export."""
    rows = []
    for result in reading.results():
        timings, tokens = result.timings or {}, result.tokens or {}
        row = {
            "handoff": result.handoff, "title": catalog.title_of(result.handoff), "applicable": result.applicable,
            "reason": result.reason, "answer": result.answer, "bytes_communicated": result.bytes_communicated,
            "communication": result.communication, "total_s": timings.get("total"),
            "first_token_s": result.first_token_seconds, "receiver_first_token_s": result.receiver_first_token_seconds,
            "generated_tokens": tokens.get("generated"), "message_tokens": tokens.get("message"),
            "notes": "; ".join(notes_of(result)), "precomputed": result.precomputed,
        }
        row.update({f"{stage}_s": timings.get(stage) for stage in STAGES})
        rows.append(row)
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def reading_frame(reading: Reading) -> pd.DataFrame:
    """The page's "Results as data" table: ``results_frame`` with its seconds rounded to the
    millisecond for reading (the CSV export and the JSON keep full precision)."""
    return results_frame(reading).round(3)


def attention_of(reading: Reading) -> dict:
    """Each column's per-token attention arrays (``token_attention``, the large part of a run), for
    the export that holds them apart; only the columns that recorded some."""
    return {result.handoff: result.token_attention for result in reading.results()
            if (result.token_attention or {}).get("attention")}


def write_exports(data: dict, reading: Reading, folder: str | Path, attention: dict | None = None) -> list[str]:
    """The payload ``data`` as a JSON file and its table as a CSV file, in ``folder``, and, given
    the per-token attention apart (``attention``: column -> its ``token_attention``; ``data`` then
    holds its shape only), that as a third file; returns the paths, small first."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    json_path = folder / f"kvviz-results-{stamp}.json"
    csv_path = folder / f"kvviz-results-{stamp}.csv"
    json_path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    results_frame(reading).to_csv(csv_path, index=False)
    paths = [str(json_path), str(csv_path)]
    if attention:
        attention_path = folder / f"kvviz-attention-{stamp}.json"
        attention_path.write_text(json.dumps(attention, ensure_ascii=False), encoding="utf-8")
        paths.append(str(attention_path))
    return paths
