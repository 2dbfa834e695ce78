"""Forward passes and the one decode loop every handoff uses.

Positions are always explicit: after a spliced or fused cache, a layer's length no longer equals
the next token's position (kvpress style), so the ``KVState`` carries the position and the
attention plan, and every forward here passes both.

Decode steps are shared: every sequence that decodes with a model takes its steps in that model's
``DecodeBatch`` (``kvviz.runtime.batching``) through the batched step of ``kvviz.runtime.step``, so the handoffs
of a run (and concurrent runs) that decode with the same model stream its weights once per step.
A sequence gets exactly the tokens it would get alone. Models the batched step does not cover, and
``KVVIZ_BATCHED_DECODE=0``, take each decode token through the model's own forward, one sequence at
a time (the path before the batched step).
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch

from kvviz.core.prompts import has_chat_template, stop_token_ids
from kvviz.core.results import GenerationSettings
from kvviz.runtime import crossed, recording
from kvviz.runtime.attention import AttentionPlan, AttentionRows
from kvviz.runtime.batching import Sequence, decode_batch
from kvviz.runtime.recording import AnswerRecord
from kvviz.runtime.cache import KVState, copy_cache, place
from kvviz.runtime.measure import StageTimer, clock
from kvviz.runtime.models import LoadedModel


def forward_kwargs(loaded: LoadedModel, state: KVState, count: int, capture: bool = False) -> dict:
    """Keyword arguments of a decoder forward of ``count`` new tokens on ``state``: its cache (each
    layer on its receiving layer's device, ``kvviz.runtime.cache.place``), explicit positions, and the
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
    path of ``kvviz.runtime.head`` instead of the full output head."""

    def __init__(self, loaded: LoadedModel, hidden: torch.Tensor, greedy: int | None = None):
        self.loaded = loaded
        self.hidden = hidden  # [1, hidden size], after the final norm
        self._logits: torch.Tensor | None = None
        self._greedy = greedy  # the greedy choice, when a batched step already made it
        # what a prefill recorded for ``kvviz.runtime.crossed`` (attention row, layer states), when it did
        self.inspected: tuple | None = None

    @property
    def logits(self) -> torch.Tensor:
        """Exact float32 logits [1, vocabulary]."""
        if self._logits is None:
            self._logits = self.loaded.head.logits(self.hidden)
        return self._logits

    def greedy_token(self) -> int:
        if self._greedy is not None:
            return self._greedy
        if self._logits is not None:
            return int(torch.argmax(self._logits, dim=-1)[0])
        return self.loaded.head.greedy_token(self.hidden)


@torch.no_grad()
def prefill(loaded: LoadedModel, state: KVState, token_ids: list[int], need_logits: bool = True, capture: bool = False,
            plan: AttentionPlan | None = None):
    """Feed tokens into ``state`` (in place). Returns (``NextToken`` or None, attention plan).

    Only the decoder stack runs here; the output head runs for the last position only, and only
    when the next token is chosen (``NextToken``). Without ``need_logits`` no ``NextToken`` is
    made (a prefill that only fills the cache). ``plan`` replaces the state's own attention plan
    (a handoff that measures its own capture window, as CIPHER does).
    """
    if not token_ids:
        raise ValueError("prefill needs at least one token")
    input_ids = torch.tensor([token_ids], device=loaded.device)
    return _prompt_forward(loaded, state, len(token_ids), need_logits, capture, plan, input_ids=input_ids)


def _prompt_forward(loaded: LoadedModel, state: KVState, count: int, need_logits: bool, capture: bool = False,
                    plan: AttentionPlan | None = None, **inputs):
    """The decoder stack on ``count`` new tokens (ids or vectors). When ``kvviz.runtime.crossed`` records
    this handoff's answer, a prefill whose next token is chosen records its last token's attention
    rows and every layer's output there (kept on the ``NextToken``); a state that records its rows
    (``KVState.token_rows``, a decode token) records them there."""
    kwargs = forward_kwargs(loaded, state, count, capture)
    if plan is not None:
        kwargs["kvviz_plan"] = plan
    rows, inspected = state.token_rows, False
    inspection = recording.inspection()
    if rows is None and need_logits and inspection is not None and inspection.records(loaded):
        inspected = True  # the attention row and the layer outputs, as far as the recording wants them
        rows = AttentionRows(limit=1) if inspection.wants("attention") else None
        kwargs["output_hidden_states"] = inspection.wants("lens")
    if rows is not None:
        kwargs["kvviz_rows"] = rows
    output = loaded.model.model(**inputs, **kwargs)
    if rows is not None:
        rows.commit()
    state.next_position += count
    next_token = NextToken(loaded, output.last_hidden_state[:, -1, :]) if need_logits else None
    if inspected:
        next_token.inspected = (rows.rows[0] if rows is not None and rows.rows else None, crossed.layer_outputs(loaded, output))
    return next_token, kwargs.get("kvviz_plan")


# --- prompts read once per run ---------------------------------------------------------------------


@dataclass
class ReadPrompt:
    """A prompt read from position 0 by ``read_prompt_once``."""

    state: KVState  # the reader's own copy (it may append to it)
    layer_inputs: list[torch.Tensor]  # the hidden state entering each decoder layer at the last token
    seconds: float  # how long reading it took, when it was read
    shared: bool  # read by another handoff of this run
    waited: float  # seconds this caller waited for it


class _Read:
    def __init__(self):
        self.ready = threading.Event()
        self.cache = None
        self.next_position = 0
        self.layer_inputs: list[torch.Tensor] = []
        self.seconds = 0.0
        self.error: BaseException | None = None


class SharedPrompts:
    """The prompts read in one run, by model and token ids: one run's handoffs pass the same one
    to ``read_prompt_once`` (``kvviz.engine.runner.RunContext.prompts``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._reads: dict[tuple, _Read] = {}

    def read(self, loaded: LoadedModel, token_ids: list[int]) -> tuple[_Read, bool]:
        """The read of these tokens; True when this caller must do it (it is the first to ask)."""
        key = (id(loaded.model), tuple(token_ids))
        with self._lock:
            if key in self._reads:
                return self._reads[key], False
            self._reads[key] = read = _Read()
            return read, True


@torch.no_grad()
def read_prompt_once(loaded: LoadedModel, token_ids: list[int], timer: StageTimer | None = None,
                     stage: str | None = None, shared: SharedPrompts | None = None) -> ReadPrompt:
    """Read ``token_ids`` from position 0 into a fresh state, with the hidden state entering each
    decoder layer at the last token. With ``shared`` (one run's prompts) the first handoff that asks
    reads it and the others wait for it and get copies: the same computation on the same input, so
    bitwise what they would have read themselves (KVComm's and AC's sender read the same context;
    C2C and its control the same receiver prompt). With ``timer``, the reading is timed as ``stage``
    at its own cost also where it was shared (the method's cost does not drop because another
    column paid it; the run's wall time shows the saving)."""
    with timer.stage(stage) if timer is not None else nullcontext():
        started = clock()
        read, mine = shared.read(loaded, token_ids) if shared is not None else (_Read(), True)
        if mine:
            try:
                state = KVState()
                output = loaded.model.model(input_ids=torch.tensor([token_ids], device=loaded.device),
                                            output_hidden_states=True, **forward_kwargs(loaded, state, len(token_ids)))
                read.cache, read.next_position = state.cache, len(token_ids)
                read.layer_inputs = [h[0, -1].detach().clone() for h in output.hidden_states[: loaded.facts.num_layers]]
                read.seconds = clock() - started
            except BaseException as error:
                read.error = error
                raise
            finally:
                read.ready.set()
        else:
            read.ready.wait()
            if read.error is not None:
                raise RuntimeError(f"reading the shared prompt failed in another handoff: {read.error}")
        waited = clock() - started
    if timer is not None and not mine:
        timer.add(stage, max(0.0, read.seconds - waited))
    # in a run every reader gets its own copy (the first one too: a later reader copies the original)
    cache = read.cache if shared is None else copy_cache(read.cache)
    state = KVState(cache=cache, next_position=read.next_position)
    return ReadPrompt(state=state, layer_inputs=read.layer_inputs, seconds=read.seconds, shared=not mine, waited=waited)


@torch.no_grad()
def prefill_vectors(loaded: LoadedModel, state: KVState, vectors: torch.Tensor, need_logits: bool = True):
    """Like ``prefill``, but feed input vectors ``[tokens, width]`` in place of token ids (the
    model's ``inputs_embeds``, at the scale its own embedding layer outputs): for handoffs whose
    message is vectors rather than tokens. Returns the ``NextToken`` (or None without ``need_logits``)."""
    if vectors.ndim != 2 or vectors.shape[0] == 0 or vectors.shape[1] != loaded.facts.hidden_size:
        raise ValueError(f"prefill_vectors needs [tokens >= 1, {loaded.facts.hidden_size}] vectors, got {list(vectors.shape)}")
    embeds = vectors.to(device=loaded.device, dtype=loaded.dtype)[None]
    return _prompt_forward(loaded, state, vectors.shape[0], need_logits, inputs_embeds=embeds)[0]


@torch.no_grad()
def full_logits(loaded: LoadedModel, state: KVState, token_ids: list[int]) -> torch.Tensor:
    """Logits at every new position (tests and likelihood scoring)."""
    device = loaded.device
    input_ids = torch.tensor([token_ids], device=device)
    output = loaded.model(input_ids=input_ids, **forward_kwargs(loaded, state, len(token_ids)))
    state.next_position += len(token_ids)
    return output.logits[0].float()


@torch.no_grad()
def answer_logprobs(loaded: LoadedModel, state: KVState, first_hidden: torch.Tensor, token_ids: list[int]) -> list[float]:
    """The log-probability (natural log, temperature 1) of each of ``token_ids`` given the prompt
    that left ``state`` and ``first_hidden`` (the final hidden state that chooses the first answer
    token) and the tokens before it: teacher forcing, one forward of the tokens but the last on a
    copy of ``state`` (which is left as it was); the head's ``log_probabilities``."""
    if not token_ids:
        return []
    hidden = [first_hidden.reshape(1, -1)]
    if len(token_ids) > 1:
        copy = state.copy()
        input_ids = torch.tensor([token_ids[:-1]], device=loaded.device)
        output = loaded.model.model(input_ids=input_ids, **forward_kwargs(loaded, copy, len(token_ids) - 1))
        hidden.append(output.last_hidden_state[0])
    return loaded.head.log_probabilities(torch.cat(hidden), token_ids)


@torch.no_grad()
def lens_at_first_content_token(inspection) -> None:
    """Move a recorded answer's logit lens (``kvviz.runtime.crossed``) to where its first content
    token was chosen: when the answer starts with whitespace-only tokens (" "), the receiver reads
    them teacher-forced on a copy of its prompt's state and every layer's output is taken at the
    last of them (one extra forward of those tokens). Nothing changes for an answer that starts
    with content, or without a recorded prompt."""
    if (inspection is None or not inspection.wants("lens") or inspection.model is None or inspection.prompt is None
            or not inspection.answer_ids):
        return
    loaded = inspection.model
    index = crossed.first_content_index(loaded.tokenizer, inspection.answer_ids)
    if index == 0:
        return
    state = inspection.prompt[0].copy()
    leading = inspection.answer_ids[:index]
    output = loaded.model.model(input_ids=torch.tensor([leading], device=loaded.device), output_hidden_states=True,
                                **forward_kwargs(loaded, state, len(leading)))
    inspection.lens_hidden, inspection.lens_index = crossed.layer_outputs(loaded, output), index


@dataclass
class DecodeOutput:
    token_ids: list[int]
    text: str
    seconds: float
    first_token_seconds: float  # time until the first token was chosen (from the first logits)
    stopped_by: str  # "eos" | "newline" | "length"
    batch_sizes: list[int] | None = None  # sequences in each decode step it took (None: not batched)


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
    ``on_token`` receives the answer text so far after every token (for streaming); it runs in
    this thread and must not block (the other sequences of the model's batch wait for it).

    Each step goes through the model's shared batch (``decode_batch``) when there is one: the first
    token comes from ``first`` in this thread, then this sequence joins the batch for the rest.
    """
    tokenizer = loaded.tokenizer
    limit = max_new_tokens or settings.max_new_tokens
    stop_ids = stop_token_ids(tokenizer)
    if stop_at_newline is None:
        stop_at_newline = not has_chat_template(tokenizer)
    generator = None if settings.greedy else torch.Generator().manual_seed(settings.seed)
    started = clock()
    first_token_seconds = 0.0
    token_ids: list[int] = []
    next_token, stopped_by, text = first, "length", ""
    batch = decode_batch(loaded)
    sequence: Sequence | None = None
    record = AnswerRecord.start(loaded, state, first, timer)
    try:
        while True:
            if record is not None:
                record.choosing(next_token)
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
                text, stopped_by = text.lstrip().split("\n", 1)[0], "newline"
                break
            if on_token is not None:
                on_token(text)
            if len(token_ids) >= limit:
                break
            if batch is None:
                next_token, _ = prefill(loaded, state, [token])
                continue
            if sequence is None:
                sequence = Sequence(state=state, greedy=settings.greedy)
                batch.join(sequence)
            done = batch.step(sequence, token)
            next_token = NextToken(loaded, done.hidden, greedy=done.token)
    finally:
        if sequence is not None:
            batch.leave(sequence)
        if record is not None:
            record.stop()
    output = DecodeOutput(
        token_ids=token_ids, text=text.strip(), seconds=clock() - started, first_token_seconds=first_token_seconds,
        stopped_by=stopped_by, batch_sizes=None if batch is None else (list(sequence.sizes) if sequence is not None else []),
    )
    if record is not None:
        record.finish(token_ids)
    if recording.active() is not None:  # the engine reports each handoff's decode batches
        recording.active().decodes.append(output)
    return output
