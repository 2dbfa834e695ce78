"""What an exercise shows: before the reveal, its question (never its answer); after it, what the
models did in the stored run, the right answer and the explanation. Both are plain dicts (JSON)."""

from __future__ import annotations

from urllib.parse import urlencode

from kvviz.app.exercises import Exercise, answer_of, preset_of, stored_results
from kvviz.app.page import spec
from kvviz.handoffs import registry


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
    if exercise.kind == "which":
        return list(exercise.choices)
    names = [exercise.column, registry.control_of(exercise.column), exercise.check.get("over")]
    return [name for name in dict.fromkeys(names) if name]


def reveal(exercise: Exercise) -> dict:
    """The stored run's answer to the exercise, what each column it is about said, the explanation."""
    results = stored_results(exercise) or []
    answer = answer_of(exercise, results) if results else None
    by_name = {result.get("handoff"): result for result in results}
    said = []
    for name in columns_of(exercise):
        result = by_name.get(name) or {}
        swap = result.get("swap") or {}
        said.append({"column": registry.label_of(name), "answer": (result.get("answer") or "").strip()[:160],
                     "swapped": (swap.get("answer") or "").strip()[:160] if swap else "",
                     "swap_outcome": swap.get("outcome") or ""})
    return {"key": exercise.key, "answer": shown_answer(exercise, answer), "value": answer, "said": said,
            "explain": exercise.explain, "lab_link": lab_link(exercise)}


def lab_link(exercise: Exercise) -> str:
    """The lab's page with the exercise's preset: its stored run paints there, every column and figure."""
    if not exercise.preset:
        return ""
    columns = list(dict.fromkeys([*spec.preset_columns(preset_of(exercise)), *columns_of(exercise)]))
    return "/?" + urlencode({"preset": exercise.preset, "h": ",".join(columns)})
