"""Prompt text for each model, split into a context segment and a query segment.

Every prompt is built as two token segments: ``context_ids`` (template prefix plus the context, if
any) and ``query_ids`` (the question and the generation prompt). Skyline feeds their concatenation
in one forward; KVComm lets the sender prefill ``context_ids`` and the receiver continue with
``query_ids``. Because both use the very same segments, "KVComm with every layer equals Skyline"
is exact by construction, not by luck of tokenisation.

Models with a chat template (SmolLM2, Qwen) get it, and the question comes with "Answer briefly.";
base models (Gemma-3-270M) get a plain "Context: ...\n\nQuestion: ...\nAnswer:" layout with no
instruction line: the prompt's "Answer:" already asks for the answer.

The base layout was chosen by measurement (``scripts/prompt_layouts.py`` and a held-out check;
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
    instruction = answer_instruction(tokenizer) if instruction is None else instruction
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
