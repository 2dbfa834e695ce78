"""Prompt text for each model, split into a context segment and a query segment.

Every prompt is built as two token segments: ``context_ids`` (template prefix plus the context, if
any) and ``query_ids`` (the question and the generation prompt). Skyline feeds their concatenation
in one forward; KVComm lets the sender prefill ``context_ids`` and the receiver continue with
``query_ids``. Because both use the very same segments, "KVComm with every layer equals Skyline"
is exact by construction, not by luck of tokenisation.

Models with a chat template (SmolLM2, Qwen) get it; base models (Gemma-3-270M) get a plain
"Context: ...\n\nQuestion: ...\nAnswer briefly.\nAnswer:" layout that base models complete well.

The base layout was chosen by measurement (``scripts/prompt_layouts.py``; Gemma-3-270M, greedy,
token F1 > 0.5, the benchmark's 100 samples, Skyline / receiver alone): this layout scores
Countries 0.29 / 0.06 and HotpotQA 0.22 / 0.03; without "Answer briefly." Countries 0.31 / 0.10
(0.31 with or without the blank line) but HotpotQA 0.16 / 0.03, its answers running long; the
context without a "Context:" label 0.26, "Q: / A:" 0.23, "Short answer:" 0.22 on Countries.
Skyline's Countries errors are wrong countries, not wrong formats: the model does not know where
the landmark is (on the file's first 100 samples the same layouts score 0.36-0.38).
"""

from __future__ import annotations

from dataclasses import dataclass

# A string that never appears in user text; used to find where the query starts in a rendered
# chat template.
_SPLIT_MARKER = "\u2063kvviz-query\u2063"

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


def user_message(query: str, context: str | None = None, instruction: str = ANSWER_INSTRUCTION) -> tuple[str, str]:
    """The user's words, split into (context part, query part)."""
    context_part = f"Context: {context.strip()}\n\n" if context and context.strip() else ""
    query_part = f"Question: {query.strip()}\n{instruction}".rstrip()
    return context_part, query_part


def build_segments(
    tokenizer,
    query: str,
    context: str | None = None,
    instruction: str = ANSWER_INSTRUCTION,
    history: list[dict] | None = None,
) -> PromptSegments:
    """Segments for one model. ``history`` adds earlier chat turns (used by the text handoff)."""
    context_part, query_part = user_message(query, context, instruction)
    if has_chat_template(tokenizer):
        messages = list(history or []) + [{"role": "user", "content": context_part + _SPLIT_MARKER + query_part}]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        head, tail = rendered.split(_SPLIT_MARKER)
    else:
        earlier = "".join(f"{turn['role'].capitalize()}: {turn['content'].strip()}\n\n" for turn in history or [])
        bos = tokenizer.bos_token or ""
        head = bos + earlier + context_part
        tail = query_part + "\nAnswer:"
    return PromptSegments(
        context_ids=encode(tokenizer, head),
        query_ids=encode(tokenizer, tail),
        context_text=head,
        query_text=tail,
    )


def encode(tokenizer, text: str) -> list[int]:
    """Token ids for text that already holds any special tokens it needs."""
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


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
