"""Prompt text for each model, split into a context segment and a query segment.

Every prompt is built as two token segments: ``context_ids`` (template prefix plus the context, if
any) and ``query_ids`` (the question and the generation prompt). Skyline feeds their concatenation
in one forward; KVComm lets the sender prefill ``context_ids`` and the receiver continue with
``query_ids``. Because both use the very same segments, "KVComm with every layer equals Skyline"
is exact by construction, not by luck of tokenisation.

Models with a chat template (SmolLM2, Qwen) get it, and the question comes with "Answer briefly.";
base models (Gemma-3-270M) get a plain "Context: ...\n\nQuestion: ...\nAnswer:" layout with no
instruction line: the prompt's "Answer:" already asks for the answer.

The base layout was chosen by measurement (``research/prompt_layouts.py`` and a held-out check;
Gemma-3-270M, greedy, token F1 > 0.5). Skyline / receiver alone on the benchmark's 100 samples:
  Context: C\n\nQuestion: Q\nAnswer briefly.\nAnswer:   Countries 0.29 / 0.06, HotpotQA 0.22 / 0.03
  Context: C\n\nQuestion: Q\nAnswer:                     Countries 0.31 / 0.10  (this layout)
  Context: C\nQuestion: Q\nAnswer:                       Countries 0.31 / 0.10, HotpotQA 0.16 / 0.03
  C\nQuestion: Q\nAnswer: 0.26; C\nQ: Q\nA: 0.23; ...\nShort answer: 0.22 (Countries Skyline)
The instruction line decided it: with it, a base receiver that sees the context only in part
(KVComm) mostly ends its answer line at once and writes "Answer:" again. On the 98 Countries
samples the benchmark does not use (KVComm calibrated on the first of them), Skyline scores 35
with or without the line, KVComm r=0.3 10 with it (77 empty answers) and 17 without (33), r=0.5
22 (53) and 31 (4); McNemar p = 0.07 and 0.004. Without it HotpotQA answers run longer (Skyline
0.16 against 0.22). Skyline's Countries errors are wrong countries, not formats: the model does
not know where the landmark is.
"""

from __future__ import annotations

import weakref

from dataclasses import dataclass

# A string that never appears in user text; used to find where the query starts in a rendered
# chat template.
_SPLIT_MARKER = "\u2063kvviz-query\u2063"
# Stands for the context's words while a prompt is split around them (``split_at_context``).
_CONTEXT_SLOT = "kvviz-context-slot"

ANSWER_INSTRUCTION = "Answer briefly."


@dataclass(frozen=True)
class PromptSegments:
    context_ids: list[int]
    query_ids: list[int]
    context_text: str
    query_text: str

    @property
    def input_ids(self) -> list[int]:
        return self.context_ids + self.query_ids

    @property
    def text(self) -> str:
        return self.context_text + self.query_text


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def answer_instruction(tokenizer) -> str:
    """What a model is told to do with a question when nothing else is asked: chat models "Answer
    briefly."; base models nothing (their prompt ends in "Answer:"; see the module docstring)."""
    return ANSWER_INSTRUCTION if has_chat_template(tokenizer) else ""


def user_message(query: str, context: str | None = None, instruction: str = ANSWER_INSTRUCTION) -> tuple[str, str]:
    """The user's words, split into (context part, query part)."""
    context_part = f"Context: {context.strip()}\n\n" if context and context.strip() else ""
    query_part = f"Question: {query.strip()}\n{instruction}".rstrip()
    return context_part, query_part


def build_segments(
    tokenizer,
    query: str,
    context: str | None = None,
    instruction: str | None = None,
    history: list[dict] | None = None,
) -> PromptSegments:
    """Segments for one model. ``instruction``: what the model is asked to do with the question
    (None: ``answer_instruction``). ``history`` adds earlier chat turns (used by the text handoff)."""
    head, tail = render(tokenizer, query, context, instruction, history)
    return PromptSegments(
        context_ids=encode(tokenizer, head),
        query_ids=encode(tokenizer, tail),
        context_text=unmark(head),
        query_text=unmark(tail),
    )


def render(
    tokenizer,
    query: str,
    context: str | None = None,
    instruction: str | None = None,
    history: list[dict] | None = None,
) -> tuple[str, str]:
    """The prompt's text as (head, tail): the context segment and the query segment, with the
    user's words marked (``users_words``) so that ``encode`` reads them as plain text.
    ``instruction`` None: ``answer_instruction`` (chat models are asked to answer briefly)."""
    instruction = answer_instruction(tokenizer) if instruction is None else instruction
    context = users_words(context) if context and context.strip() else None
    history = [dict(turn, content=users_words(turn["content"])) for turn in history or []]
    context_part, query_part = user_message(users_words(query), context, instruction)
    if has_chat_template(tokenizer):
        messages = history + [{"role": "user", "content": context_part + _SPLIT_MARKER + query_part}]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        head, tail = rendered.split(_SPLIT_MARKER)
    else:
        earlier = "".join(f"{turn['role'].capitalize()}: {turn['content'].strip()}\n\n" for turn in history)
        bos = tokenizer.bos_token or ""
        head = bos + earlier + context_part
        tail = query_part + "\nAnswer:"
    return head, tail


def split_at_context(tokenizer, query: str, instruction: str | None = None) -> tuple[str, str]:
    """The prompt ``render`` gives for ``query`` with a context, as (text before the context's
    words, text after them): what goes between the two is read where a context is read (CIPHER
    puts its message vectors there, where the text handoff puts the message). Both halves keep
    their marks for ``encode``; ``before + users_words(words) + after`` renders as that context."""
    head, tail = render(tokenizer, query, _CONTEXT_SLOT, instruction)
    # the slot as render marks it: users_words strips U+2063, so split on the marked form (the
    # first one: the context comes before the query in every layout)
    before, slot, after = (head + tail).partition(users_words(_CONTEXT_SLOT))
    if not slot:
        raise RuntimeError("the rendered prompt lost its context slot: update kvviz.core.prompts.split_at_context")
    return before, after


# --- the user's words are text --------------------------------------------------------------------
# A user may type "<|im_start|>" or "<bos>": the model must read those characters, never the control
# token. ``render`` wraps the user's words in two invisible marks (U+2063 never reaches a prompt
# from user text: kvviz.core.limits removes it); ``encode`` reads the marked stretches as plain text.
_USER_START, _USER_END = "\u2063kvviz-user\u2063", "\u2063kvviz-user-end\u2063"


def users_words(text: str) -> str:
    """Mark text as the user's words (whitespace at its ends stays outside the marks)."""
    stripped = text.strip().replace("\u2063", "")
    if not stripped:
        return text
    left = text[: len(text) - len(text.lstrip())]
    right = text[len(text.rstrip()) :]
    return left + _USER_START + stripped + _USER_END + right


def unmark(text: str) -> str:
    """The text without the user marks: what the model reads."""
    return text.replace(_USER_START, "").replace(_USER_END, "")


def _user_spans(marked: str) -> tuple[str, list[tuple[int, int]]]:
    """(the text without marks, the [start, end) character spans of the user's words in it)."""
    first, *pieces = marked.split(_USER_START)
    text, spans = first.replace(_USER_END, ""), []  # a piece cut out of a prompt may hold half a pair
    for piece in pieces:
        words, _, rest = piece.partition(_USER_END)
        spans.append((len(text), len(text) + len(words)))
        text += words + rest.replace(_USER_END, "")
    return text, spans


def encode(tokenizer, text: str) -> list[int]:
    """Token ids for prompt text that holds the special tokens it needs (a template's
    ``<|im_start|>``, a ``<bos>``); the user's words in it (marked by ``render``) are plain text."""
    return encode_with_offsets(tokenizer, text)[0]


def encode_with_offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """``encode``, with each token's (begin, end) characters in the text without the marks.

    The text is encoded as usual; only when a special token lies inside the user's words is it
    read again: the template's own special tokens stay, and each stretch between them is encoded
    with special-token splitting on (the usual ids for every stretch without such a string).
    """
    text, users = _user_spans(text)
    if not text:
        return [], []
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), [tuple(span) for span in encoded["offset_mapping"]]
    special = _special_ids(tokenizer) if users else set()

    def typed(begin: int, end: int) -> bool:
        return any(start <= begin and end <= stop for start, stop in users)

    if not any(token in special and typed(*span) for token, span in zip(ids, offsets)):
        return ids, offsets
    out_ids, out_offsets, cursor = [], [], 0

    def as_text(end: int):
        if end > cursor:
            piece = tokenizer(text[cursor:end], add_special_tokens=False, split_special_tokens=True,
                              return_offsets_mapping=True)
            out_ids.extend(piece["input_ids"])
            out_offsets.extend((cursor + b, cursor + e) for b, e in piece["offset_mapping"])

    for token, (begin, end) in zip(ids, offsets):
        if token in special and not typed(begin, end):
            as_text(begin)
            out_ids.append(token)
            out_offsets.append((begin, end))
            cursor = end
    as_text(len(text))
    return out_ids, out_offsets


# tokenizer -> (its length, its special ids): Gemma's tokenizer builds a dict of its ~6,000 added tokens
# each time ``added_tokens_decoder`` is read, about 1% of a short run's CPU when read for every prompt
_special_ids_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _special_ids(tokenizer) -> set[int]:
    """Ids of the tokenizer's special tokens (the named ones and every added token marked special),
    read again only when tokens were added to it since."""
    size, ids = _special_ids_of.get(tokenizer, (None, None))
    if ids is None or size != len(tokenizer):
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        ids = frozenset(tokenizer.all_special_ids) | {token_id for token_id, token in added.items()
                                                      if getattr(token, "special", False)}
        _special_ids_of[tokenizer] = (len(tokenizer), ids)
    return ids


def stop_token_ids(tokenizer) -> set[int]:
    """Tokens that end an answer: EOS and chat end-of-turn tokens."""
    ids = set()
    for token in (tokenizer.eos_token, "<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>"):
        if token is None:
            continue
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
