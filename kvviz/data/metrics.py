"""Answer metrics: SQuAD normalisation, token F1 (the KVComm paper's F1 > 0.5 match),
containment of a gold answer, the page's verdict on one answer, the Wilson interval for an
accuracy, and McNemar's exact test for two accuracies measured on the same samples (with the
paired comparison it reads from, and a p-value as a table prints it)."""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Sequence

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation and articles, squeeze whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD token F1 between two answers (after :func:`normalize_answer`).

    Tokens are counted as a multiset.  Two empty answers score 1.0; one empty
    answer scores 0.0.
    """
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _as_answer_list(answers: str | Sequence[str]) -> list[str]:
    return [answers] if isinstance(answers, str) else list(answers)


def f1_match(prediction: str, answers: str | Sequence[str], threshold: float = 0.5) -> bool:
    """KVComm's accuracy metric: max token F1 over the answers is *strictly* above threshold.

    Strictness matters: in Tip Sheets every option ends in "LLC", so naming a
    wrong company scores exactly 0.5 and must not count.
    """
    golds = _as_answer_list(answers)
    if not golds:
        return False
    return max(token_f1(prediction, g) for g in golds) > threshold


def contains_answer(prediction: str, answers: str | Sequence[str]) -> bool:
    """True if some normalised gold answer appears in the normalised prediction.

    Matched on whole tokens so that gold "no" is not found inside "not sure".
    Golds that normalise to nothing (e.g. "the") never match.
    """
    pred = f" {normalize_answer(prediction)} "
    for gold in _as_answer_list(answers):
        g = normalize_answer(gold)
        if g and f" {g} " in pred:
            return True
    return False


VERDICTS = ("right", "wrong", "none")
VERDICT_METRIC = "the answer contains a gold answer"


def verdict(prediction: str, answers: str | Sequence[str]) -> str | None:
    """The page's mark for one answer: "right" when it contains a gold answer (``contains_answer``,
    the sweep's metric), "wrong" when it does not, "none" when the answer is empty; None when there
    is no gold answer to judge by.

    Containment, not the benchmark's F1 > 0.5: a sentence that states the gold answer ("The code for
    locker 12 is 4471.", F1 0.25) is right for a learner. Its known weakness: an answer that lists
    several candidates ("Carbon dioxide, water, and oxygen") counts as right.
    """
    golds = [gold for gold in _as_answer_list(answers) if normalize_answer(gold)]
    if not golds:
        return None
    if not normalize_answer(prediction or ""):
        return "none"
    return "right" if contains_answer(prediction, golds) else "wrong"


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a proportion (z=1.96: 95%).

    Unlike the normal approximation it stays inside [0, 1] and is sensible at
    0/n and n/n.  With n == 0 nothing is known: (0.0, 1.0).
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    # Clamp floating-point dust (e.g. 1.0000000000000002 at n/n).
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def mcnemar_exact(only_first: int, only_second: int) -> float:
    """Two-sided exact McNemar p-value from the two discordant counts (samples only the first
    got right, samples only the second got right): under the null hypothesis that both are
    equally accurate each discordant sample is a fair coin, so
    p = min(1, 2 * P(Binomial(b + c, 1/2) <= min(b, c)))."""
    if only_first < 0 or only_second < 0:
        raise ValueError(f"discordant counts must be >= 0, got {only_first} and {only_second}")
    n = only_first + only_second
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(only_first, only_second) + 1)) / 2**n
    return min(1.0, 2 * tail)


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


def format_p(p: float) -> str:
    """A p-value for a table: two significant digits, or scientific notation below 0.001."""
    return f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"
