"""Forward passes and the one decode loop every handoff uses.

Positions are always explicit: after a spliced or fused cache, a layer's length no longer equals
the next token's position (kvpress style), so the ``KVState`` carries the position and the
attention plan, and every forward here passes both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from kvviz.cache import KVState, place
from kvviz.measure import StageTimer, clock
from kvviz.models import LoadedModel
from kvviz.prompts import has_chat_template, stop_token_ids
from kvviz.results import GenerationSettings


def forward_kwargs(loaded: LoadedModel, state: KVState, count: int, capture: bool = False) -> dict:
    """Keyword arguments of a decoder forward of ``count`` new tokens on ``state``: its cache (each
    layer on its receiving layer's device, ``kvviz.cache.place``), explicit positions, and the
    attention plan when layers hold foreign keys."""
    place(state.cache, loaded.layer_devices)
    device = loaded.device
    kwargs = {"cache": state.cache, "position_ids": state.positions(count, device), "use_cache": True}
    plan = state.plan(capture=capture)
    if plan is not None:
        kwargs["kvviz_plan"] = plan
    return kwargs


class NextToken:
    """What a forward leaves for choosing the next token: the final hidden state at the last
    position. Its logits are computed only when asked for: greedy decoding takes the fast exact
    path of ``kvviz.head`` instead of the full output head."""

    def __init__(self, loaded: LoadedModel, hidden: torch.Tensor):
        self.loaded = loaded
        self.hidden = hidden  # [1, hidden size], after the final norm
        self._logits: torch.Tensor | None = None

    @property
    def logits(self) -> torch.Tensor:
        """Exact float32 logits [1, vocabulary]."""
        if self._logits is None:
            self._logits = self.loaded.head.logits(self.hidden)
        return self._logits

    def greedy_token(self) -> int:
        if self._logits is not None:
            return int(torch.argmax(self._logits, dim=-1)[0])
        return self.loaded.head.greedy_token(self.hidden)


@torch.no_grad()
def prefill(loaded: LoadedModel, state: KVState, token_ids: list[int], need_logits: bool = True, capture: bool = False):
    """Feed tokens into ``state`` (in place). Returns (``NextToken`` or None, attention plan).

    Only the decoder stack runs here; the output head runs for the last position only, and only
    when the next token is chosen (``NextToken``). Without ``need_logits`` no ``NextToken`` is
    made (a prefill that only fills the cache).
    """
    if not token_ids:
        raise ValueError("prefill needs at least one token")
    device = loaded.device
    input_ids = torch.tensor([token_ids], device=device)
    kwargs = forward_kwargs(loaded, state, len(token_ids), capture)
    hidden = loaded.model.model(input_ids=input_ids, **kwargs).last_hidden_state
    state.next_position += len(token_ids)
    next_token = NextToken(loaded, hidden[:, -1, :]) if need_logits else None
    return next_token, kwargs.get("kvviz_plan")


@torch.no_grad()
def prefill_vectors(loaded: LoadedModel, state: KVState, vectors: torch.Tensor, need_logits: bool = True):
    """Like ``prefill``, but feed input vectors ``[tokens, width]`` in place of token ids (the
    model's ``inputs_embeds``, at the scale its own embedding layer outputs): for handoffs whose
    message is vectors rather than tokens. Returns the ``NextToken`` (or None without ``need_logits``)."""
    if vectors.ndim != 2 or vectors.shape[0] == 0 or vectors.shape[1] != loaded.facts.hidden_size:
        raise ValueError(f"prefill_vectors needs [tokens >= 1, {loaded.facts.hidden_size}] vectors, got {list(vectors.shape)}")
    device = loaded.device
    embeds = vectors.to(device=device, dtype=loaded.dtype)[None]
    kwargs = forward_kwargs(loaded, state, vectors.shape[0])
    hidden = loaded.model.model(inputs_embeds=embeds, **kwargs).last_hidden_state
    state.next_position += vectors.shape[0]
    return NextToken(loaded, hidden[:, -1, :]) if need_logits else None


@torch.no_grad()
def full_logits(loaded: LoadedModel, state: KVState, token_ids: list[int]) -> torch.Tensor:
    """Logits at every new position (tests and likelihood scoring)."""
    device = loaded.device
    input_ids = torch.tensor([token_ids], device=device)
    output = loaded.model(input_ids=input_ids, **forward_kwargs(loaded, state, len(token_ids)))
    state.next_position += len(token_ids)
    return output.logits[0].float()


@dataclass
class DecodeOutput:
    token_ids: list[int]
    text: str
    seconds: float
    first_token_seconds: float  # time until the first token was chosen (from the first logits)
    stopped_by: str  # "eos" | "newline" | "length"


def choose_token(next_token: NextToken, settings: GenerationSettings, generator: torch.Generator | None) -> int:
    if settings.greedy:
        return next_token.greedy_token()
    probabilities = torch.softmax(next_token.logits[0] / settings.temperature, dim=-1)
    sorted_probs, sorted_ids = torch.sort(probabilities, descending=True)
    keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < settings.top_p
    sorted_probs = sorted_probs * keep
    choice = torch.multinomial(sorted_probs.cpu() / sorted_probs.sum().cpu(), 1, generator=generator)
    return int(sorted_ids[int(choice)])


@torch.no_grad()
def generate(
    loaded: LoadedModel,
    state: KVState,
    first: NextToken,
    settings: GenerationSettings,
    on_token: Callable[[str], None] | None = None,
    max_new_tokens: int | None = None,
    stop_at_newline: bool | None = None,
    timer: StageTimer | None = None,
) -> DecodeOutput:
    """Greedy or seeded sampling from ``first`` (what the prompt's prefill left) onwards, feeding
    each token into ``state``. With ``timer`` (the answer's), the moment the first token is chosen
    is marked on it (``StageTimer.mark_first_token``: the one time-to-first-token definition).

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
    started = clock()
    first_token_seconds = 0.0
    token_ids: list[int] = []
    next_token = first
    stopped_by = "length"
    text = ""
    while True:
        token = choose_token(next_token, settings, generator)
        if not token_ids:
            first_token_seconds = clock() - started
            if timer is not None:
                timer.mark_first_token()
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
        next_token, _ = prefill(loaded, state, [token])
    return DecodeOutput(
        token_ids=token_ids,
        text=text.strip(),
        seconds=clock() - started,
        first_token_seconds=first_token_seconds,
        stopped_by=stopped_by,
    )
