"""The workshop API's request bodies, typed: each field's type, its limit and kvviz's one text rule
(``kvviz.core.limits.clean_line``: a lone surrogate refused in one line, NUL and bidirectional
controls removed, whitespace read as single spaces), checked before a route runs. A body that does
not fit gets one line from ``guard`` and uses none of the client's allowance."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

from kvviz.core import limits
from kvviz.store.runs import MAX_LINK, MAX_TITLE, RESULTS_NOT_TEXT
from kvviz.store.values import MAX_CODE, MAX_NAME, MAX_VALUE

MAX_KEY = 64  # an exercise's key
MAX_RUN_ID = 200  # a saved run's id, or its /r/ link pasted whole


def line(field: str, limit: int):
    """A one-line text field: cleaned by the one rule before its type is checked (so that a lone
    surrogate gets kvviz's line, not a parser's)."""

    def clean(value: Any) -> Any:
        return limits.clean_line(value, field, limit) if isinstance(value, str) else value

    return Annotated[str, BeforeValidator(clean)]


def _results(value: Any) -> Any:
    if isinstance(value, dict) and limits.has_surrogate(json.dumps(value, ensure_ascii=False)):
        raise ValueError(RESULTS_NOT_TEXT)
    return value


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NewClass(Body):
    mode: Literal["paced", "self"] = "paced"


class HostChange(Body):
    """The host page's change: open an exercise, reveal one, set the pacing (or none: claim the class)."""

    open: line("The exercise", MAX_KEY) | None = None
    reveal: line("The exercise", MAX_KEY) | None = None
    mode: Literal["paced", "self"] | None = None
    take_over: bool = False


class Pin(Body):
    run: line("The run", MAX_RUN_ID)


class Join(Body):
    code: line("The class code", MAX_CODE)
    name: line("The name", MAX_NAME)


class Predict(Body):
    exercise: line("The exercise", MAX_KEY)
    value: line("A prediction", MAX_VALUE)


class SaveRun(Body):
    title: line("The title", MAX_TITLE) = ""
    link: line("The link", MAX_LINK) = ""
    results: Annotated[dict, BeforeValidator(_results)]
