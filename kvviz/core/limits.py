"""Input limits: what a request may hold. One module, so the CLI, the page and the API agree.

``HandoffRequest`` and ``GenerationSettings`` check themselves with it when they are built, the
registry's ``Option.parse`` words its range errors with it, the page's sliders take their bounds
from it, and the engine checks the prompt's length in tokens with it once the pair is loaded.
Every refusal is a ``ValueError`` whose message says what is allowed; nothing the user typed is
changed except as listed here.

Text: one rule for every text a person sends (the query and context here; in the workshop a
learner's name and answer, a class code, a saved run's title and link):
* line breaks and tabs are kept (``\\r\\n`` and ``\\r`` become ``\\n``); every other control
  character (NUL, ESC, form feed, the C1 range) is **removed**: they are invisible, come from
  pasted documents and terminals, and mean nothing to a model;
* the bidirectional controls (the embeddings and overrides U+202A-U+202E, the isolates
  U+2066-U+2069, the marks U+200E, U+200F and U+061C) are **removed**: they reorder what a reader
  sees without being seen themselves ("exe.txt" shown for "txt.exe");
* a lone UTF-16 surrogate (only a broken client can send one: it is not a character) is
  **refused** in one line, with its position;
* the invisible separator U+2063 is removed too (kvviz marks the user's words in a prompt with it);
* right-to-left text, emoji, combining marks and every other character are kept as typed;
* a one-line field (``clean_line``: names, answers, codes, titles, links) also has its runs of
  whitespace, line breaks included, read as one space;
* strings that look like a model's special tokens (``<bos>``, ``<|im_start|>``) are kept and read
  as plain text, never as control tokens (``kvviz.core.prompts.encode``);
* a query that is empty after this (only whitespace or control characters) is refused;
* at most ``MAX_QUERY_CHARS`` / ``MAX_CONTEXT_CHARS`` characters.

Length in tokens: the longest prompt the pair will read (template, context and question) must fit
the pair's budget: the smaller of the policy cap (``kvviz.core.policy``) and each model's context
window less the tokens it will generate (the answer, and the longest message a handoff may write
first: the engine asks the registry, ``kvviz.engine.runner.check_fits``). A longer prompt is **refused** with its length and the
limit, not truncated: cutting a context silently changes the question.

Settings: the ranges in ``SETTINGS`` (generation) and each handoff option's own bounds.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from kvviz.core import policy
from kvviz.core.prompts import build_segments

MAX_QUERY_CHARS = 4000
MAX_CONTEXT_CHARS = 16000

_SURROGATE = re.compile("[\ud800-\udfff]")
# control characters (Unicode category Cc) except tab and line feed, and U+2063 (kvviz.core.prompts
# marks where the user's words sit in a prompt with it)
# and the bidirectional controls
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROLS = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2063{BIDI_CONTROLS}]")


@dataclass(frozen=True)
class Setting:
    """A numeric setting's allowed range (inclusive) and what it is called in messages."""

    label: str
    minimum: float
    maximum: float
    integer: bool = False

    def check(self, value) -> None:
        check_range(self.label, value, self.minimum, self.maximum, self.integer)


def show(value) -> str:
    """A number as people write it: 4294967295, 0.5, inf."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(int(value)) if float(value).is_integer() else f"{value:g}"
    return repr(value)


def range_message(label: str, minimum: float, maximum: float, value) -> str:
    """The one wording of an out-of-range value, everywhere."""
    return f"{label} must be between {show(minimum)} and {show(maximum)}, got {show(value)}."


def check_range(label: str, value, minimum: float, maximum: float, integer: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not float(value).is_integer()):
        kind = "an integer" if integer else "a number"
        raise ValueError(f"{label} must be {kind} between {show(minimum)} and {show(maximum)}, got {value!r}.")
    if value != value or not minimum <= value <= maximum:  # value != value: NaN
        raise ValueError(range_message(label, minimum, maximum, value))


def parse_number(label: str, value, integer: bool = False) -> int | float:
    """A number from a form, a flag or JSON ("3", 3.0, 3); a ValueError names the setting."""
    try:
        if isinstance(value, bool):
            raise TypeError(value)
        number = float(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{label}: {value!r} is not {'an integer' if integer else 'a number'}.") from error
    if integer:
        if not number.is_integer():
            raise ValueError(f"{label}: {value!r} is not an integer.")
        return int(number)
    return number


def settings() -> dict[str, Setting]:
    """Generation settings shared by every handoff (bounds follow the policy's caps)."""
    caps = policy.caps()
    return {
        "max_new_tokens": Setting("Max new tokens", 1, caps.max_new_tokens, integer=True),
        "message_tokens": Setting("Message length bound (tokens)", 1, caps.max_message_tokens, integer=True),
        "temperature": Setting("Temperature", 0.05, 2.0),
        "top_p": Setting("top-p", 0.01, 1.0),
        "seed": Setting("Seed", 0, 2**32 - 1, integer=True),
    }


def check_setting(name: str, value) -> None:
    settings()[name].check(value)


# --- text ---------------------------------------------------------------------------------------


def clean_text(text: str | None, field: str, limit: int) -> str:
    """The user's text as a model will read it (see the module docstring); a ValueError says why
    it cannot be read. ``field`` names it in messages ("The query")."""
    text = _readable(text, field).strip()
    return _within(text, field, limit)


def clean_line(text: str | None, field: str, limit: int) -> str:
    """A one-line field (a name, an answer, a code, a title, a link) by the same rule, its whitespace
    read as single spaces; a ValueError says why it cannot be kept, in one line."""
    return _within(" ".join(_readable(text, field).split()), field, limit)


def _readable(text: str | None, field: str) -> str:
    if text is None:
        return ""
    if not isinstance(text, str):
        raise ValueError(f"{field} must be text, got {type(text).__name__}.")
    bad = _SURROGATE.search(text)
    if bad:
        raise ValueError(
            f"{field} holds an invalid character at position {bad.start() + 1} (a lone UTF-16 surrogate, "
            f"U+{ord(bad.group()):04X}); it is not text. Paste the text again from its source."
        )
    return _CONTROLS.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))


def _within(text: str, field: str, limit: int) -> str:
    if len(text) > limit:
        raise ValueError(f"{field} is {len(text)} characters; the limit is {limit}.")
    return text


def has_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone UTF-16 surrogate (no encoder can write it)."""
    return _SURROGATE.search(text) is not None


def clean_query(query: str | None) -> str:
    query = clean_text(query, "The query", MAX_QUERY_CHARS)
    if not is_visible(query):
        raise ValueError("The query is empty: type a question.")
    return query


def clean_context(context: str | None) -> str | None:
    return clean_text(context, "The context", MAX_CONTEXT_CHARS) or None


def is_visible(text: str) -> bool:
    """Whether text holds anything but whitespace and invisible format characters."""
    return any(not ch.isspace() and unicodedata.category(ch) not in ("Cf", "Cc") for ch in text)


# --- length in tokens ---------------------------------------------------------------------------


def context_window(model) -> int | None:
    """How many positions a loaded model was trained for (None when its config does not say)."""
    config = model.model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(config, "max_position_embeddings", None)


def check_prompt_tokens(pair, request, message_tokens: int = 0) -> None:
    """Refuse a request whose longest prompt does not fit the pair's token budget (the message
    gives the length, the limit and by how much to shorten). ``message_tokens``: the most tokens a
    handoff may generate before the answer."""
    generated = request.generation.max_new_tokens + message_tokens
    cap = policy.caps().max_prompt_tokens
    models = {model.name: model for model in (pair.sharer, pair.receiver, pair.same_shape_sender)}
    for model in models.values():
        length = len(build_segments(model.tokenizer, request.query, request.context).input_ids)
        window = context_window(model)
        budget = cap if window is None else min(cap, window - generated)
        if length > budget:
            why = (
                f"the server's limit is {cap} prompt tokens"
                if budget == cap
                else f"{model.name} reads {window} positions, less {generated} for the answer and message"
            )
            part = "context and question" if request.context else "question"
            raise ValueError(
                f"The prompt ({part}) is {length} tokens for {model.name}; this pair takes at most {budget} "
                f"({why}). Shorten it by about {length - budget} tokens."
            )
