"""Answer metrics: SQuAD normalisation, token F1 (the KVComm paper's F1 > 0.5 match),
containment of a gold answer, the page's verdict on one answer (a gold answer stated, as a careful
reader marks it: markup and Unicode forms read through, a denied gold or one of several candidates
not counted). The intervals and tests over many answers are ``kvviz.data.stats``.

The benchmark's metrics (``token_f1``, ``f1_match``, ``contains_answer``) stay SQuAD's and the
KVComm paper's, so that their numbers compare with the papers' and with docs/RESULTS.md; only the
page's ``verdict`` reads an answer as a person does."""

from __future__ import annotations

import html
import re
import string
import unicodedata
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
VERDICT_METRIC = "the answer states a gold answer (not only denied, not one of several candidates)"

# --- the page's verdict: an answer read as a person reads it --------------------------------------

_STRUCK = re.compile(r"~~.*?~~|<(del|s|strike)\b[^>]*>.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_BLOCK_TAG = re.compile(r"</?(?:p|div|br|hr|li|ul|ol|tr|td|th|h[1-6]|table|blockquote|pre)\b[^<>]*>", re.IGNORECASE)
_SUPERSCRIPT_TAG = re.compile(r"<sup\b[^<>]*>", re.IGNORECASE)
_TAG = re.compile(r"</?[A-Za-z][^<>]*>")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_APOSTROPHES = "\u2019\u2018\u02bc"  # ’ ‘ ʼ (isn’t reads isnt)
# Where a clause ends: . ! ? ; : before a space or the end, a bracket opening after a space or closing
# before one, a new line.
_CLAUSE_END = re.compile(r"[.!?;:]+(?=\s|$)|(?:^|\s)[(\[]|[)\]](?=\s|$)|\n")
_COMMA = re.compile(r",\s+")
# A gold answer right after one of these (with at most two _BETWEEN words in between) is denied or
# set aside: "not Lisbon", "isn't 4471", "never been to Japan", "rather than X", "instead of X",
# "neither X nor Y", "older than X". "not only X" is no denial ("only" is no _BETWEEN word).
_DENIALS = frozenset("not never neither nor than instead isnt arent wasnt werent aint dont doesnt didnt cannot cant "
                     "wont wouldnt couldnt shouldnt hasnt havent hadnt".split())
_BETWEEN = frozenset("in at on of from to by for be been is was exactly really actually even quite".split())
_LONGEST_ITEM = 3  # words in an item of a list after its first (the first may be a whole clause ending in one)


def _is_letter_or_digit(ch: str) -> bool:
    """Not punctuation, a sign, an accent (a combining mark) or an invisible format character."""
    kind = unicodedata.category(ch)
    return kind[0] not in "PS" and kind not in ("Mn", "Cf")


def _fold(ch: str) -> str:
    """One character as plain ASCII where it has a plain form: compatibility forms (NFKD: ｌ, ﬁ, ①
    -> l, fi, 1; ½ -> 12, as SQuAD normalises 1/2) without accents (é -> e); a subscript joins its
    word (CO₂ -> CO2); a superscript is an exponent or a mark, set apart, and so is ``^`` (x² and
    x^2 -> "x 2"; 10² is not 102; Canberra¹ is Canberra); a sign (°, ℃, ™, €, ×) and other
    punctuation (“ ” « » – —) part words; an apostrophe (’) is dropped, as SQuAD drops "'"."""
    if ch.isascii():
        return " " if ch == "^" else ch
    if ch in _APOSTROPHES:
        return ""
    if unicodedata.category(ch)[0] in "PS":
        return " "
    plain = "".join(part for part in unicodedata.normalize("NFKD", ch) if part.isascii() or _is_letter_or_digit(part))
    return " " + plain if unicodedata.decomposition(ch).startswith("<super>") else plain


def plain_text(text: str) -> str:
    """Text as a reader sees it: HTML entities decoded; struck-out text (``~~X~~``, ``<del>``,
    ``<s>``) dropped; HTML tags removed (a block tag ends a line; ``CO<sub>2</sub>`` is CO2,
    ``x<sup>2</sup>`` is x²); LaTeX commands removed (``\\boxed{4471}`` is 4471); each character
    folded (``_fold``). Markdown emphasis and code ticks need nothing here: ``normalize_answer``
    drops ``*``, ``_`` and backticks."""
    text = _STRUCK.sub(" ", html.unescape(text or ""))
    text = _TAG.sub("", _SUPERSCRIPT_TAG.sub(" ", _BLOCK_TAG.sub("\n", text)))
    return "".join(_fold(ch) for ch in _LATEX_COMMAND.sub("", text))


def _find(words: list[str], gold: list[str]) -> list[int]:
    """Where the words ``gold`` start in ``words`` (whole words, as ``contains_answer`` matches)."""
    return [i for i in range(len(words) - len(gold) + 1) if words[i:i + len(gold)] == gold]


def _denied(words: list[str], start: int) -> bool:
    """The word before ``start`` (past at most two _BETWEEN words) is a denial."""
    before = start - 1
    while before >= 0 and start - before <= 2 and words[before] in _BETWEEN:
        before -= 1
    return before >= 0 and words[before] in _DENIALS


def _list_items(clause: str) -> list[list[str]]:
    """The items of a clause that lists candidates, each as words; [] when it lists none. A list:
    items joined by "or" ("A or B", "A, B or C"), or three or more joined by commas with "and" or
    "or" before the last ("A, B and C", "A, B, and C"); every item after the first has at most three
    words (the first may be a clause that ends in one: "It is A, B or C"). Two items joined by "and"
    alone are no list ("March and April", "Trinidad and Tobago"), nor is a comma without a last
    "and"/"or" ("Newport, New Hampshire": a place and where it is)."""
    parts = [part for part in (normalize_answer(p).split() for p in _COMMA.split(clause)) if part]
    items: list[list[str]] = []
    offered = closed = False
    for index, part in enumerate(parts):
        if index and part[0] in ("and", "or"):
            closed, offered, part = True, offered or part[0] == "or", part[1:]
        pieces: list[list[str]] = [[]]
        for word in part:
            if word == "or":
                pieces.append([])
            else:
                pieces[-1].append(word)
        offered = offered or len(pieces) > 1
        if index and index == len(parts) - 1 and len(pieces) == 1 and "and" in part:
            cut = len(part) - 1 - part[::-1].index("and")
            pieces, closed = [part[:cut], part[cut + 1:]], True
        items.extend(pieces)
    is_list = offered or (closed and len(items) >= 3)
    if not is_list or any(not item or len(item) > _LONGEST_ITEM for item in items[1:]):
        return []
    return items


def _is_item(items: list[list[str]], index: int, gold: list[str]) -> bool:
    """``items[index]`` is ``gold``: the first item may end in it ("It is A" in "It is A, B or C")."""
    return items[index][-len(gold):] == gold if index == 0 else items[index] == gold


def _one_of_several(items: list[list[str]], gold: list[str], golds: list[list[str]]) -> bool:
    """``gold`` is an item of the list beside an item that is no gold answer ("CO2 or carbon
    dioxide" gives one answer by two names)."""
    indices = range(len(items))
    return (any(_is_item(items, i, gold) for i in indices)
            and any(not any(_is_item(items, i, other) for other in golds) for i in indices))


def _states(text: str, gold: list[str], golds: list[list[str]]) -> bool:
    """The text states ``gold`` somewhere: an occurrence (whole words) that is neither denied nor
    one of several candidates in its clause. An occurrence across clauses ("U.S. Army") counts as stated."""
    clauses = _CLAUSE_END.split(text)
    words, clause_of = [], []
    for number, clause in enumerate(clauses):
        clause_words = normalize_answer(clause).split()
        words += clause_words
        clause_of += [number] * len(clause_words)
    for start in _find(words, gold):
        number = clause_of[start]
        if clause_of[start + len(gold) - 1] != number:
            return True
        first = clause_of.index(number)
        denied = _denied(words[first:start + 1], start - first)
        if not denied and not _one_of_several(_list_items(clauses[number]), gold, golds):
            return True
    return False


def verdict(prediction: str, answers: str | Sequence[str]) -> str | None:
    """The page's mark for one answer, as a careful reader marks it: "right" when it states a gold
    answer, "wrong" when it does not, "none" when the answer is empty; None when there is no gold
    answer to judge by.

    Read as a person reads it (``plain_text``): markup and LaTeX removed, Unicode folded (CO₂ is
    CO2, ｌ is l, é is e, x² is x^2), then SQuAD-normalised. A gold answer is *stated* where it
    appears as whole words (as ``contains_answer`` finds it) and is neither

    * denied: right after "not", "never", "isn't" (and the other "n't" words), "neither"/"nor",
      "rather than"/"than", "instead of", with at most two small words between ("not in Japan",
      "never been to Japan"): "Not Lisbon but Porto" and "It is not 4471." are wrong, "4471, not
      12" is right; nor
    * one of several candidates in a list of its clause (``_list_items``): "Lisbon or Porto",
      "Carbon dioxide, water, and oxygen" do not commit to the gold; "Newport, New Hampshire" and
      "March and April" are no lists.

    One stated occurrence is enough. Containment, not the benchmark's F1 > 0.5: a sentence that
    states the gold answer ("The code for locker 12 is 4471.", F1 0.25) is right for a learner.
    What it does not see (tests/data/verdict_labels.jsonl, ``python scripts/verdict_agreement.py``):
    another name for the gold ("USA" for United States, a full name), a yes or no said in other
    words, a denial after the gold ("Lisbon is not it"), an answer that repeats a question listing
    the candidates without "and"/"or", 10² read as 100.
    """
    golds = [plain for plain in (plain_text(gold) for gold in _as_answer_list(answers)) if normalize_answer(plain)]
    if not golds:
        return None
    text = plain_text(prediction)
    if not normalize_answer(text):
        return "none"
    gold_words = [normalize_answer(gold).split() for gold in golds]
    return "right" if any(_states(text, gold, gold_words) for gold in gold_words) else "wrong"
