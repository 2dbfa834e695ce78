"""A user's own JSONL (or JSON array) file: open questions, multiple choice or instructions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvviz.data.choices import LETTERS
from kvviz.data.files import iter_json_array, iter_jsonl, nonempty_str, optional_text
from kvviz.data.instructions import instruction_problem, instruction_record
from kvviz.data.record import LoadReport, Record, letter_to_index


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
    as_letter = letter_to_index(answer, n) if len(answer.strip()) == 1 else None
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
        if (why := instruction_problem(obj)) is not None:
            return None, why
        return instruction_record(obj, rid, source), None

    question = obj.get("question")
    if not nonempty_str(question):
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
        return Record(rid, question, optional_text(context), [choices[idx]], list(choices), idx, source), None

    answers = obj.get("answers")
    if answers is None and "answer" in obj:
        answers = [obj["answer"]]  # tolerate a single "answer" string
    if not isinstance(answers, list) or not answers:
        return None, "missing answers (need a non-empty 'answers' list, or 'choices' + 'answer')"
    if not all(nonempty_str(a) for a in answers):
        return None, "answers must be non-empty strings"
    return Record(rid, question, optional_text(context), list(answers), None, None, source), None


def load_user_file(path: Path, report: LoadReport) -> list[Record]:
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    if path.suffix.lower() == ".json":
        items = iter_json_array(path, report)
    else:
        items = iter_jsonl(path, report)
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
