"""kvviz.data.stats, the statistics home from scipy.stats: it prints today's tables as the hand-written
statistics it replaced printed them (every Wilson cell and every McNemar p of docs/RESULTS.md and
docs/C2C.md recomputed from its counts), and its bootstrap is a seeded percentile interval."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from kvviz.core.paths import PROJECT_ROOT as ROOT
from kvviz.data.stats import bootstrap_ratio, format_p, mcnemar_exact, paired_comparison, paired_mcnemar, wilson_interval

DOCS = [ROOT / "docs" / "RESULTS.md", ROOT / "docs" / "C2C.md"]
# "0.10 [0.06, 0.17] (10/100)" (the content tables) and "24/120 [0.14, 0.28]" (the translator's)
RATE_CELL = re.compile(r"(\d\.\d\d) \[(\d\.\d\d), (\d\.\d\d)\] \((\d+)/(\d+)\)")
COUNT_CELL = re.compile(r"(\d+)/(\d+) \[(\d\.\d\d), (\d\.\d\d)\]")
# the KVComm pair tables: | A | B | n | acc A | acc B | A - B | only A right | only B right | McNemar exact p |
MCNEMAR_ROW = re.compile(r"^\| [^|]+ \| [^|]+ \| \d+ \| [\d.]+ \| [\d.]+ \| [-+\d.]+ \| (\d+) \| (\d+) \| ([\d.e+-]+) \|$")


def hand_wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The interval as the hand-written function gave it (z = 1.96), to compare with on printed cells."""
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (0.0 if successes == 0 else max(0.0, centre - half), 1.0 if successes == n else min(1.0, centre + half))


def cells():
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in RATE_CELL.finditer(text):
            yield path.name, int(match[4]), int(match[5]), (match[2], match[3])
        for match in COUNT_CELL.finditer(text):
            yield path.name, int(match[1]), int(match[2]), (match[3], match[4])


def test_every_wilson_cell_of_todays_tables_prints_the_same():
    checked = 0
    for name, hits, n, printed in cells():
        low, high = wilson_interval(hits, n)
        assert (f"{low:.2f}", f"{high:.2f}") == printed, f"{name}: {hits}/{n} printed {printed}, scipy gives {low:.2f}, {high:.2f}"
        checked += 1
    assert checked > 200  # the content tables and the translator's (235 today)


def test_every_mcnemar_p_of_todays_tables_prints_the_same():
    rows = [MCNEMAR_ROW.match(line) for line in (ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8").splitlines()]
    rows = [row for row in rows if row]
    assert len(rows) >= 10
    for row in rows:
        assert format_p(mcnemar_exact(int(row[1]), int(row[2]))) == row[3]


def test_wilson_and_mcnemar_agree_with_the_formulas_they_replaced():
    for n in [*range(1, 41), 80, 88, 100, 120]:  # the tables' sizes
        for successes in range(n + 1):
            assert wilson_interval(successes, n) == pytest.approx(hand_wilson(successes, n), abs=2e-5)
    for b in range(25):
        for c in range(25):
            exact = min(1.0, 2 * sum(math.comb(b + c, k) for k in range(min(b, c) + 1)) / 2 ** (b + c)) if b + c else 1.0
            assert mcnemar_exact(b, c) == pytest.approx(exact, abs=1e-12)
    assert wilson_interval(0, 0) == (0.0, 1.0) and wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    with pytest.raises(ValueError):
        wilson_interval(11, 10)
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def test_the_bootstrap_is_seeded_and_covers_the_ratio():
    rng = np.random.default_rng(3)
    diffs = rng.normal(1.0, 2.0, 80).tolist()
    tokens = rng.integers(1, 6, 80).tolist()
    low, high = bootstrap_ratio(diffs, tokens, seed=7)
    assert bootstrap_ratio(diffs, tokens, seed=7) == [low, high] and bootstrap_ratio(diffs, tokens, seed=8) != [low, high]
    ratio = sum(diffs) / sum(tokens)
    assert low < ratio < high
    # a ratio of sums resampled in pairs: its spread is the delta method's, about
    se = np.std(np.asarray(diffs) - ratio * np.asarray(tokens)) / np.mean(tokens) / math.sqrt(80)
    assert (high - low) == pytest.approx(2 * 1.96 * se, rel=0.2)
    assert bootstrap_ratio([1.0, 1.0], [2, 2]) == [0.5, 0.5]


def test_paired_comparisons_read_their_counts():
    compared = paired_comparison([1, 1, 0, 1, 0], [0, 1, 0, 0, 0], resamples=200)
    assert compared["difference"] == pytest.approx(0.4) and (compared["only_first"], compared["only_second"]) == (2, 0)
    assert compared["mcnemar_p"] == pytest.approx(0.5)
    assert "mcnemar_p" not in paired_comparison([0.5, -0.25], [0.25, -0.5], resamples=200)
    paired = paired_mcnemar({"a": {"s1": 1, "s2": 0, "s3": 1}, "b": {"s1": 0, "s2": 1, "s3": 1}}, "a", "b")
    assert (paired["n"], paired["only_first"], paired["only_second"], paired["p"]) == (3, 1, 1, 1.0)
    assert format_p(0.00042) == "4.2e-04" and format_p(0.0421) == "0.042"
