"""Which layers KVComm sends: the strategies, the attention importance and the calibration that
measures it, and each layer's record (the options that decide them: ``kvviz.handoffs.kvcomm.options``).

Every strategy is one small scorer over one shared step (kvpress style): ``select_layers`` takes
the layer budget M = ceil(r * L), puts layer 0 in the set by rule (``always_send_layer0``), and
asks the strategy's ``pick`` for the other M - 1 among the remaining layers. A scored strategy
ranks by ``score = alpha * minmax(attention importance) + (1 - alpha) * minmax(Gaussian prior)``
(``layer_scores``), its ``alpha`` fixed by the strategy or taken from the options:

==========  ======================  =============================================
strategy    alpha                   pick
==========  ======================  =============================================
kvcomm      the options' (1.0)      the top scores (the paper's selection)
attention   1 (importance only)     the top scores
prior       0 (the prior only)      the top scores
contiguous  the options' (1.0)      the best-scoring block of consecutive layers
random      no score                a seeded random draw
explicit    no score                the layers given (no budget, no rule)
==========  ======================  =============================================

Attention importance S_a(l): the receiver reads a question with the sender's KV of its context in
every layer; per layer, the mean over heads and query tokens of the attention mass on the context
keys, the sink excluded (``attention_importance``; measured on a calibration sample by
``calibrate``, cached per pair and sample).
"""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable

from kvviz.core.prompts import build_segments
from kvviz.handoffs.kvcomm.options import KVCommOptions
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import prefill
from kvviz.runtime.models import LoadedPair

# The built-in calibration sample, written for this project (one sample is enough: paper §5).
CALIBRATION_CONTEXT = "Mira keeps her red bicycle in the garden shed behind the old library in Lisbon."
CALIBRATION_QUERY = "Where does Mira keep her bicycle?"

# alpha as the paper gives it per model family (§4); the reference code defaults to 1.0.
PAPER_ALPHAS = {"llama": 1.0, "qwen2": 0.8, "qwen3": 0.8, "falcon": 0.8}
DEFAULT_ALPHA = 1.0


def minmax(values: list[float]) -> list[float]:
    """Scale to 0..1 over layers; all zeros when every value is equal (as the reference code)."""
    low, high = min(values), max(values)
    if high - low < 1e-12:
        return [0.0 for _ in values]
    return [(value - low) / (high - low) for value in values]


def gaussian_prior(num_layers: int, mu: float | None, sigma: float) -> list[float]:
    mu = (num_layers - 1) / 2 if mu is None else mu
    return [math.exp(-((layer - mu) ** 2) / (2 * sigma**2)) for layer in range(num_layers)]


def spearman(first: list[float], second: list[float]) -> float | None:
    """Spearman rank correlation (ties get their average rank); None when either is constant."""

    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda index: values[index])
        result = [0.0] * len(values)
        start = 0
        while start < len(order):
            end = start
            while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
                end += 1
            for position in range(start, end + 1):
                result[order[position]] = (start + end) / 2
            start = end + 1
        return result

    a, b = ranks(first), ranks(second)
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    covariance = sum((x - mean_a) * (y - mean_b) for x, y in zip(a, b))
    spread = math.sqrt(sum((x - mean_a) ** 2 for x in a) * sum((y - mean_b) ** 2 for y in b))
    return None if spread == 0 else covariance / spread


def layer_budget(ratio: float, num_layers: int) -> int:
    """M = ceil(r * L): how many layers a ratio sends."""
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"KVComm ratio must be between 0 and 1, got {ratio}")
    return min(num_layers, math.ceil(ratio * num_layers - 1e-9))


# --- the strategies: one small pick each over one shared step -------------------------------

# pick(scores, candidates, count, options) -> the chosen candidates (any order)
Pick = Callable[[list[float] | None, list[int], int, KVCommOptions], list[int]]


def top_scores(scores, candidates, count, options) -> list[int]:
    """The ``count`` best-scoring candidates (ties: the lower layer)."""
    return sorted(candidates, key=lambda layer: (-scores[layer], layer))[:count]


def best_block(scores, candidates, count, options) -> list[int]:
    """The best block of ``count`` consecutive candidates by total score."""
    start = max(
        range(len(candidates) - count + 1),
        key=lambda first: sum(scores[layer] for layer in candidates[first : first + count]),
    )
    return candidates[start : start + count]


def random_layers(scores, candidates, count, options) -> list[int]:
    """``count`` candidates drawn with the options' seed."""
    return random.Random(options.seed).sample(candidates, count)


@dataclass(frozen=True)
class Strategy:
    """How one strategy chooses: its alpha (None: the options'; ``scored=False``: no score at all),
    and its pick over the candidates. ``given``: the layers come from the options as they are."""

    pick: Pick | None
    alpha: float | None = None
    scored: bool = True
    given: bool = False


STRATEGIES: dict[str, Strategy] = {
    "kvcomm": Strategy(top_scores),
    "attention": Strategy(top_scores, alpha=1.0),
    "prior": Strategy(top_scores, alpha=0.0),
    "contiguous": Strategy(best_block),
    "random": Strategy(random_layers, scored=False),
    "explicit": Strategy(None, scored=False, given=True),
}


def resolve_alpha(options: KVCommOptions, model_type: str) -> tuple[float | None, str]:
    """(alpha, where it came from). None: the strategy ranks no scores (random, explicit)."""
    strategy = STRATEGIES[options.strategy]
    if not strategy.scored:
        return None, f"strategy {options.strategy}: no score"
    if strategy.alpha is not None:
        return strategy.alpha, f"strategy {options.strategy}"
    if options.alpha is None:
        return DEFAULT_ALPHA, "reference default"
    if options.alpha == "paper":
        if model_type in PAPER_ALPHAS:
            return PAPER_ALPHAS[model_type], f"paper ({model_type})"
        return DEFAULT_ALPHA, f"the paper gives no alpha for {model_type}: reference default"
    return float(options.alpha), "set"


def given_layers(options: KVCommOptions, num_layers: int) -> list[int]:
    """The explicit strategy's layers, checked against the receiver."""
    layers = sorted(set(options.layers or ()))
    bad = [layer for layer in layers if not 0 <= layer < num_layers]
    if bad:
        raise ValueError(f"Layers {bad} do not exist: the receiver has layers 0..{num_layers - 1}.")
    return layers


def select_layers(scores: list[float] | None, options: KVCommOptions, num_layers: int) -> list[int]:
    """The layers to send, sorted: the shared step (budget, layer 0 by rule, the candidates left)
    around the strategy's pick. ``scores``: the combined score per layer (None for random and
    explicit, which rank nothing)."""
    strategy = STRATEGIES[options.strategy]
    if strategy.given:
        return given_layers(options, num_layers)
    budget = layer_budget(options.ratio, num_layers)
    if budget == 0:
        return []
    forced = [0] if options.always_send_layer0 else []
    candidates = [layer for layer in range(num_layers) if layer not in forced]
    if strategy.scored and scores is None:
        raise ValueError(f"KVComm strategy '{options.strategy}' ranks layers by score; no scores were given.")
    return sorted(forced + strategy.pick(scores, candidates, budget - len(forced), options))


def forced_layers(options: KVCommOptions, selected: list[int]) -> list[int]:
    """Layers sent by rule rather than by score: layer 0 under ``always_send_layer0``."""
    if STRATEGIES[options.strategy].given or not options.always_send_layer0 or 0 not in selected:
        return []
    return [0]


# --- attention importance and calibration ----------------------------------------------------


def attention_importance(pair: LoadedPair, context_cache, query_ids: list[int]) -> list[float]:
    """S_a(l) per receiver layer: the receiver reads ``query_ids`` with the sender's context KV in
    every layer; mean over heads and query tokens of the attention mass on the context keys, the
    sink excluded (kvviz.runtime.attention's capture)."""
    num_layers = pair.receiver.facts.num_layers
    state = kv.splice_prefix(context_cache, num_layers, selected=set(range(num_layers)))
    _, plan = prefill(pair.receiver, state, query_ids, need_logits=False, capture=True)
    return [plan.captured_mass.get(layer, 0.0) for layer in range(num_layers)]


_calibration_cache: dict[tuple, dict] = {}
_calibration_lock = threading.Lock()


def calibrate(pair: LoadedPair, context: str, query: str) -> dict:
    """Attention importance per receiver layer on one sample; cached per pair and sample."""
    key = (pair.same_shape_sender.name, pair.receiver.name, context, query)
    with _calibration_lock:
        if key in _calibration_cache:
            return {**_calibration_cache[key], "cached": True}
    started = time.perf_counter()
    segments = build_segments(pair.receiver.tokenizer, query, context)
    sender_state = kv.KVState()
    prefill(pair.same_shape_sender, sender_state, segments.context_ids, need_logits=False)
    calibration = {
        "attention": attention_importance(pair, sender_state.cache, segments.query_ids),
        "context": context,
        "query": query,
        "seconds": time.perf_counter() - started,
    }
    with _calibration_lock:
        _calibration_cache[key] = calibration
    return {**calibration, "cached": False}


def calibration_texts(options: KVCommOptions) -> tuple[str, str]:
    """(context, question) of a built-in or given calibration sample."""
    if options.calibration == "sample":
        return options.calibration_sample
    return CALIBRATION_CONTEXT, CALIBRATION_QUERY


def layer_scores(calibration_attention: list[float] | None, alpha: float | None, options: KVCommOptions, num_layers: int) -> dict:
    """Normalised attention, prior and combined score per layer; None where the strategy used none."""
    if alpha is None:
        return {"attention_norm": None, "prior": None, "score": None}
    attention_norm = minmax(calibration_attention) if alpha > 0 else None
    prior = minmax(gaussian_prior(num_layers, options.mu, options.sigma))
    score = [
        (alpha * attention_norm[layer] if attention_norm is not None else 0.0) + (1 - alpha) * prior[layer]
        for layer in range(num_layers)
    ]
    return {"attention_norm": attention_norm, "prior": prior, "score": score}


def layer_records(
    num_layers: int,
    selected: list[int],
    forced: list[int],
    calibration_attention: list[float] | None,
    scores: dict,
    query_attention: list[float],
) -> list[dict]:
    """One record per receiver layer (fields in the module docstring); None where nothing was used."""

    def at(values: list[float] | None, layer: int) -> float | None:
        return None if values is None else values[layer]

    query_norm = minmax(query_attention)
    return [
        {
            "layer": layer,
            "sent": "context" if layer in selected else "sink",
            "selected": layer in selected,
            "forced": layer in forced,
            "calibration_attention": at(calibration_attention, layer),
            "calibration_attention_norm": at(scores["attention_norm"], layer),
            "query_attention": query_attention[layer],
            "query_attention_norm": query_norm[layer],
            "prior": at(scores["prior"], layer),
            "score": at(scores["score"], layer),
        }
        for layer in range(num_layers)
    ]
