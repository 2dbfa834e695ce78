"""What crossed: which sent tokens each answer token read, and where in depth it appeared.

A run that asks for it (``HandoffRequest.inspect`` not None; the CLI's ``run`` does, the page asks for
the parts its tab in view shows and ``/run`` for every part with ``attention=True`` only, the bench and
the sweep do not) records, in the run itself and through kvviz's one attention capture
(``kvviz.runtime.attention.AttentionRows``):

* the receiver's attention rows while it writes each answer token (the prompt's last position
  for the first token, then each decode step, batched or not), at most ``MAX_TOKENS`` tokens;
* the hidden state after every receiver layer at the prompt's last position, for the logit lens.

Each handoff says what it sent (``SentTokens``, through its run's ``HandoffIO.send``: the
positions of the receiver's keys that hold what crossed, and their tokens); ``attach`` then writes
two fields on the result, one naming scheme for every handoff:

``token_attention``
  measured_on    what was measured, on which input, and the units (hover text)
  nothing_sent   None, or why there are no sent tokens (the handoff sent no tokens)
  sent_kind      what the sent positions are ("context tokens (the sender's KV cache)" ...)
  sent_positions positions of the sent keys; sent_tokens their text
  sent_layers    the receiver layers that hold the sent keys (KVComm: the layers it sent)
  answer_tokens  the answer's tokens (text), answer_ids their ids; captured: how many have rows
  layers, heads  the receiver's layer and head counts
  attention      [answer token][layer][head][sent position]: attention probability (0 to 1) of
                 that head's query on that key; 0 where the layer does not hold the key
  other          [answer token][layer][head]: the rest of the row's mass (the receiver's own keys)
``token_change`` (when the handoff's control, ``Handoff.control``, ran in the same run)
  measured_on, control (its name), control_title, tokens (this answer's first ``MAX_CHANGE_TOKENS``),
  ids, logprob (each token's log-probability as this handoff's decode chose it), control_logprob
  (the same tokens teacher-forced on the control's prompt), change (logprob - control_logprob)
``logit_lens``
  measured_on, layers (0..L-1, the output of each receiver layer through the receiver's own final
  norm and output head), answer_token / answer_probability (the first answer token's probability
  per layer), gold / gold_token / gold_probability (the gold answer's first token, when given), and
  the same for a ``counter`` answer when the request names one (``inspect["counter"]``: the value a
  contradicting sentence states, ``kvviz.engine.contradiction``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

MAX_TOKENS = 16  # answer tokens whose attention rows are kept (the first ones)
# What a recording may hold (``HandoffRequest.inspect["parts"]``; all of them when it does not say):
# the attention rows (``token_attention``), the logit lens (``logit_lens``), the scores against the
# control (``token_change``). Each costs its own work (docs/SPEED.md section 13), so a caller that
# shows one asks for that one.
PARTS = ("attention", "lens", "scores")
MAX_CHANGE_TOKENS = 16  # answer tokens scored against the control (the first ones, as the attention rows)
DIGITS = 3  # decimals of the stored attention probabilities (JSON size)



@dataclass(frozen=True)
class SentTokens:
    """What a handoff says crossed: the receiver's key positions that hold it, their tokens, and the
    receiver layers that hold them (None: every layer)."""

    kind: str  # what the sent positions are ("context tokens (the sender's KV cache)" ...)
    positions: tuple[int, ...]
    token_ids: tuple[int, ...]
    layers: tuple[int, ...] | None = None

    @classmethod
    def of(cls, kind: str, positions, token_ids, layers=None) -> "SentTokens":
        return cls(kind, tuple(int(p) for p in positions), tuple(int(t) for t in token_ids),
                   None if layers is None else tuple(sorted(int(layer) for layer in layers)))


@dataclass
class Inspection:
    """What one handoff's run recorded for its answer (one per ``run_handoff``, when the request asks)."""

    gold: str | None = None
    counter: str | None = None  # a second answer whose first token the lens follows too
    rows: list[dict] = field(default_factory=list)  # one per answer token: layer -> (probs, positions)
    lens_hidden: torch.Tensor | None = None  # [layers, hidden], each layer's output after the final norm
    # which answer token the lens follows: the first that is not whitespace alone (a leading " " chosen
    # at the prompt's end says nothing about the answer); lens_hidden is taken where it was chosen
    lens_index: int = 0
    answer_ids: list[int] = field(default_factory=list)
    model: object = None  # the receiver (LoadedModel) that wrote the answer
    # the receiver's state after its prompt and the final hidden state there (KVState, tensor): what
    # ``kvviz.engine.runner`` scores this answer and its control's on (``token_change``), then drops
    prompt: tuple | None = None
    chose: torch.Tensor | None = None  # [tokens, hidden]: the final hidden state that chose each answer token
    receiver: object = None  # the model whose prompts are recorded (None: every model's)
    parts: frozenset = frozenset(PARTS)  # what is recorded (``PARTS``)

    def wants(self, part: str) -> bool:
        return part in self.parts

    def records(self, loaded) -> bool:
        """Whether a prompt read by ``loaded`` is recorded (the receiver's; a sharer's is not)."""
        return self.receiver is None or loaded is self.receiver


def inspection_for(request, receiver=None) -> Inspection | None:
    """What one handoff's run records of its answer when the request asks (else None), in the
    prompts ``receiver`` reads (every model's when None): the ``parts`` it names (all of ``PARTS``
    when it names none). A part kvviz does not know is refused."""
    options = getattr(request, "inspect", None)
    if options is None:
        return None
    parts = frozenset(options.get("parts") or PARTS)
    unknown = sorted(parts - set(PARTS))
    if unknown:
        raise ValueError(f"inspect parts must be among {', '.join(PARTS)}; got {', '.join(unknown)}")
    return Inspection(gold=options.get("gold") or None, counter=options.get("counter") or None, receiver=receiver,
                      parts=parts)


def layer_outputs(loaded, output) -> torch.Tensor | None:
    """[layers, hidden]: the output of each decoder layer at the last position, through the final
    norm (the last one is the model's own final hidden state); None when the forward kept none."""
    if output.hidden_states is None:
        return None
    num_layers = loaded.facts.num_layers
    norm = loaded.model.model.norm
    states = [norm(output.hidden_states[layer + 1][0, -1:]) for layer in range(num_layers - 1)]
    states.append(output.last_hidden_state[0, -1:])
    return torch.cat(states).detach()


def record_answer(inspection: Inspection, loaded, first_inspected, rows, token_ids: list[int],
                  chose: torch.Tensor | None = None) -> None:
    """Called by the answer's decode loop: the first token's row and layer states (from the
    prompt's prefill), the later tokens' rows, the answer, and the final hidden state that chose
    each of its first ``MAX_CHANGE_TOKENS`` tokens (``chose``)."""
    if first_inspected is None:
        return
    first_row, hidden, prompt_state, prompt_hidden = first_inspected
    inspection.model = loaded
    inspection.lens_hidden = hidden
    inspection.prompt = None if prompt_state is None else (prompt_state, prompt_hidden)
    inspection.chose = chose
    inspection.rows = ([first_row] if first_row else []) + list(rows)
    inspection.answer_ids = list(token_ids)


# --- the result fields -------------------------------------------------------------------------------


def _token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([int(token_id)], skip_special_tokens=False)


def token_attention(inspection: Inspection, sent: SentTokens | None, nothing_sent: str) -> dict:
    loaded = inspection.model
    tokenizer = loaded.tokenizer
    num_layers, num_heads = loaded.facts.num_layers, loaded.facts.num_heads
    captured = min(len(inspection.rows), len(inspection.answer_ids), MAX_TOKENS)
    data = {
        "measured_on": (
            "this query, in this run: the receiver's attention while it wrote each answer token (the "
            "softmax probability of each head's query on each sent key, 0 to 1; a row sums to 1 over all keys)"
        ),
        "nothing_sent": None,
        "sent_kind": None if sent is None else sent.kind,
        "sent_positions": [] if sent is None else list(sent.positions),
        "sent_tokens": [] if sent is None else [_token_text(tokenizer, t) for t in sent.token_ids],
        "sent_layers": None if sent is None or sent.layers is None else list(sent.layers),
        "answer_tokens": [_token_text(tokenizer, t) for t in inspection.answer_ids],
        "answer_ids": inspection.answer_ids,
        "captured": captured,
        "layers": num_layers,
        "heads": num_heads,
        "attention": [],
        "other": [],
    }
    if sent is None:
        data.update(nothing_sent=nothing_sent)
        return data
    positions = torch.tensor(sent.positions, dtype=torch.long)
    if sent.layers is None:
        data["sent_layers"] = list(range(num_layers))
    for row in inspection.rows[:captured]:
        token_rows, token_other = [], []
        for layer in range(num_layers):
            probabilities, keys = row[layer]
            match = (keys[None, :] == positions[:, None]).float()  # [sent, keys]
            on_sent = probabilities @ match.T  # [heads, sent]
            token_rows.append(on_sent.round(decimals=DIGITS).tolist())
            token_other.append((probabilities.sum(-1) - on_sent.sum(-1)).clamp(min=0).round(decimals=DIGITS).tolist())
        data["attention"].append(token_rows)
        data["other"].append(token_other)
    return data


def first_content_index(tokenizer, token_ids: list[int]) -> int:
    """The position of the answer's first token that is not whitespace alone (0 when there is none)."""
    for index, token in enumerate(token_ids):
        if _token_text(tokenizer, token).strip():
            return index
    return 0


def lens_tokens(inspection: Inspection) -> list[int]:
    """The tokens the lens follows: the answer's first content token (``lens_index``), then the gold
    answer's first as the receiver might write it (``gold_candidates``); at least one token."""
    tokens = list(inspection.answer_ids[inspection.lens_index:inspection.lens_index + 1])
    for answer in (inspection.gold, inspection.counter):
        if answer and answer.strip():
            tokens += [t for t in gold_candidates(inspection.model.tokenizer, answer) if t not in tokens]
    return tokens or [0]


def logit_lens(inspection: Inspection) -> dict:
    tokens = lens_tokens(inspection)
    table = inspection.model.head.log_probability_table(
        inspection.lens_hidden, torch.tensor(tokens)[None].expand(inspection.lens_hidden.shape[0], -1))
    return lens_record(inspection, tokens, table.exp())


def lens_record(inspection: Inspection, tokens: list[int], probabilities: torch.Tensor) -> dict:
    """The ``logit_lens`` field from the probabilities [layers, tokens] of ``lens_tokens``."""
    tokenizer = inspection.model.tokenizer
    column = {token: probabilities[:, i] for i, token in enumerate(tokens)}
    data = {
        "measured_on": (
            "this query, in this run: where the answer's first token that is not whitespace is chosen (the prompt's "
            "last position, or after a leading space, teacher-forced), "
            "the output of each receiver layer put through the receiver's own final norm and output head "
            "(a logit lens: a probability, 0 to 1, not what the model 'thinks'); the softmax's normaliser takes the "
            "likeliest tokens exact and the vocabulary's tail from the head's bfloat16 copy where the CPU has one"
        ),
        "layers": list(range(probabilities.shape[0])),
        "answer_token": None,
        "answer_probability": None,
        "gold": inspection.gold,
        "gold_token": None,
        "gold_probability": None,
    }
    if inspection.answer_ids:
        first = inspection.answer_ids[inspection.lens_index]
        data["answer_token"] = _token_text(tokenizer, first)
        data["answer_probability"] = column[first].round(decimals=6).tolist()
    for name, answer in (("gold", inspection.gold), ("counter", inspection.counter)):
        candidates = gold_candidates(tokenizer, answer) if answer and answer.strip() else []
        if name == "counter" and answer:
            data.update(counter=answer, counter_token=None, counter_probability=None)
        if candidates:
            # the answer's first token as the receiver would write it: whichever its last layer finds likelier
            chosen = max(candidates, key=lambda token: float(column[token][-1]))
            data[f"{name}_token"] = _token_text(tokenizer, chosen)
            data[f"{name}_probability"] = column[chosen].round(decimals=6).tolist()
    return data


def gold_candidates(tokenizer, gold: str) -> list[int]:
    """The gold answer's first content token (not whitespace alone: " 4471" is " ", "4", ... to
    Gemma's tokenizer) with and without a leading space (distinct ones)."""
    candidates: list[int] = []
    for text in (gold.strip(), " " + gold.strip()):
        ids = [int(token) for token in tokenizer(text, add_special_tokens=False)["input_ids"]]
        first = ids[first_content_index(tokenizer, ids)] if ids else None
        if first is not None and first not in candidates:
            candidates.append(first)
    return candidates


def change_record(inspection: Inspection, control: str, control_title: str, own: list[float],
                  under_control: list[float]) -> dict:
    """The ``token_change`` field: this answer's tokens, their log-probabilities here and under the
    control, and the change (nats; positive: this handoff made the token likelier)."""
    tokenizer = inspection.model.tokenizer
    ids = inspection.answer_ids[: len(own)]
    return {
        "measured_on": (
            f"this query, in this run: each answer token's log-probability (natural log, temperature 1), given the "
            f"prompt and the answer's earlier tokens, under this handoff's receiver state and under its control's "
            f"({control_title}): this handoff's from the states its decoding chose them from, the control's "
            "teacher-forced (one extra forward of the answer's tokens on the control's prompt); the log-sum-exp over "
            "the vocabulary exact for the likeliest tokens and from the head's bfloat16 copy for the rest where the "
            "CPU has one (within 0.01 nat of fp32)"
        ),
        "control": control,
        "control_title": control_title,
        "tokens": [_token_text(tokenizer, t) for t in ids],
        "ids": list(ids),
        "logprob": [round(float(v), 4) for v in own],
        "control_logprob": [round(float(v), 4) for v in under_control],
        "change": [round(float(a) - float(b), 4) for a, b in zip(own, under_control)],
    }


class RunRecords:
    """What one run of several handoffs recorded (the engine's run, ``kvviz.engine.runner.RunContext``):
    (result, inspection) for each recorded result, added as each handoff finishes (from its own thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.entries: list[tuple] = []

    def add(self, result, inspection: Inspection) -> list[tuple]:
        """Add a finished result; returns every entry so far, this one included (under one lock, so
        that of two handoffs finishing together exactly one sees the other)."""
        with self._lock:
            self.entries.append((result, inspection))
            return list(self.entries)


def attach(result, inspection: Inspection | None, sent: SentTokens | None, nothing_sent: str) -> None:
    """Write ``token_attention`` and ``logit_lens`` on a result (an applicable one), in the thread
    that ran it, from what its run recorded and what it sent; where no receiver's answer was
    recorded, only a ``token_attention`` that says nothing was sent."""
    if inspection is None or not result.applicable:
        return
    if inspection.model is None and inspection.wants("attention"):  # no receiver wrote this answer (the sharer alone)
        result.token_attention = {"nothing_sent": "nothing was sent: no receiver read anything (the sharer answers "
                                  "alone; its own prompt is not recorded)", "answer_tokens": [], "attention": []}
        return
    if inspection.model is None:
        return
    if inspection.wants("attention"):
        result.token_attention = token_attention(inspection, sent, nothing_sent)
    if inspection.wants("lens"):
        result.logit_lens = logit_lens(inspection)
