"""kvviz's statistics, one home, from ``scipy.stats``: every interval and paired test a table prints.

* ``wilson_interval``: a proportion's 95% Wilson score interval (``binomtest(...).proportion_ci``);
* ``mcnemar_exact``: two accuracies on the same samples, McNemar's exact test on the discordant
  counts (an exact binomial test at 1/2; the same test is the sign test of wins against losses);
  ``paired_mcnemar`` reads the counts from two variants' 0/1 scores;
* ``bootstrap_ratio``: a percentile bootstrap interval of sum(diffs) / sum(tokens) over examples
  resampled in pairs (``scipy.stats.bootstrap``, seeded): the communication gain per token;
* ``paired_comparison``: first - second over the same questions, its mean with that interval and,
  for 0/1 scores, McNemar's test;
* ``format_p``: a p-value as a table prints it.

The numbers equal the hand-written ones they replace on today's tables (``tests/unit/test_stats.py``
recomputes the tables' cells): Wilson's z is the exact normal quantile (1.95996 for 1.96: no printed
interval of n <= 200 moves, four cells of n = 9 and 51 in the third decimal), McNemar's p is the
same to 1e-15; a bootstrap interval is a Monte Carlo estimate (its seed is the table's seed).
"""

from __future__ import annotations

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95
RESAMPLES = 1000


def wilson_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval for a proportion (95% by default).

    Unlike the normal approximation it stays inside [0, 1] and is sensible at 0/n and n/n
    (exactly 0 and 1 there). With n == 0 nothing is known: (0.0, 1.0).
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    interval = sps.binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(interval.low), float(interval.high)


def mcnemar_exact(only_first: int, only_second: int) -> float:
    """Two-sided exact McNemar p-value from the two discordant counts (samples only the first got
    right, samples only the second got right): under the null hypothesis each discordant sample is a
    fair coin, an exact binomial test of ``min(b, c)`` of ``b + c`` at 1/2. Also the exact sign test
    of ``wins`` against ``losses`` (ties dropped)."""
    if only_first < 0 or only_second < 0:
        raise ValueError(f"discordant counts must be >= 0, got {only_first} and {only_second}")
    n = only_first + only_second
    if n == 0:
        return 1.0
    return float(sps.binomtest(min(only_first, only_second), n, 0.5, alternative="two-sided").pvalue)


def paired_mcnemar(correct: dict[str, dict[str, int]], first: str, second: str) -> dict:
    """Two variants compared on the samples both answered: ``correct`` maps a variant to
    ``{sample id: 0 or 1}``. Returns the shared sample count ``n``, each variant's accuracy on
    them (``acc_first``, ``acc_second``; nan when none is shared), the discordant counts
    (``only_first``, ``only_second``: samples only that variant got right) and McNemar's exact
    ``p`` (``mcnemar_exact``), with the two names (``first``, ``second``)."""
    shared = sorted(set(correct[first]) & set(correct[second]))
    only_first = sum(1 for s in shared if correct[first][s] and not correct[second][s])
    only_second = sum(1 for s in shared if correct[second][s] and not correct[first][s])
    n = len(shared)
    return {
        "first": first, "second": second, "n": n,
        "acc_first": sum(correct[first][s] for s in shared) / n if n else float("nan"),
        "acc_second": sum(correct[second][s] for s in shared) / n if n else float("nan"),
        "only_first": only_first, "only_second": only_second, "p": mcnemar_exact(only_first, only_second),
    }


def _ratio(diffs, tokens, axis=-1):
    return np.sum(diffs, axis=axis) / np.sum(tokens, axis=axis)


def bootstrap_ratio(diffs: list[float], tokens: list[int], seed: int = 0, resamples: int = RESAMPLES,
                    confidence: float = CONFIDENCE) -> list[float]:
    """Percentile bootstrap interval of sum(diffs) / sum(tokens) over examples resampled with
    replacement (each diff with its tokens), seeded. One example: its ratio, twice."""
    if len(diffs) != len(tokens) or not diffs:
        raise ValueError(f"a bootstrap needs equally long, non-empty lists ({len(diffs)} and {len(tokens)})")
    d, t = np.asarray(diffs, dtype=np.float64), np.asarray(tokens, dtype=np.float64)
    if len(d) == 1 or np.all(d / t == d[0] / t[0]):
        value = float(d.sum() / t.sum())
        return [value, value]
    result = sps.bootstrap((d, t), _ratio, paired=True, vectorized=True, n_resamples=resamples,
                           confidence_level=confidence, method="percentile", rng=np.random.default_rng(seed))
    return [float(result.confidence_interval.low), float(result.confidence_interval.high)]


def paired_comparison(first: list[float], second: list[float], seed: int = 0, resamples: int = RESAMPLES) -> dict:
    """first - second over the same questions (0/1 correct, or any per-question score): the mean
    difference with a seeded bootstrap 95% interval over questions, and for 0/1 values the
    discordant counts and McNemar's exact p."""
    if len(first) != len(second) or not first:
        raise ValueError(f"a paired comparison needs two equally long, non-empty lists ({len(first)} and {len(second)})")
    diffs = [a - b for a, b in zip(first, second)]
    out = {"n": len(diffs), "difference": sum(diffs) / len(diffs), "ci95": bootstrap_ratio(diffs, [1] * len(diffs), seed, resamples)}
    if all(value in (0, 1) for value in list(first) + list(second)):
        only_first = sum(1 for a, b in zip(first, second) if a and not b)
        only_second = sum(1 for a, b in zip(first, second) if b and not a)
        out.update(only_first=only_first, only_second=only_second, mcnemar_p=mcnemar_exact(only_first, only_second))
    return out


def format_p(p: float) -> str:
    """A p-value for a table: two significant digits, or scientific notation below 0.001."""
    return f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"
