"""Datasets and metrics for kvviz, in three rooms:

* ``kvviz.data.loaders``: every dataset into one record shape (``Record``, ``load_dataset``);
* ``kvviz.data.metrics``: answer metrics (token F1, containment, Wilson interval, McNemar's test);
* ``kvviz.data.choices``: multiple choice asked and read one way for every command.

The names below are the package's public face: ``from kvviz.data import load_dataset`` works.
"""

from kvviz.data.choices import LETTERS, MC_INSTRUCTION, choice_query, extract_choice_letter, format_choices
from kvviz.data.loaders import (
    DATA_DIR_ENV,
    DATASETS,
    DEFAULT_DATA_DIR,
    LoadReport,
    Problem,
    Record,
    get_data_dir,
    load_dataset,
    load_dataset_with_report,
)
from kvviz.data.metrics import contains_answer, f1_match, mcnemar_exact, normalize_answer, token_f1, wilson_interval

__all__ = [
    "DATA_DIR_ENV",
    "DATASETS",
    "DEFAULT_DATA_DIR",
    "LETTERS",
    "MC_INSTRUCTION",
    "LoadReport",
    "Problem",
    "Record",
    "choice_query",
    "contains_answer",
    "extract_choice_letter",
    "f1_match",
    "format_choices",
    "get_data_dir",
    "load_dataset",
    "load_dataset_with_report",
    "mcnemar_exact",
    "normalize_answer",
    "token_f1",
    "wilson_interval",
]
