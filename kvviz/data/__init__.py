"""Datasets and metrics for kvviz, one room each:

* ``kvviz.data.loaders``: every dataset into one record shape (``load_dataset``, ``DATASETS``),
  one file per dataset (``countries``, ``tipsheets``, ``hotpotqa``, ``arc``, ``openbookqa``,
  ``mmlu_redux``, ``instructions``: Dolly and the small instruction set, ``user_files``: your own
  JSONL), on ``record`` (``Record``, ``LoadReport``) and ``files`` (where the data is, how it is read);
* ``kvviz.data.recall``: private-context recall records made here (C2C's training data);
* ``kvviz.data.metrics``: answer metrics (token F1, containment, the page's verdict);
* ``kvviz.data.stats``: the statistics every table prints, from ``scipy.stats`` (Wilson interval, McNemar's
  exact test, the paired comparison of two variants, the bootstrap);
* ``kvviz.data.choices``: multiple choice asked and read one way for every command.

The names below are the package's public face: ``from kvviz.data import load_dataset`` works.
"""

from kvviz.data.choices import LETTERS, MC_INSTRUCTION, choice_query, extract_choice_letter, format_choices
from kvviz.data.files import DATA_DIR_ENV, DEFAULT_DATA_DIR, get_data_dir
from kvviz.data.loaders import DATASETS, load_dataset, load_dataset_with_report
from kvviz.data.metrics import VERDICT_METRIC, contains_answer, f1_match, normalize_answer, token_f1, verdict
from kvviz.data.record import LoadReport, Problem, Record
from kvviz.data.stats import format_p, mcnemar_exact, paired_mcnemar, wilson_interval

__all__ = [
    "DATA_DIR_ENV",
    "DATASETS",
    "DEFAULT_DATA_DIR",
    "LETTERS",
    "MC_INSTRUCTION",
    "VERDICT_METRIC",
    "LoadReport",
    "Problem",
    "Record",
    "choice_query",
    "contains_answer",
    "extract_choice_letter",
    "f1_match",
    "format_p",
    "format_choices",
    "get_data_dir",
    "load_dataset",
    "load_dataset_with_report",
    "mcnemar_exact",
    "normalize_answer",
    "paired_mcnemar",
    "token_f1",
    "verdict",
    "wilson_interval",
]
