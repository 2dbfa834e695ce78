"""Workshop exercises: a prediction asked before a run is shown, checked against that run.

The exercises are data: ``assets/exercises.toml`` (its header explains every field), read and
validated here; every field that is wrong gets one line that names the exercise and the field
(``ExerciseError`` holds them all). An exercise points at a preset (and optionally one of its
stored ``runs``), or at a question of its own (``query``, ``answers``, ``context``, ``columns``),
which only a live run can reveal.

How an exercise is checked (``check``): one question of the vocabulary the presets and the
walk-through use too (``kvviz.app.reading.questions``): ``verdict``, ``evidence``, ``follow``,
``beats``, ``layers``, ``sent``, ``says``, ``writes``, ``seconds`` or ``bytes`` (of a column; a ratio
``over`` another), ``gain``, or ``which`` (the one column among ``choices`` whose verdict, swap
outcome or evidence is the given one). The run is read once (``kvviz.app.reading.read``) and
answers it; what else the explanation says (``claims``) is checked the same way.

``expected`` is the answer the exercise's explanation is written for: ``answer_of`` reads the
answer from the run, and tests/unit/test_exercises.py checks that every shipped exercise's
``expected`` is what the stored run gives, so an exercise whose answer the models no longer give
fails the tests. ``grade`` says whether a learner's prediction matches the run's answer. No torch.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from kvviz.app.presets import PRESETS_BY_KEY, Preset, claims_of, load_precomputed
from kvviz.app.reading import catalog
from kvviz.app.reading.questions import CHOICES, KINDS, NUMBERS, Question, parse_question
from kvviz.app.reading.questions import agrees as answer_agrees
from kvviz.app.reading.reading import Reading, read
from kvviz.core.paths import ASSETS
from kvviz.data.metrics import contains_answer

EXERCISES_PATH = ASSETS / "exercises.toml"
PREDICTS = ("choice", "number", "words")
CHECK_KINDS = KINDS  # one question of the vocabulary
NUMERIC_CHECKS = NUMBERS
FIELDS = ("key", "title", "topic", "minutes", "preset", "run", "query", "context", "answers", "columns", "ask",
          "predict", "choices", "check", "expected", "tolerance", "claims", "explain")
# what each choice means on the page, for the checks whose answers are words of the lab
CHOICE_LABELS = {
    "right": "Right: it gives the answer", "wrong": "Wrong: it gives another answer", "none": "No answer",
    "na": "Does not apply", "followed": "Follows the swapped fact", "kept": "Keeps the old fact",
    "neither": "Neither: another answer",
}


class ExerciseError(ValueError):
    """Every problem found in an exercises file, one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class Exercise:
    key: str
    title: str
    ask: str  # the question put to the learner before the reveal
    predict: str  # "choice" | "number" | "words"
    check: dict  # one CHECK_KINDS key (and ``over`` for a ratio)
    expected: str | float  # the answer the explanation is written for (the stored run must give it)
    explain: str  # shown after the reveal
    topic: str = ""
    minutes: float = 5.0
    preset: str | None = None
    run: str | None = None  # one of the preset's stored runs, by label; None: the page's own run
    query: str | None = None
    context: str | None = None
    answers: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    tolerance: float = 0.0
    claims: dict = field(default_factory=dict)  # what else the explanation says: a table of claims, as a preset's check

    @property
    def kind(self) -> str:
        return next(name for name in CHECK_KINDS if name in self.check)

    @property
    def question(self) -> Question:
        """What the run is asked (its ``check``, a question of the one vocabulary)."""
        return parse_question(self.check, self.key, self.choices)[0]

    @property
    def column(self) -> str | None:
        return None if self.kind in ("which", "crossed") else self.check[self.kind]

    @property
    def gold(self) -> tuple[str, ...]:
        """The question's gold answers: the preset's, or the exercise's own."""
        return PRESETS_BY_KEY[self.preset].answers if self.preset else self.answers

    def choice_label(self, choice: str) -> str:
        if self.kind == "which":
            return catalog.label_of(choice)
        return CHOICE_LABELS.get(choice, choice)


def _problems(index: int, raw: dict) -> list[str]:
    """What is wrong with one ``[[exercise]]`` table, one line per field."""
    where = f"exercise {raw.get('key') or f'#{index + 1}'}"
    out = [f"{where}: unknown field {name!r} (known: {', '.join(FIELDS)})" for name in sorted(set(raw) - set(FIELDS))]
    for name in ("key", "title", "ask", "explain"):
        if not isinstance(raw.get(name), str) or not raw[name].strip():
            out.append(f"{where}: {name} must be a non-empty string")
    if raw.get("preset") is not None:
        if raw["preset"] not in PRESETS_BY_KEY:
            out.append(f"{where}: preset {raw['preset']!r} is not in assets/presets.toml")
        elif raw.get("run") is not None and raw["run"] not in {run.label for run in PRESETS_BY_KEY[raw["preset"]].runs}:
            out.append(f"{where}: run {raw['run']!r} is not one of preset {raw['preset']}'s runs")
        out += [f"{where}: {name} comes from the preset; leave it out" for name in ("query", "context", "answers", "columns")
                if name in raw]
    else:
        if "run" in raw:
            out.append(f"{where}: run names a preset's stored run; this exercise has no preset")
        if not isinstance(raw.get("query"), str) or not raw["query"].strip():
            out.append(f"{where}: query must be given when there is no preset")
        if not raw.get("answers") or not all(isinstance(a, str) and a for a in raw.get("answers", [])):
            out.append(f"{where}: answers must be a list of gold answers when there is no preset")
        unknown = [c for c in raw.get("columns", []) if c not in catalog.METHODS]
        if not raw.get("columns") or unknown:
            out.append(f"{where}: columns must name columns of the page ({', '.join(catalog.names())})")
    if raw.get("predict") not in PREDICTS:
        out.append(f"{where}: predict must be one of {', '.join(PREDICTS)}")
    out += _check_problems(where, raw)
    try:
        claims_of(raw.get("claims", {}), where)
    except ValueError as error:
        out += str(error).splitlines()
    minutes = raw.get("minutes", 5)
    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or minutes <= 0:
        out.append(f"{where}: minutes must be a positive number")
    return out


def _check_problems(where: str, raw: dict) -> list[str]:
    """The ``check``, ``choices``, ``expected`` and ``tolerance`` fields, against each other."""
    predict, choices, expected = raw.get("predict"), raw.get("choices", []), raw.get("expected")
    question, out = parse_question(raw.get("check"), where, tuple(choices) if isinstance(choices, list) else ())
    if question is None:
        return out
    allowed = tuple(catalog.names()) if question.kind == "which" else CHOICES.get(question.kind)
    if predict == "choice":
        if allowed is None:
            out.append(f"{where}: a {question.kind} check asks for a number or words, not a choice")
        elif len(choices) < 2 or any(choice not in allowed for choice in choices):
            out.append(f"{where}: choices must be two or more of {', '.join(allowed)}")
        elif expected not in choices:
            out.append(f"{where}: expected must be one of the choices")
    elif predict == "number":
        if question.kind not in NUMERIC_CHECKS:
            out.append(f"{where}: predict = \"number\" needs a {', '.join(NUMERIC_CHECKS)} check")
        if isinstance(expected, bool) or not isinstance(expected, (int, float)):
            out.append(f"{where}: expected must be a number")
        tolerance = raw.get("tolerance", 0)
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or tolerance < 0:
            out.append(f"{where}: tolerance must be a number, 0 or more")
    elif predict == "words":
        if question.kind != "says":
            out.append(f"{where}: predict = \"words\" needs a says check")
        if not isinstance(expected, str) or not expected.strip():
            out.append(f"{where}: expected must be the words the column says")
    if predict != "choice" and choices:
        out.append(f"{where}: choices go with predict = \"choice\" only")
    if predict != "number" and "tolerance" in raw:
        out.append(f"{where}: tolerance goes with predict = \"number\" only")
    return out


def parse_exercises(raws: list[dict]) -> list[Exercise]:
    """The ``[[exercise]]`` tables as Exercises; an ExerciseError lists every bad field of every one."""
    problems = [line for index, raw in enumerate(raws) for line in _problems(index, raw)]
    keys = [raw.get("key") for raw in raws]
    problems += [f"exercise {key}: the key is used twice" for key in sorted({k for k in keys if keys.count(k) > 1})]
    if problems:
        raise ExerciseError(problems)
    return [Exercise(**{**raw, "answers": tuple(raw.get("answers", ())), "columns": tuple(raw.get("columns", ())),
                        "choices": tuple(raw.get("choices", ()))}) for raw in raws]


def load_exercises(path: Path = EXERCISES_PATH) -> list[Exercise]:
    with open(path, "rb") as handle:
        data = tomllib.load(handle)
    if not isinstance(data.get("exercise"), list):
        raise ExerciseError([f"{path.name}: no [[exercise]] tables"])
    return parse_exercises(data["exercise"])


# --- the run an exercise is checked against ------------------------------------------------------


@functools.cache
def _precomputed() -> dict:
    """The presets' stored runs, read once (8 MB of JSON)."""
    return load_precomputed()


def stored_results(exercise: Exercise, precomputed: dict | None = None) -> list[dict] | None:
    """The stored run an exercise reveals (its preset's page run, or the named one of its runs), or
    None when there is none (an exercise of its own question, or a preset not precomputed)."""
    if exercise.preset is None:
        return None
    entry = ((precomputed if precomputed is not None else _precomputed()).get("presets") or {}).get(exercise.preset)
    if not entry:
        return None
    if exercise.run is not None:
        entry = (entry.get("runs") or {}).get(exercise.run)
    return None if entry is None else entry.get("results")


def reading_of(exercise: Exercise, results: list[dict]) -> Reading:
    """The run an exercise is checked against (one run's results, by handoff), read once by its gold."""
    return read({"results": results}, exercise.gold)


def answer_of(exercise: Exercise, results: list[dict] | Reading) -> str | float | None:
    """The exercise's answer in these results (one run's, or its reading); None where they cannot say."""
    reading = results if isinstance(results, Reading) else reading_of(exercise, results)
    return reading.answer(exercise.question)


def agrees(exercise: Exercise, prediction: str | float, answer: str | float | None) -> bool:
    """Whether a prediction matches the run's answer (for a number: within the tolerance; for words:
    the learner's words name what the column's answer says, as the exercise expects)."""
    if exercise.predict == "words":
        return answer_agrees(exercise.question, exercise.expected, answer) and contains_answer(
            str(prediction), [str(exercise.expected)])
    return answer_agrees(exercise.question, prediction, answer, exercise.tolerance)


def grade(exercise: Exercise, prediction: str | float, results: list[dict] | None = None) -> bool:
    """Whether a learner's prediction is right about the run (the stored one when none is given)."""
    results = stored_results(exercise) if results is None else results
    return agrees(exercise, prediction, None if results is None else answer_of(exercise, results))


def untrue_claims(exercise: Exercise, results: list[dict] | Reading) -> list[str]:
    """The claims of the exercise's explanation (``claims``) that these results do not show."""
    reading = results if isinstance(results, Reading) else reading_of(exercise, results)
    where = f"exercise {exercise.key}"
    return reading.failures(claims_of(exercise.claims, where), where)


def check_prediction(exercise: Exercise, prediction: str) -> str | None:
    """None for a prediction this exercise can take, else one line that says what is wrong."""
    text = (prediction or "").strip()
    if not text:
        return "Give a prediction first."
    if exercise.predict == "choice" and text not in exercise.choices:
        return f"Choose one of: {', '.join(exercise.choice_label(c) for c in exercise.choices)}."
    if exercise.predict == "number":
        try:
            float(text)
        except ValueError:
            return "Give a number (digits, a dot for decimals)."
    if len(text) > 80:
        return "Keep the prediction under 80 characters."
    return None


@dataclass(frozen=True)
class Sequence:
    """The shipped exercises in workshop order, with their total time."""

    exercises: list[Exercise] = field(default_factory=list)

    @property
    def minutes(self) -> float:
        return sum(exercise.minutes for exercise in self.exercises)

    def get(self, key: str) -> Exercise:
        for exercise in self.exercises:
            if exercise.key == key:
                return exercise
        raise KeyError(f"Unknown exercise {key!r}")


def preset_of(exercise: Exercise) -> Preset | None:
    return PRESETS_BY_KEY.get(exercise.preset) if exercise.preset else None


EXERCISES = Sequence(load_exercises())
