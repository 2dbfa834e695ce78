"""What an exercise shows: before the reveal, its question (never its answer); after it, what the
models did in the stored run (read once, ``kvviz.app.reading``: each column's answer, its answer on
the swapped note and what that outcome and its evidence mean, in the page's words), the right answer
and the explanation. Both are plain dicts (JSON). No torch: the workshop's server imports this."""

from __future__ import annotations

from urllib.parse import urlencode

from kvviz.app.exercises import Exercise, answer_of, preset_of, reading_of, stored_results
from kvviz.app.reading import catalog


def card(exercise: Exercise, index: int) -> dict:
    """The exercise as a learner sees it before the reveal."""
    preset = preset_of(exercise)
    return {"key": exercise.key, "index": index, "title": exercise.title, "topic": exercise.topic, "ask": exercise.ask,
            "predict": exercise.predict, "minutes": exercise.minutes,
            "choices": [{"value": c, "label": exercise.choice_label(c)} for c in exercise.choices],
            "query": preset.query if preset else exercise.query,
            "note": (preset.context if preset else exercise.context) or "",
            "run": exercise.run or ""}


def shown_answer(exercise: Exercise, answer) -> str:
    if answer is None:
        return "the stored run does not say"
    if exercise.predict == "choice":
        return exercise.choice_label(str(answer))
    if exercise.predict == "words":
        return str(exercise.expected)
    value = float(answer)
    return f"{value:.0f}" if value.is_integer() or value >= 100 else f"{value:.1f}"


def columns_of(exercise: Exercise) -> list[str]:
    """The columns the exercise is about: its question's (a column's control among them)."""
    names = exercise.question.columns() + ([catalog.control_of(exercise.column)] if exercise.column else [])
    return [name for name in dict.fromkeys(names) if name]


def reveal(exercise: Exercise) -> dict:
    """The stored run's answer to the exercise, what each column it is about said, the explanation."""
    results = stored_results(exercise) or []
    reading = reading_of(exercise, results)
    said = []
    for name in columns_of(exercise):
        column = reading.column(name)
        said.append({"column": column.label, "answer": column.answer.strip()[:160],
                     "swapped": column.swap.answer.strip()[:160] if column.swap.changed else "",
                     "swap_outcome": "" if column.swap.outcome == "none" else column.swap.outcome,
                     "evidence": column.evidence_sentence()})
    answer = answer_of(exercise, reading) if results else None
    return {"key": exercise.key, "answer": shown_answer(exercise, answer), "value": answer, "said": said,
            "explain": exercise.explain, "lab_link": lab_link(exercise)}


def lab_link(exercise: Exercise) -> str:
    """The lab's page with the exercise's preset: its stored run paints there, every column and figure."""
    preset = preset_of(exercise)
    if preset is None:
        return ""
    columns = list(dict.fromkeys([*preset.columns, *columns_of(exercise)]))
    return "/?" + urlencode({"preset": exercise.preset, "h": ",".join(columns)})
