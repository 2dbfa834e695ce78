"""The communication measure: does the receiver do better because of *this* sharer input?

A fuser (or any channel into the receiver's cache) can lower the receiver's loss by adapting its
cache whatever the sharer read. The control that isolates communication: score the same held-out
examples with the sharer reading the right context, another example's context (a fixed, seeded
derangement of the examples), and with the sharer's KV zeroed. The **communication gain** is
NLL(other context) - NLL(right context) in nats per response token, with a seeded bootstrap 95%
interval over examples (``kvviz.data.stats``); a channel that ignores the sharer scores exactly 0.

``gain_report`` does the arithmetic from per-example (summed NLL, tokens) rows, whatever made
them; ``communication_measure`` is the C2C fuser's case (``kvviz.studies.c2c.scoring`` makes the rows).
"""

from __future__ import annotations

import random

from kvviz.data.stats import bootstrap_ratio
from kvviz.handoffs.c2c.align import align_prompt
from kvviz.handoffs.c2c.fusion import resampled, sharer_kv
from kvviz.studies.c2c.scoring import example_nlls

Rows = list[tuple[float, int]]  # (summed NLL, response tokens) per example


def derangement(n: int, seed: int = 0, same=None) -> list[int]:
    """partner[i] != i for every i: a seeded cycle over a shuffled order; ``same(i, j)`` skips
    partners whose context equals i's."""
    if n < 2:
        raise ValueError("the communication measure needs at least two held-out examples")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    partner = [0] * n
    for k, i in enumerate(order):
        for step in range(1, n):
            j = order[(k + step) % n]
            if same is None or not same(i, j):
                break
        partner[i] = j
    return partner


def gain_report(right: Rows, other: Rows, zero: Rows, seed: int = 0, resamples: int = 1000) -> dict:
    """NLL per token with each sharer input, and the gains over the right one with their intervals."""
    tokens = [n for _, n in right]
    total = max(sum(tokens), 1)

    def nll(rows):
        return sum(r[0] for r in rows) / total

    gain_diffs = [o[0] - r[0] for o, r in zip(other, right)]
    zero_diffs = [z[0] - r[0] for z, r in zip(zero, right)]
    return {
        "examples": len(right),
        "tokens": total,
        "nll": {"right": nll(right), "other": nll(other), "zero": nll(zero)},
        "gain": sum(gain_diffs) / total,
        "ci95": bootstrap_ratio(gain_diffs, tokens, seed, resamples),
        "zero_gain": sum(zero_diffs) / total,
        "zero_ci95": bootstrap_ratio(zero_diffs, tokens, seed, resamples),
    }


def other_sharer(pair, examples, private: bool, partner: list[int]):
    """For example i: the sharer's KV with another example's information (see the module doc)."""

    def sharer_for(i):
        other = examples[partner[i]]
        if private:  # the same query, another example's context
            alignment = align_prompt(
                pair.receiver.tokenizer, pair.sharer.tokenizer, examples[i].question, other.context, receiver_sees_context=False,
                token_alignment=examples[i].token_alignment, fuse_template=examples[i].fuse_template,
            )
            return sharer_kv(pair, alignment)
        return other_prompt_sharer(pair, examples[i].alignment, other.alignment)

    return sharer_for


def other_prompt_sharer(pair, alignment, other_alignment):
    """Shared input: the sharer's cache of another prompt, stretched to this prompt's fused tokens."""
    return resampled(sharer_kv(pair, other_alignment), alignment.num_fused)


def communication_measure(pair, fuser, examples, private: bool, seed: int = 0, resamples: int = 1000) -> dict:
    """A fuser's held-out NLL with the right context, another example's context and the sharer's
    KV zeroed; the communication gain NLL(other) - NLL(right) with a bootstrap 95% interval."""
    partner = derangement(len(examples), seed, same=lambda i, j: examples[i].context == examples[j].context)
    right = example_nlls(pair, fuser, examples)
    if fuser.config.control:
        # the control never runs the sharer: every sharer input gives the same cache
        other = zero = right
    else:
        other = example_nlls(pair, fuser, examples, other_sharer(pair, examples, private, partner))
        zero = example_nlls(pair, fuser, examples, lambda i: "zero")
    return {
        **gain_report(right, other, zero, seed, resamples),
        "other_context": "same query, another example's context" if private else "another example's sharer cache",
        "seed": seed,
        "resamples": resamples,
    }
