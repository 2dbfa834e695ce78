"""Where the datasets are (``../shared/data`` or ``$KVVIZ_DATA_DIR``) and how their files are read:
JSONL and JSON arrays, each bad line reported with its number."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvviz.core.paths import SHARED_DATA
from kvviz.data.record import LoadReport

#: Environment variable that overrides where the datasets are looked for.
DATA_DIR_ENV = "KVVIZ_DATA_DIR"

#: <repo>/../shared/data (``kvviz.core.paths.SHARED_DATA``).
DEFAULT_DATA_DIR = SHARED_DATA


def get_data_dir() -> Path:
    """The shared data folder: ``$KVVIZ_DATA_DIR`` if set, else ``../shared/data``.

    Raises FileNotFoundError (saying where it looked) if the folder is missing.
    """
    env = os.environ.get(DATA_DIR_ENV, "").strip()
    path = Path(env).expanduser() if env else DEFAULT_DATA_DIR
    if not path.is_dir():
        origin = f"from ${DATA_DIR_ENV}" if env else f"the default; ${DATA_DIR_ENV} is not set"
        raise FileNotFoundError(
            f"kvviz data folder not found: {path} ({origin}). Put the shared datasets "
            f"there, or set {DATA_DIR_ENV} to the folder that holds kvcomm_countries/, "
            f"hotpotqa_dev_first103/, mmlu_redux/, ..."
        )
    return path


def dataset_path(data_dir: Path | None, *parts: str) -> Path:
    base = Path(data_dir) if data_dir is not None else get_data_dir()
    if not base.is_dir():
        raise FileNotFoundError(f"kvviz data folder not found: {base} (passed as data_dir)")
    path = base.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(
            f"dataset file not found: {path}. The data folder {base} exists but lacks "
            f"{'/'.join(parts)}; check the shared data copy or ${DATA_DIR_ENV}."
        )
    return path


# ---------------------------------------------------------------------------
# Small reading helpers
# ---------------------------------------------------------------------------


def iter_jsonl(path: Path, report: LoadReport) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line_number, object) for each JSON object line; report bad lines.

    Blank lines are not records and are skipped without a report.
    """
    with path.open("r", encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                report.add(path, line_no, f"invalid JSON: {exc.msg} (column {exc.colno})")
                continue
            if not isinstance(obj, dict):
                report.add(path, line_no, f"expected a JSON object, got {type(obj).__name__}")
                continue
            yield line_no, obj


def iter_json_array(path: Path, report: LoadReport) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (item_number, object) from a file holding one JSON array."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        # The whole file is unusable: that is an error, not a skipped record.
        raise ValueError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from exc
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON array of objects, got {type(data).__name__}")
    for item_no, obj in enumerate(data, start=1):
        if not isinstance(obj, dict):
            report.add(path, item_no, f"expected a JSON object, got {type(obj).__name__}")
            continue
        yield item_no, obj


def nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def optional_text(value: Any) -> str | None:
    """Empty strings become None (e.g. instruction data with input "")."""
    if value is None:
        return None
    text = str(value)
    return text if text.strip() else None
