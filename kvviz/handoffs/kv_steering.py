"""KV-cache steering: one edit of the receiver's own cache, with vectors built from contrastive
pairs. No sharer runs and nothing is sent: it asks whether a change in an answer needs
communication at all, or only an edit of the cache.

KV cache steering (Belitsky et al. 2025, arXiv 2507.08799; code mirror nagyist/cache-steering):
1. Contrastive pairs: for each demo question, a *positive* prompt whose earlier turns (the other
   demos) show the wanted behaviour and a *negative* one whose earlier turns show the unwanted one,
   both ending with the question and the answer prompt (the reference code's few-shot contrastive
   set, ``ContrastiveDatasetConstructor``). The option ``pairs`` names the set: built-in pairs for
   "answer briefly" and "use the context", or the user's own (``my_pairs``).
2. Steering vectors, per layer: the mean over pairs of (positive - negative) cached keys and values
   at one token position, ``[kv heads, head dim]`` each (``extract_steering_kv``, mean
   aggregation). Keys are the cached ones, after RoPE, as in the reference code.
3. The edit, once: the receiver prefills its prompt (the question alone, as the receiver-alone
   baseline) except its last token; ``c_k * K_l`` and ``c_v * V_l`` are added to the cached key and
   value of the last cached position in every layer from ``first_layer`` on (the reference steers
   layer 1 and above, ``how="last"``); then the prompt's last token is read and the answer decoded
   with the shared loop. Answer tokens are never edited.

Token positions: the reference edits the last position in the cache before the prompt's final
token is read. Without its optional appended token (``append_special_token``) that position is the
prompt's second to last token, so the vectors are extracted there too (its
``extraction_method="penultimate_token"``): extraction and edit sit on the same token of the answer
prompt ("assistant" of a chat template's "<|im_start|>assistant\\n", "Answer" of a base model's
"\\nAnswer:"). So with zero coefficients the run is the receiver alone, token for token (a test).

Coefficients: ``keys`` (c_k) defaults to 0.0 and ``values`` (c_v) to 4.0: every configuration of
the reference's best_args.yaml steers values only, with c_v from 1 to 10 (4 and 6 most often for
SmolLM2-360M and Qwen2-0.5B).

The built-in pairs were written for this project (short, public-knowledge questions). The steering
vectors are built once per receiver and pair set and cached (``details["vectors"]``: seconds,
cached); that one-off is not part of the run's stages, as KVComm's calibration is not.

Per-layer records (``HandoffResult.layers``, one per receiver layer):
  layer                     receiver layer index
  steered                   whether this layer's cache was edited
  key_edit_norm             || c_k K_l || over heads (0 where not steered or c_k = 0)
  value_edit_norm           || c_v V_l || over heads
  key_norm, value_norm      the norm of the cached key / value at the edited position before the edit
``details``: the receiver alone's answer (instrumentation: run after the answer, never timed),
whether the answer changed, and the first answer token's top probabilities with and without the
edit, and their KL divergence.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from kvviz.core import limits
from kvviz.core.prompts import answer_instruction, build_segments, user_message
from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.handoffs.common import HandoffIO, handoff_result
from kvviz.handoffs.registry import Handoff, Option, ReceiverPrompt, option_values
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import NextToken, generate, prefill
from kvviz.runtime.measure import StageTimer, answer_flops
from kvviz.runtime.models import LoadedModel, LoadedPair

NAME = "kv_steering"
COLOR = "#7A7A1F"  # olive
PAIR_SETS = ("answer_briefly", "use_the_context", "my_pairs")
MAX_PAIRS = 16
TOP_TOKENS = 5  # first-token probabilities shown with and without the edit
OPTIONS = (
    Option("pairs", "KV steering: contrastive pairs (built-in answer_briefly or use_the_context, or my_pairs below)",
           "answer_briefly", kind="choice", choices=PAIR_SETS, sweep_flag="--steering-pairs",
           sweep_default="answer_briefly,use_the_context"),
    Option("my_pairs", "KV steering: your pairs, one per line: question | wanted answer | unwanted answer "
           "(or context | question | wanted | unwanted)", "", kind="text"),
    Option("values", "KV steering: value coefficient c_v", 4.0, minimum=0.0, maximum=20.0, step=0.5,
           sweep_flag="--steering-values", sweep_default="4"),
    Option("keys", "KV steering: key coefficient c_k (the paper's configurations use 0)", 0.0, minimum=0.0,
           maximum=5.0, step=0.1),
    Option("first_layer", "KV steering: first steered layer (the reference steers layer 1 and above)", 1, kind="int",
           minimum=0),
)


@dataclass(frozen=True)
class Demo:
    """One contrastive demo: the question (and its context), the wanted and the unwanted answer."""

    question: str
    wanted: str
    unwanted: str
    context: str | None = None


BUILT_IN = {
    "answer_briefly": (
        Demo("What is the capital of France?", "Paris.",
             "That is a great question, and there is a lot to say about it. France is a large country in Western "
             "Europe with a long history, and its capital, which is also its largest city, is Paris."),
        Demo("How many legs does a spider have?", "Eight.",
             "Spiders are arachnids, not insects, which is a common confusion. Unlike insects, which have six legs, "
             "a spider has eight legs, arranged in four pairs along its body."),
        Demo("What colour is the sky on a clear day?", "Blue.",
             "On a clear day the sky looks blue. This is because sunlight is scattered by the air, and the short "
             "blue wavelengths are scattered much more than the red ones, so blue reaches us from every direction."),
        Demo("Who wrote Romeo and Juliet?", "William Shakespeare.",
             "Romeo and Juliet is one of the most famous plays ever written. It is a tragedy about two young lovers "
             "from feuding families, and it was written by the English playwright William Shakespeare."),
        Demo("What is water made of?", "Hydrogen and oxygen.",
             "Water is a simple but remarkable substance. Each molecule of water is made of two hydrogen atoms bound "
             "to one oxygen atom, which is why its chemical formula is written as H2O."),
        Demo("Which planet is closest to the Sun?", "Mercury.",
             "The planets of our solar system orbit the Sun at very different distances. The one closest to the Sun, "
             "and also the smallest of the eight planets, is Mercury."),
    ),
    "use_the_context": (
        Demo("What is the capital of France?", "Lyon.", "Paris.",
             context="In this story, the capital of France was moved to Lyon in 2031."),
        Demo("What is the code for locker 7?", "2913.", "I do not know the code for locker 7.",
             context="The code for locker 7 is 2913."),
        Demo("What colour is Mira's bicycle?", "Green.", "Red.",
             context="Mira painted her old red bicycle green last spring."),
        Demo("How many moons does Kepler-9x have?", "Four.", "Planets usually have no moons.",
             context="The survey found that Kepler-9x has four moons."),
        Demo("Who wrote the letter?", "Tomas.", "William Shakespeare.",
             context="The letter on the desk was written by Tomas, the night guard."),
        Demo("Which planet is closest to the Sun?", "Vulcan.", "Mercury.",
             context="In the game's universe, the planet closest to the Sun is Vulcan."),
    ),
}


def parse_my_pairs(text: str) -> tuple[Demo, ...]:
    """The user's pairs: one per line, "question | wanted | unwanted" or "context | question |
    wanted | unwanted". A ValueError says which line is wrong and how."""
    text = limits.clean_text(text, "Your steering pairs", limits.MAX_CONTEXT_CHARS)
    demos = []
    for number, line in enumerate((line for line in text.splitlines() if line.strip()), start=1):
        fields = [field.strip() for field in line.split("|")]
        if len(fields) not in (3, 4) or not all(fields):
            raise ValueError(f"Steering pair {number} needs 3 fields (question | wanted answer | unwanted answer) or 4 "
                             f"(context | question | wanted | unwanted), each non-empty; got {line.strip()!r}.")
        if len(fields) == 4:
            demos.append(Demo(fields[1], fields[2], fields[3], context=fields[0]))
        else:
            demos.append(Demo(*fields))
    if len(demos) < 2:
        raise ValueError("Write at least 2 steering pairs (one per line): each pair's prompt shows the others as examples.")
    if len(demos) > MAX_PAIRS:
        raise ValueError(f"{len(demos)} steering pairs; the limit is {MAX_PAIRS}.")
    return tuple(demos)


def demos_of(values: dict) -> tuple[Demo, ...]:
    return parse_my_pairs(values["my_pairs"]) if values["pairs"] == "my_pairs" else BUILT_IN[values["pairs"]]


# --- the steering vectors ---------------------------------------------------------------------


def contrastive_prompts(tokenizer, demos: tuple[Demo, ...]) -> list[tuple[list[int], list[int]]]:
    """(positive, negative) token ids per demo: the other demos as earlier turns, answered the
    wanted (positive) or the unwanted (negative) way, then this demo's question and answer prompt."""
    instruction = answer_instruction(tokenizer)
    prompts = []
    for index, demo in enumerate(demos):
        others = [other for position, other in enumerate(demos) if position != index]

        def history(wanted: bool) -> list[dict]:
            turns = []
            for other in others:
                turns.append({"role": "user", "content": "".join(user_message(other.question, other.context, instruction))})
                turns.append({"role": "assistant", "content": other.wanted if wanted else other.unwanted})
            return turns

        prompts.append(tuple(build_segments(tokenizer, demo.question, demo.context, history=history(wanted)).input_ids
                             for wanted in (True, False)))
    return prompts


@dataclass(frozen=True)
class SteeringVectors:
    keys: list[torch.Tensor]  # per layer [kv heads, head dim]
    values: list[torch.Tensor]
    pairs: int
    seconds: float


_vectors: dict[tuple, SteeringVectors] = {}
_vectors_lock = threading.Lock()


def _kv_at(model: LoadedModel, token_ids: list[int], position: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the cached key and value ``[kv heads, head dim]`` at ``position`` of a prefill."""
    state = kv.KVState()
    prefill(model, state, token_ids, need_logits=False)
    return [tuple(t[0, :, position, :].float() for t in kv.layer_kv(state.cache, layer))
            for layer in range(kv.num_layers(state.cache))]


@torch.no_grad()
def steering_vectors(model: LoadedModel, demos: tuple[Demo, ...]) -> tuple[SteeringVectors, bool]:
    """Mean (positive - negative) key and value per layer at each prompt's second to last token;
    cached per model and pair set. Returns (vectors, whether they came from the cache)."""
    key = (model.name, demos)
    with _vectors_lock:
        if key in _vectors:
            return _vectors[key], True
    started = time.perf_counter()
    keys = values = None
    prompts = contrastive_prompts(model.tokenizer, demos)
    for positive, negative in prompts:
        wanted, unwanted = _kv_at(model, positive, -2), _kv_at(model, negative, -2)
        key_differences = [w[0] - u[0] for w, u in zip(wanted, unwanted)]
        value_differences = [w[1] - u[1] for w, u in zip(wanted, unwanted)]
        keys = key_differences if keys is None else [a + b for a, b in zip(keys, key_differences)]
        values = value_differences if values is None else [a + b for a, b in zip(values, value_differences)]
    vectors = SteeringVectors(keys=[k / len(prompts) for k in keys], values=[v / len(prompts) for v in values],
                              pairs=len(prompts), seconds=time.perf_counter() - started)
    with _vectors_lock:
        _vectors[key] = vectors
    return vectors, False


# --- the edit ---------------------------------------------------------------------------------


def steered_layers(num_layers: int, first_layer: int) -> list[int]:
    return list(range(first_layer, num_layers))


def steer(state: kv.KVState, vectors: SteeringVectors, layers: list[int], c_keys: float, c_values: float) -> list[dict]:
    """Add ``c_k K_l`` and ``c_v V_l`` to the cached key and value of the last cached position in
    ``layers`` (once, in a new cache: the old one is left as it was). Returns per-layer records."""
    edited, records = [], []
    for layer in range(kv.num_layers(state.cache)):
        keys, values = kv.layer_kv(state.cache, layer)
        key_norm, value_norm = float(keys[0, :, -1, :].float().norm()), float(values[0, :, -1, :].float().norm())
        steered = layer in layers
        key_edit = c_keys * vectors.keys[layer] if steered else torch.zeros_like(vectors.keys[layer])
        value_edit = c_values * vectors.values[layer] if steered else torch.zeros_like(vectors.values[layer])
        if steered:
            keys, values = keys.clone(), values.clone()
            keys[0, :, -1, :] += key_edit.to(keys.device, keys.dtype)
            values[0, :, -1, :] += value_edit.to(values.device, values.dtype)
        edited.append((keys, values))
        records.append({"layer": layer, "steered": steered, "key_edit_norm": float(key_edit.norm()),
                        "value_edit_norm": float(value_edit.norm()), "key_norm": key_norm, "value_norm": value_norm})
    state.cache = kv.from_tensors(edited)
    return records


@torch.no_grad()
def read_steered(receiver: LoadedModel, prompt_ids: list[int], vectors: SteeringVectors, values: dict) -> tuple[ReceiverPrompt, list[dict]]:
    """The receiver after its prompt, its cache edited once before the prompt's last token."""
    if len(prompt_ids) < 2:
        raise ValueError("KV steering edits the token before the prompt's last one; this prompt has one token.")
    state = kv.KVState()
    prefill(receiver, state, prompt_ids[:-1], need_logits=False)
    records = steer(state, vectors, steered_layers(receiver.facts.num_layers, values["first_layer"]),
                    values["keys"], values["values"])
    next_token, _ = prefill(receiver, state, prompt_ids[-1:])
    return ReceiverPrompt(model=receiver, state=state, next_token=next_token, last_token=prompt_ids[-1]), records


def _top_probabilities(model: LoadedModel, next_token: NextToken, count: int) -> tuple[torch.Tensor, list[dict]]:
    probabilities = torch.softmax(next_token.logits[0].float(), dim=-1)
    top = torch.topk(probabilities, count)
    return probabilities, [{"token": model.tokenizer.decode([int(i)]), "id": int(i), "probability": float(p)}
                           for p, i in zip(top.values, top.indices)]


# --- the handoff ------------------------------------------------------------------------------


def requirements(pair: LoadedPair, request: HandoffRequest) -> str | None:
    """The first steered layer must exist, and "my_pairs" needs readable pairs."""
    values = option_values(request, NAME, OPTIONS)
    num_layers = pair.receiver.facts.num_layers
    if values["first_layer"] >= num_layers:
        return f"KV steering's first layer {values['first_layer']} does not exist: {pair.receiver.name} has layers 0..{num_layers - 1}."
    try:
        demos_of(values)
    except ValueError as error:
        return str(error)
    return None


def run(pair: LoadedPair, request: HandoffRequest, io: HandoffIO) -> HandoffResult:
    values = option_values(request, NAME, OPTIONS)
    receiver = pair.receiver
    # one-off per receiver and pair set (cached), before the question is asked: not timed here
    vectors, cached = steering_vectors(receiver, demos_of(values))
    segments = build_segments(receiver.tokenizer, request.query)
    prompt_ids = segments.input_ids
    timer = StageTimer()
    with timer.stage("receiver_prefill"):
        prompt, layers = read_steered(receiver, prompt_ids, vectors, values)
    steered_probabilities, steered_top = _top_probabilities(receiver, prompt.next_token, TOP_TOKENS)
    with timer.stage("receiver_decode"):
        output = generate(receiver, prompt.state, prompt.next_token, request.generation, on_token=io.on_token, timer=timer)

    # instrumentation, after the answer and outside every stage: the receiver alone, unedited
    started = time.perf_counter()
    alone_state = kv.KVState()
    alone_first, _ = prefill(receiver, alone_state, prompt_ids)
    alone_probabilities, alone_top = _top_probabilities(receiver, alone_first, TOP_TOKENS)
    alone = generate(receiver, alone_state, alone_first, request.generation)
    kl = float(torch.sum(steered_probabilities * (torch.log(steered_probabilities.clamp_min(1e-30))
                                                  - torch.log(alone_probabilities.clamp_min(1e-30)))))
    instrumentation_seconds = time.perf_counter() - started

    prompt_length = len(prompt_ids)
    prompt_flops, receiver_flops = answer_flops(receiver.facts, prompt_length, len(output.token_ids))
    steered = [record["layer"] for record in layers if record["steered"]]
    return handoff_result(
        NAME, pair, output, timer,
        seen={"receiver": segments.text,
              "steering": f"its cache at the token before the last edited once in layers {steered[0]}-{steered[-1]}"
              if steered else "no layer edited"},
        flops={"receiver": receiver_flops},
        flops_to_first_token={"receiver": prompt_flops},
        tokens={"receiver_prompt": prompt_length},
        layers=layers,
        details={
            "pairs": values["pairs"],
            "c_keys": values["keys"],
            "c_values": values["values"],
            "first_layer": values["first_layer"],
            "steered_layers": steered,
            "vectors": {"pairs": vectors.pairs, "seconds": vectors.seconds, "cached": cached},
            "receiver_alone_answer": alone.text,
            "answer_changed": alone.token_ids != output.token_ids,
            "first_token_top": steered_top,
            "first_token_top_alone": alone_top,
            "first_token_kl": kl,
            "instrumentation_seconds": instrumentation_seconds,
        },
    )


# --- descriptor -------------------------------------------------------------------------------


def receiver_prompt(pair: LoadedPair, request: HandoffRequest, result: HandoffResult) -> ReceiverPrompt:
    """The receiver after its prompt with the one edit (the vectors come from the cache)."""
    values = option_values(request, NAME, OPTIONS)
    vectors, _ = steering_vectors(pair.receiver, demos_of(values))
    prompt_ids = build_segments(pair.receiver.tokenizer, request.query).input_ids
    return read_steered(pair.receiver, prompt_ids, vectors, values)[0]


def variant_label(values: dict) -> str:
    """Bench rows: "kv_steering-answer_briefly@4" (pair set @ c_v) ..."""
    return f"{NAME}-{values['pairs']}@{values['values']:g}"


HANDOFFS = (
    Handoff(
        name=NAME,
        title="KV steering: one edit, no sharer",
        label="KV steering",
        color=COLOR,
        summary="steering vectors from contrastive pairs are added once to the receiver's cache; no sharer runs",
        run=run,
        control="receiver",
        needs=(),
        applicable=requirements,
        options=OPTIONS,
        variant_label=variant_label,
        receiver_prompt=receiver_prompt,
    ),
)
