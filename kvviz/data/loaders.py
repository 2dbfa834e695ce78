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

import ast
import csv
import dataclasses
import io
import json
import os
import random
import re
import unicodedata
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from kvviz.data.choices import LETTERS
from kvviz.paths import SHARED_DATA

#: Environment variable that overrides where the datasets are looked for.
DATA_DIR_ENV = "KVVIZ_DATA_DIR"

#: <repo>/../shared/data (``kvviz.paths.SHARED_DATA``).
DEFAULT_DATA_DIR = SHARED_DATA


# ---------------------------------------------------------------------------
# Record and report
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One question (or one instruction) in the common shape.

    ``context`` is the text only the sharing model sees (the sender in a
    hand-off); ``question`` is what the receiving model is asked.  For
    multiple choice, ``choices`` holds the options in order (letters A, B,
    C... by position), ``answer_index`` the right one, and ``answers`` holds
    the right option's text so that the open-answer metrics work too.
    ``response`` is the reference output of instruction data.  ``meta`` keeps
    dataset-specific extras (MMLU-Redux subject and error_type, HotpotQA
    type/level, ...); it is informational only.
    """

    id: str
    question: str
    context: str | None
    answers: list[str]
    choices: list[str] | None
    answer_index: int | None
    source: str
    response: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Catch inconsistent records where they are built, not later in a
        # scoring loop.
        if self.choices is not None:
            if not self.choices:
                raise ValueError(f"record {self.id!r}: choices is an empty list")
            if len(self.choices) > len(LETTERS):
                raise ValueError(f"record {self.id!r}: more than {len(LETTERS)} choices")
            if self.answer_index is None or not 0 <= self.answer_index < len(self.choices):
                raise ValueError(
                    f"record {self.id!r}: answer_index {self.answer_index!r} is not a "
                    f"valid index into {len(self.choices)} choices"
                )
        elif self.answer_index is not None:
            raise ValueError(f"record {self.id!r}: answer_index given without choices")

    @property
    def is_multiple_choice(self) -> bool:
        return self.choices is not None

    @property
    def answer_letter(self) -> str | None:
        """Letter of the right choice ("A", "B", ...), or None if not multiple choice."""
        if self.answer_index is None:
            return None
        return LETTERS[self.answer_index]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict (lists and meta are copied)."""
        return dataclasses.asdict(self)


class Problem(NamedTuple):
    """One skipped input record: where it is and why it was skipped.

    ``line`` is the 1-based line number in a JSONL/CSV file (for a CSV record
    spanning several lines, the line it starts on), or the 1-based item number
    in a JSON array file.
    """

    line: int
    reason: str
    path: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass
class LoadReport:
    """What happened while loading: skipped bad records and filtered rows."""

    name: str
    problems: list[Problem] = field(default_factory=list)
    #: Rows dropped on purpose by a loader option (e.g. MMLU-Redux rows whose
    #: error_type is not "ok"); these are not problems.
    filtered: int = 0
    #: Number of records loaded before ``limit`` was applied.
    loaded: int = 0

    def add(self, path: str | Path, line: int, reason: str) -> None:
        self.problems.append(Problem(line, reason, str(path)))

    @property
    def lines(self) -> list[tuple[int, str]]:
        """The problems as ``(line_number, reason)`` pairs."""
        return [(p.line, p.reason) for p in self.problems]

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self, max_items: int = 10) -> str:
        head = [str(p) for p in self.problems[:max_items]]
        more = len(self.problems) - len(head)
        if more > 0:
            head.append(f"... and {more} more")
        return (
            f"{self.name}: skipped {len(self.problems)} bad record(s):\n  "
            + "\n  ".join(head)
        )


# ---------------------------------------------------------------------------
# Where the data lives
# ---------------------------------------------------------------------------


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


def _dataset_path(data_dir: Path | None, *parts: str) -> Path:
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


def _iter_jsonl(path: Path, report: LoadReport) -> Iterator[tuple[int, dict[str, Any]]]:
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


def _iter_json_array(path: Path, report: LoadReport) -> Iterator[tuple[int, dict[str, Any]]]:
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


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _optional_text(value: Any) -> str | None:
    """Empty strings become None (e.g. instruction data with input "")."""
    if value is None:
        return None
    text = str(value)
    return text if text.strip() else None


# ---------------------------------------------------------------------------
# Loaders for the named datasets
# ---------------------------------------------------------------------------


def load_countries(*, data_dir: Path | None = None, report: LoadReport | None = None) -> list[Record]:
    """KVComm "Countries": sender sees "<person> is at <landmark>."; receiver asked the country."""
    report = report if report is not None else LoadReport("countries")
    path = _dataset_path(data_dir, "kvcomm_countries", "countries.jsonl")
    records = []
    for line_no, obj in _iter_jsonl(path, report):
        answer = obj.get("y", obj.get("country"))
        if not _nonempty_str(obj.get("prompt_B")) or not _nonempty_str(answer):
            report.add(path, line_no, "missing prompt_B or answer (y/country)")
            continue
        records.append(
            Record(
                id=str(obj.get("id", f"countries_{line_no:04d}")),
                question=obj["prompt_B"],
                context=_optional_text(obj.get("prompt_A")),
                answers=[answer],
                choices=None,
                answer_index=None,
                source="countries",
                meta={k: obj[k] for k in ("person", "landmark") if k in obj},
            )
        )
    return records


def load_tipsheets(*, data_dir: Path | None = None, report: LoadReport | None = None) -> list[Record]:
    """KVComm "Tip Sheets": pick the company with the positive tip sheet.

    The question (prompt_B) already ends in an answer prefix
    ("The company name is:") and asks for the *name*, not a letter, so score
    it with ``f1_match`` on ``answers`` as KVComm does.  ``choices`` /
    ``answer_index`` are filled as well for letter-style prompting.
    """
    report = report if report is not None else LoadReport("tipsheets")
    path = _dataset_path(data_dir, "kvcomm_tipsheets", "tipsheets.jsonl")
    records = []
    for line_no, obj in _iter_jsonl(path, report):
        options, label = obj.get("options"), obj.get("label")
        if not _nonempty_str(obj.get("prompt_B")):
            report.add(path, line_no, "missing prompt_B")
            continue
        if not isinstance(options, list) or not options or label not in options:
            report.add(path, line_no, f"label {label!r} is not one of the options {options!r}")
            continue
        records.append(
            Record(
                # The file has no ids; the line number is stable.
                id=f"tipsheets_{line_no - 1:04d}",
                question=obj["prompt_B"],
                context=_optional_text(obj.get("prompt_A")),
                answers=[label],
                choices=list(options),
                answer_index=options.index(label),
                source="tipsheets",
                meta={"attitudes": obj["attitudes"]} if "attitudes" in obj else {},
            )
        )
    return records


def load_hotpotqa(
    *,
    all_paragraphs: bool = False,
    data_dir: Path | None = None,
    report: LoadReport | None = None,
) -> list[Record]:
    """HotpotQA dev (distractor), first 103 questions.

    By default the context is only the supporting-fact sentences, one per
    line, which is what KVComm puts in the sender prompt.  With
    ``all_paragraphs=True`` it is every paragraph (gold and distractors) as
    "title\\ntext" blocks separated by blank lines.
    """
    report = report if report is not None else LoadReport("hotpotqa")
    path = _dataset_path(data_dir, "hotpotqa_dev_first103", "hotpot_dev_distractor_v1_first103.json")
    records = []
    for item_no, obj in _iter_json_array(path, report):
        if not _nonempty_str(obj.get("question")) or not _nonempty_str(obj.get("answer")):
            report.add(path, item_no, "missing question or answer")
            continue
        paragraphs = {title: sentences for title, sentences in obj.get("context", [])}
        if all_paragraphs:
            # Sentences carry their own leading spaces, so "".join reads naturally.
            context = "\n\n".join(
                f"{title}\n{''.join(sentences).strip()}" for title, sentences in obj["context"]
            )
        else:
            support = []
            for title, sent_id in obj.get("supporting_facts", []):
                sentences = paragraphs.get(title, [])
                if 0 <= sent_id < len(sentences):
                    support.append(sentences[sent_id].strip())
                else:
                    # KVComm only prints a warning here; we keep the record
                    # with the facts that exist but say so in the report.
                    report.add(path, item_no, f"supporting fact {title!r}[{sent_id}] not in context (kept record)")
            if not support:
                report.add(path, item_no, "no supporting-fact sentence found")
                continue
            context = "\n".join(support)
        records.append(
            Record(
                id=str(obj.get("_id", f"hotpotqa_{item_no:04d}")),
                question=obj["question"],
                context=context,
                answers=[obj["answer"]],
                choices=None,
                answer_index=None,
                source="hotpotqa",
                meta={k: obj[k] for k in ("type", "level") if k in obj},
            )
        )
    return records


def _letter_to_index(label: Any, n: int) -> int | None:
    if isinstance(label, str) and len(label.strip()) == 1:
        idx = LETTERS.find(label.strip().upper())
        if 0 <= idx < n:
            return idx
    return None


def load_arc_challenge(*, data_dir: Path | None = None, report: LoadReport | None = None) -> list[Record]:
    """ARC-Challenge test set (1,172 questions; 3 to 5 options, labels A..E)."""
    report = report if report is not None else LoadReport("arc_challenge")
    path = _dataset_path(data_dir, "arc_challenge_test", "arc_challenge_test.jsonl")
    records = []
    for line_no, obj in _iter_jsonl(path, report):
        options = obj.get("options")
        if not _nonempty_str(obj.get("question")) or not isinstance(options, list) or not options:
            report.add(path, line_no, "missing question or options")
            continue
        labels = [o.get("label") for o in options]
        if labels != list(LETTERS[: len(options)]):
            # Positional letters must equal the file's labels, otherwise
            # "answer_letter" would silently point at a different option.
            report.add(path, line_no, f"option labels {labels} are not A, B, C... in order")
            continue
        idx = _letter_to_index(obj.get("answer"), len(options))
        if idx is None:
            report.add(path, line_no, f"answer {obj.get('answer')!r} is not one of the option labels")
            continue
        choices = [o["text"] for o in options]
        records.append(
            Record(
                id=str(obj.get("id", f"arc_{line_no:04d}")),
                question=obj["question"],
                context=None,
                answers=[choices[idx]],
                choices=choices,
                answer_index=idx,
                source="arc_challenge",
            )
        )
    return records


def load_openbookqa(
    *,
    split: str = "test",
    with_fact: bool = False,
    data_dir: Path | None = None,
    report: LoadReport | None = None,
) -> list[Record]:
    """OpenBookQA v1 ("test" or "dev", 500 each, 4 options).

    With ``with_fact=True`` the ``*_complete.jsonl`` file is read and its
    ``fact1`` (the gold science fact) becomes the sender context.
    """
    if split not in ("test", "dev"):
        raise ValueError(f"openbookqa split must be 'test' or 'dev', not {split!r}")
    report = report if report is not None else LoadReport("openbookqa")
    filename = f"{split}_complete.jsonl" if with_fact else f"{split}.jsonl"
    path = _dataset_path(data_dir, "openbookqa", filename)
    records = []
    for line_no, obj in _iter_jsonl(path, report):
        q = obj.get("question") or {}
        stem, options = q.get("stem"), q.get("choices")
        if not _nonempty_str(stem) or not isinstance(options, list) or not options:
            report.add(path, line_no, "missing question stem or choices")
            continue
        labels = [o.get("label") for o in options]
        if labels != list(LETTERS[: len(options)]):
            report.add(path, line_no, f"choice labels {labels} are not A, B, C... in order")
            continue
        idx = _letter_to_index(obj.get("answerKey"), len(options))
        if idx is None:
            report.add(path, line_no, f"answerKey {obj.get('answerKey')!r} is not one of the labels")
            continue
        if with_fact and not _nonempty_str(obj.get("fact1")):
            report.add(path, line_no, "with_fact=True but fact1 is missing")
            continue
        choices = [o["text"] for o in options]
        records.append(
            Record(
                id=str(obj.get("id", f"openbookqa_{line_no:04d}")),
                question=stem,
                context=obj["fact1"] if with_fact else None,
                answers=[choices[idx]],
                choices=choices,
                answer_index=idx,
                source="openbookqa",
            )
        )
    return records


def _normalize_error_type(value: str) -> str:
    # The annotators spelled it many ways: "OK", "Ok", "ok ", "Wrong Groundtruth",
    # "wrong_groundtruth ", "bad question clarity", ...
    return re.sub(r"[\s\-]+", "_", value.strip().lower())


def _decode_csv_bytes(raw: bytes) -> tuple[str, str]:
    """Decode a CSV that may not be UTF-8; return (text, encoding used).

    SOURCE.txt calls the one non-UTF-8 MMLU-Redux file (moral_scenarios)
    cp1252, but its only non-ASCII byte is 0xD5 in "sister\\xd5s", which is
    "'" (U+2019) in Mac Roman and a nonsensical "Õ" in cp1252: it was saved
    by a Mac.  So try both 8-bit encodings and keep the one whose non-ASCII
    characters are more often punctuation (curly quotes, dashes), which is
    what stray non-ASCII bytes in English text almost always are; cp1252 wins
    ties.
    """
    try:
        return raw.decode("utf-8-sig"), "utf-8"  # -sig: tolerate a BOM
    except UnicodeDecodeError:
        pass

    def punctuation_share(text: str) -> int:
        return sum(unicodedata.category(ch).startswith("P") for ch in text if ord(ch) > 127)

    candidates = [(enc, raw.decode(enc, errors="replace")) for enc in ("cp1252", "mac_roman")]
    encoding, text = max(candidates, key=lambda c: punctuation_share(c[1]))  # max keeps the first on ties
    return text, encoding


def _read_mmlu_csv(path: Path, report: LoadReport) -> Iterator[tuple[int, int, dict[str, str]]]:
    """Yield (start_line, row_index, row) from one MMLU-Redux CSV, whatever its dialect."""
    text, _encoding = _decode_csv_bytes(path.read_bytes())
    header_line = text.split("\n", 1)[0]
    # Some files are ';'-separated; the header has no quoted text, so counting
    # separators there is a reliable sniff (csv.Sniffer stumbles on the
    # multi-line quoted questions).
    delimiter = ";" if header_line.count(";") > header_line.count(",") else ","
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = next(reader)
    except StopIteration:
        report.add(path, 1, "empty file")
        return
    # Column order differs between files and one has extra empty columns:
    # address cells by (normalised) header name, ignore unnamed columns.
    columns = [h.strip().lower() for h in header]
    missing = {"question", "choices", "answer", "error_type"} - set(columns)
    if missing:
        report.add(path, 1, f"header lacks column(s) {sorted(missing)}: {header!r}")
        return
    prev_line = reader.line_num
    row_index = 0
    for cells in reader:
        start_line, prev_line = prev_line + 1, reader.line_num
        if not any(c.strip() for c in cells):
            continue  # blank line
        row = {name: cell for name, cell in zip(columns, cells) if name}
        yield start_line, row_index, row
        row_index += 1


def load_mmlu_redux(
    *,
    subjects: Iterable[str] | None = None,
    keep_errors: bool = False,
    data_dir: Path | None = None,
    report: LoadReport | None = None,
) -> list[Record]:
    """MMLU-Redux v1: 57 subjects x 100 questions, 4 options each.

    Rows whose (normalised) ``error_type`` is not "ok" are dropped unless
    ``keep_errors=True`` (they count in ``report.filtered``).  Kept error rows
    still use the original ``answer`` label; the annotators' free-form
    ``correct_answer`` is in ``meta``.  ``subjects`` restricts to some
    subjects (names without the "mmlu_" prefix, e.g. "anatomy").  Ids are
    "mmlu_redux/<subject>/<row index in file>".
    """
    report = report if report is not None else LoadReport("mmlu_redux")
    folder = _dataset_path(data_dir, "mmlu_redux", "mmlu_redux")
    files = sorted(folder.glob("mmlu_*.csv"))
    if not files:
        raise FileNotFoundError(f"no mmlu_*.csv files in {folder}")
    available = {f.stem.removeprefix("mmlu_"): f for f in files}
    if subjects is not None:
        wanted = [subjects] if isinstance(subjects, str) else list(subjects)
        unknown = sorted(set(wanted) - set(available))
        if unknown:
            raise ValueError(f"unknown MMLU-Redux subject(s) {unknown}; known: {sorted(available)}")
        available = {s: available[s] for s in sorted(set(wanted))}

    records = []
    for subject, path in available.items():
        for line_no, row_index, row in _read_mmlu_csv(path, report):
            error_type = _normalize_error_type(row.get("error_type", ""))
            if error_type != "ok" and not keep_errors:
                report.filtered += 1
                continue
            question = row.get("question", "")
            if not question.strip():
                report.add(path, line_no, "empty question")
                continue
            try:
                # The choices cell is a Python list literal; literal_eval only
                # accepts literals, so a hostile cell cannot run code.
                choices = ast.literal_eval(row.get("choices", ""))
            except (ValueError, SyntaxError) as exc:
                report.add(path, line_no, f"choices is not a Python list literal: {exc}")
                continue
            if not isinstance(choices, (list, tuple)) or not choices:
                report.add(path, line_no, f"choices is not a non-empty list: {row.get('choices')!r}")
                continue
            choices = [str(c) for c in choices]
            try:
                idx = int(row.get("answer", "").strip())
            except ValueError:
                idx = -1
            if not 0 <= idx < len(choices):
                report.add(path, line_no, f"answer {row.get('answer')!r} is not an index into {len(choices)} choices")
                continue
            meta: dict[str, Any] = {"subject": subject, "error_type": error_type}
            if row.get("correct_answer", "").strip():
                meta["correct_answer"] = row["correct_answer"].strip()
            records.append(
                Record(
                    id=f"mmlu_redux/{subject}/{row_index}",
                    question=question,
                    context=None,
                    answers=[choices[idx]],
                    choices=choices,
                    answer_index=idx,
                    source="mmlu_redux",
                    meta=meta,
                )
            )
    return records


def _instruction_record(obj: dict[str, Any], rid: str, source: str) -> Record:
    return Record(
        id=rid,
        question=obj["instruction"],
        context=_optional_text(obj.get("input")),
        answers=[],
        choices=None,
        answer_index=None,
        source=source,
        response=obj["output"],
    )


def _instruction_problem(obj: dict[str, Any]) -> str | None:
    if not _nonempty_str(obj.get("instruction")):
        return "missing or empty instruction"
    if not isinstance(obj.get("output"), str):
        return "missing output"
    if obj.get("input") is not None and not isinstance(obj.get("input"), str):
        return "input is not a string"
    return None


def load_dolly(*, data_dir: Path | None = None, report: LoadReport | None = None) -> list[Record]:
    """5,000 Dolly-15k records (instruction, input -> context, output -> response)."""
    report = report if report is not None else LoadReport("dolly")
    path = _dataset_path(data_dir, "dolly_5k", "dolly_5k.jsonl")
    records = []
    for line_no, obj in _iter_jsonl(path, report):
        if (why := _instruction_problem(obj)) is not None:
            report.add(path, line_no, why)
            continue
        records.append(_instruction_record(obj, f"dolly_{line_no - 1:05d}", "dolly"))
    return records


def load_instructions(*, data_dir: Path | None = None, report: LoadReport | None = None) -> list[Record]:
    """1,100 small Alpaca-style records from rasbt/LLMs-from-scratch chapter 7."""
    report = report if report is not None else LoadReport("instructions")
    path = _dataset_path(data_dir, "instruction_data_rasbt_1100", "instruction-data.json")
    records = []
    for item_no, obj in _iter_json_array(path, report):
        if (why := _instruction_problem(obj)) is not None:
            report.add(path, item_no, why)
            continue
        records.append(_instruction_record(obj, f"instructions_{item_no - 1:04d}", "instructions"))
    return records


#: Registered dataset name -> loader.  Every loader takes keyword-only
#: options plus ``data_dir`` and ``report``.
DATASETS: dict[str, Callable[..., list[Record]]] = {
    "countries": load_countries,
    "tipsheets": load_tipsheets,
    "hotpotqa": load_hotpotqa,
    "arc_challenge": load_arc_challenge,
    "openbookqa": load_openbookqa,
    "mmlu_redux": load_mmlu_redux,
    "dolly": load_dolly,
    "instructions": load_instructions,
}


# ---------------------------------------------------------------------------
# Generic user files
# ---------------------------------------------------------------------------


def _resolve_answer(answer: Any, choices: list[str]) -> tuple[int | None, str | None]:
    """Map an ``answer`` (index, letter or choice text) to an index, or explain why not."""
    n = len(choices)
    if isinstance(answer, bool):  # bool is an int subclass: True must not mean "B"
        return None, f"answer {answer!r} is a boolean, not an index, letter or choice text"
    if isinstance(answer, int):
        if 0 <= answer < n:
            return answer, None
        return None, f"answer index {answer} is out of range for {n} choices"
    if not isinstance(answer, str) or not answer.strip():
        return None, f"answer {answer!r} is not an index, letter or choice text"
    as_text = choices.index(answer) if answer in choices else None
    if as_text is None:
        stripped = [c.strip() for c in choices]
        as_text = stripped.index(answer.strip()) if answer.strip() in stripped else None
    as_letter = _letter_to_index(answer, n) if len(answer.strip()) == 1 else None
    if as_text is not None and as_letter is not None and as_text != as_letter:
        # e.g. choices ["B", "A"] and answer "A": text says index 1, letter says 0.
        return None, f"answer {answer!r} is ambiguous: it is choice {LETTERS[as_text]}'s text but also letter {answer.strip().upper()}"
    if as_text is not None:
        return as_text, None
    if as_letter is not None:
        return as_letter, None
    return None, f"answer {answer!r} is not among the choices (nor a letter A-{LETTERS[n - 1]} or an index)"


def _generic_record(obj: dict[str, Any], rid: str, source: str) -> tuple[Record | None, str | None]:
    """Build a Record from one object of a user file, or return the reason it is bad."""
    if "instruction" in obj and "question" not in obj:
        if (why := _instruction_problem(obj)) is not None:
            return None, why
        return _instruction_record(obj, rid, source), None

    question = obj.get("question")
    if not _nonempty_str(question):
        return None, "missing or empty question"
    context = obj.get("context")
    if context is not None and not isinstance(context, str):
        return None, "context is not a string"

    choices = obj.get("choices")
    if choices is not None:
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
            return None, "choices must be a non-empty list of strings"
        if len(choices) > len(LETTERS):
            return None, f"more than {len(LETTERS)} choices"
        # "answer_index" accepts what Record.to_dict() writes.
        answer = obj["answer"] if "answer" in obj else obj.get("answer_index")
        if answer is None:
            return None, "multiple-choice record without an answer"
        idx, why = _resolve_answer(answer, choices)
        if idx is None:
            return None, why
        return Record(rid, question, _optional_text(context), [choices[idx]], list(choices), idx, source), None

    answers = obj.get("answers")
    if answers is None and "answer" in obj:
        answers = [obj["answer"]]  # tolerate a single "answer" string
    if not isinstance(answers, list) or not answers:
        return None, "missing answers (need a non-empty 'answers' list, or 'choices' + 'answer')"
    if not all(_nonempty_str(a) for a in answers):
        return None, "answers must be non-empty strings"
    return Record(rid, question, _optional_text(context), list(answers), None, None, source), None


def _load_generic(path: Path, report: LoadReport) -> list[Record]:
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    if path.suffix.lower() == ".json":
        items = _iter_json_array(path, report)
    else:
        items = _iter_jsonl(path, report)
    source = path.stem
    records, seen = [], {}
    for line_no, obj in items:
        rid = str(obj["id"]) if obj.get("id") is not None else f"{source}:{line_no}"
        if rid in seen:
            report.add(path, line_no, f"duplicate id {rid!r} (first on line {seen[rid]})")
            continue
        record, why = _generic_record(obj, rid, source)
        if record is None:
            report.add(path, line_no, why or "bad record")
            continue
        seen[rid] = line_no
        records.append(record)
    return records


# ---------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------


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
        records = _load_generic(path, report)
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
