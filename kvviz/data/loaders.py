"""Datasets into one record shape.

Every dataset, whatever its file format, is turned into one record shape,
:class:`Record`, so that the hand-off methods and the evaluation code never
need to know where a question came from.

Datasets are read from ``../shared/data`` next to the repository (override
with the environment variable ``KVVIZ_DATA_DIR``).  Each folder there has a
``SOURCE.txt`` saying where the files came from and what is in them.

    ``load_dataset(name_or_path, limit=None, seed=None, **options)``
    ``load_dataset_with_report(...) -> (records, LoadReport)``
    ``DATASETS``: registered name -> loader function

Bad input records (invalid JSON, a missing question, an answer that is not
one of the choices, ...) are never dropped silently: each is listed in the
:class:`LoadReport` with its file and line number and a ``warnings.warn``
summarises them.
"""

from __future__ import annotations

import os
import random
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvviz.data.arc import load_arc_challenge
from kvviz.data.countries import load_countries
from kvviz.data.handbook import load_handbook
from kvviz.data.hotpotqa import load_hotpotqa
from kvviz.data.instructions import load_dolly, load_instructions
from kvviz.data.mmlu_redux import load_mmlu_redux
from kvviz.data.openbookqa import load_openbookqa
from kvviz.data.recall import load_recall
from kvviz.data.record import LoadReport, Record
from kvviz.data.tipsheets import load_tipsheets
from kvviz.data.user_files import load_user_file
from kvviz.data.whereabouts import load_whereabouts

#: Registered dataset name -> loader.  Every loader takes keyword-only
#: options plus ``data_dir`` and ``report``.
DATASETS: dict[str, Callable[..., list[Record]]] = {
    "countries": load_countries,
    "tipsheets": load_tipsheets,
    "hotpotqa": load_hotpotqa,
    "recall": load_recall,
    "arc_challenge": load_arc_challenge,
    "openbookqa": load_openbookqa,
    "mmlu_redux": load_mmlu_redux,
    "dolly": load_dolly,
    "instructions": load_instructions,
    "whereabouts": load_whereabouts,
    "handbook": load_handbook,
}


def _looks_like_path(name: str) -> bool:
    return os.sep in name or "/" in name or name.lower().endswith((".jsonl", ".json")) or Path(name).is_file()


def load_dataset_with_report(
    name_or_path: str | os.PathLike[str],
    limit: int | None = None,
    seed: int | None = None,
    **options: Any,
) -> tuple[list[Record], LoadReport]:
    """Like :func:`load_dataset` but also return the :class:`LoadReport`.

    Does not warn; the caller decides what to do with the report.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, not {limit!r}")
    name = os.fspath(name_or_path)
    # A str that is a registered name wins; a Path object is always a file.
    if not isinstance(name_or_path, os.PathLike) and name in DATASETS:
        report = LoadReport(name)
        records = DATASETS[name](report=report, **options)
    elif isinstance(name_or_path, os.PathLike) or _looks_like_path(name):
        if options:
            raise TypeError(f"options {sorted(options)} are not supported for a file path")
        path = Path(name).expanduser()
        report = LoadReport(str(path))
        records = load_user_file(path, report)
    else:
        raise ValueError(
            f"unknown dataset {name!r}; known datasets: {', '.join(sorted(DATASETS))} "
            f"(or give a path to a .jsonl file)"
        )
    report.loaded = len(records)
    if seed is not None:
        # A private Random: the same seed gives the same subset whatever else
        # the program does with the global random state.
        records = list(records)
        random.Random(seed).shuffle(records)
    if limit is not None:
        records = records[:limit]
    return records, report


def load_dataset(
    name_or_path: str | os.PathLike[str],
    limit: int | None = None,
    seed: int | None = None,
    **options: Any,
) -> list[Record]:
    """Load a registered dataset (see ``DATASETS``) or a user JSONL file.

    User files hold one JSON object per line, in one of these shapes::

        {"id"?, "context"?, "question", "answers": ["...", ...]}
        {"id"?, "context"?, "question", "choices": [...], "answer": 1 | "B" | "<choice text>"}
        {"id"?, "instruction", "input"?, "output"}

    ``seed`` shuffles (reproducibly) before ``limit`` takes the first N.
    ``options`` go to the named loader (e.g. ``all_paragraphs=True`` for
    hotpotqa, ``keep_errors=True`` / ``subjects=[...]`` for mmlu_redux,
    ``split=`` / ``with_fact=`` for openbookqa).  Bad records are skipped
    and reported with ``warnings.warn``; use :func:`load_dataset_with_report`
    to get them as data.
    """
    records, report = load_dataset_with_report(name_or_path, limit=limit, seed=seed, **options)
    if report.problems:
        warnings.warn(report.summary(), stacklevel=2)
    return records
