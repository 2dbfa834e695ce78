"""Forward passes and the one decode loop every handoff uses.

Positions are always explicit: after a spliced or fused cache, a layer's length no longer equals
the next token's position (kvpress style), so the ``KVState`` carries the position and the
attention plan, and every forward here passes both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from kvviz.cache import KVState
from kvviz.models import LoadedModel
from kvviz.prompts import has_chat_template, stop_token_ids
from kvviz.results import GenerationSettings


def _forward_kwargs(state: KVState, count: int, device, capture: bool) -> dict:
    kwargs = {"cache": state.cache, "position_ids": state.positions(count, device), "use_cache": True}
    plan = state.plan(capture=capture)
    if plan is not None:
        kwargs["kvviz_plan"] = plan
    return kwargs


@torch.no_grad()
def prefill(loaded: LoadedModel, state: KVState, token_ids: list[int], need_logits: bool = True, capture: bool = False):
    """Feed tokens into ``state`` (in place). Returns (last-position logits or None, attention plan).

    Without ``need_logits`` only the decoder stack runs: Gemma 3's 262k-word output head would
    cost more than the rest of the model on a long prompt (REFERENCE §3).
    """
    if not token_ids:
        raise ValueError("prefill needs at least one token")
    device = loaded.device
    input_ids = torch.tensor([token_ids], device=device)
    kwargs = _forward_kwargs(state, len(token_ids), device, capture)
    if need_logits:
        output = loaded.model(input_ids=input_ids, logits_to_keep=1, **kwargs)
        logits = output.logits[:, -1, :].float()
    else:
        loaded.model.model(input_ids=input_ids, **kwargs)
        logits = None
    state.next_position += len(token_ids)
    return logits, kwargs.get("kvviz_plan")


@torch.no_grad()
def prefill_vectors(loaded: LoadedModel, state: KVState, vectors: torch.Tensor, need_logits: bool = True):
    """Like ``prefill``, but feed input vectors ``[tokens, width]`` in place of token ids (the
    model's ``inputs_embeds``, at the scale its own embedding layer outputs): for handoffs whose
    message is vectors rather than tokens. Returns the last-position logits (or None)."""
    if vectors.ndim != 2 or vectors.shape[0] == 0 or vectors.shape[1] != loaded.facts.hidden_size:
        raise ValueError(f"prefill_vectors needs [tokens >= 1, {loaded.facts.hidden_size}] vectors, got {list(vectors.shape)}")
    device = loaded.device
    embeds = vectors.to(device=device, dtype=loaded.dtype)[None]
    kwargs = _forward_kwargs(state, vectors.shape[0], device, False)
    if need_logits:
        logits = loaded.model(inputs_embeds=embeds, logits_to_keep=1, **kwargs).logits[:, -1, :].float()
    else:
        loaded.model.model(inputs_embeds=embeds, **kwargs)
        logits = None
    state.next_position += vectors.shape[0]
    return logits


@torch.no_grad()
def full_logits(loaded: LoadedModel, state: KVState, token_ids: list[int]) -> torch.Tensor:
    """Logits at every new position (tests and likelihood scoring)."""
    device = loaded.device
    input_ids = torch.tensor([token_ids], device=device)
    output = loaded.model(input_ids=input_ids, **_forward_kwargs(state, len(token_ids), device, False))
    state.next_position += len(token_ids)
    return output.logits[0].float()


@dataclass
class DecodeOutput:
    token_ids: list[int]
    text: str
    seconds: float
    first_token_seconds: float  # time until the first token was chosen (from the first logits)
    stopped_by: str  # "eos" | "newline" | "length"


def choose_token(logits: torch.Tensor, settings: GenerationSettings, generator: torch.Generator | None) -> int:
    if settings.greedy:
        return int(torch.argmax(logits, dim=-1)[0])
    probabilities = torch.softmax(logits[0] / settings.temperature, dim=-1)
    sorted_probs, sorted_ids = torch.sort(probabilities, descending=True)
    keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < settings.top_p
    sorted_probs = sorted_probs * keep
    choice = torch.multinomial(sorted_probs.cpu() / sorted_probs.sum().cpu(), 1, generator=generator)
    return int(sorted_ids[int(choice)])


@torch.no_grad()
def generate(
    loaded: LoadedModel,
    state: KVState,
    first_logits: torch.Tensor,
    settings: GenerationSettings,
    on_token: Callable[[str], None] | None = None,
    max_new_tokens: int | None = None,
    stop_at_newline: bool | None = None,
) -> DecodeOutput:
    """Greedy or seeded sampling from ``first_logits`` onwards, feeding each token into ``state``.

    Stops on EOS / chat end-of-turn tokens, after ``max_new_tokens``, and, for base models without
    a chat template, at the end of the first line (they would go on to invent the next question).
    ``on_token`` receives the answer text so far after every token (for streaming).
    """
    tokenizer = loaded.tokenizer
    limit = max_new_tokens or settings.max_new_tokens
    stop_ids = stop_token_ids(tokenizer)
    if stop_at_newline is None:
        stop_at_newline = not has_chat_template(tokenizer)
    generator = None
    if not settings.greedy:
        generator = torch.Generator().manual_seed(settings.seed)
    started = time.perf_counter()
    first_token_seconds = 0.0
    token_ids: list[int] = []
    logits = first_logits
    stopped_by = "length"
    text = ""
    while True:
        token = choose_token(logits, settings, generator)
        if not token_ids:
            first_token_seconds = time.perf_counter() - started
        if token in stop_ids:
            stopped_by = "eos"
            break
        token_ids.append(token)
        text = tokenizer.decode(token_ids, skip_special_tokens=True)
        if stop_at_newline and "\n" in text.lstrip():
            text = text.lstrip().split("\n", 1)[0]
            stopped_by = "newline"
            break
        if on_token is not None:
            on_token(text)
        if len(token_ids) >= limit:
            break
        logits, _ = prefill(loaded, state, [token])
    return DecodeOutput(
        token_ids=token_ids,
        text=text.strip(),
        seconds=time.perf_counter() - started,
        first_token_seconds=first_token_seconds,
        stopped_by=stopped_by,
    )
