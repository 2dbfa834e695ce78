"""KV steering's vectors and edit: contrastive prompt pairs (built in, or the user's), the steering
vectors (the mean difference of the receiver's cached keys and values at one token, per layer,
cached per model and pair set), and the one edit of a cache before the prompt's last token."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from kvviz.core import limits
from kvviz.core.prompts import answer_instruction, build_segments, user_message
from kvviz.handoffs.registry import ReceiverPrompt
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import NextToken, prefill
from kvviz.runtime.models import LoadedModel

PAIR_SETS = ("answer_briefly", "use_the_context", "my_pairs")


MAX_PAIRS = 16


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
