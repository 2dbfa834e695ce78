"""The inserted contradiction, run: every handoff again on the note with one contradicting sentence
(``kvviz.data.contradictions``), and per handoff the probability of the gold answer's and of the
counter answer's first content token, and which answer it gives.

The probabilities are the receiver's own, where it chooses the answer's first token that is not
whitespace (the last layer of the run's logit lens, ``kvviz.runtime.crossed``, which follows both
answers' first tokens when the request names them: ``inspect = {"gold": ..., "counter": ...}``). Each
result's ``contradiction`` (``contradiction_record``) holds:

  sentence, context, answers (the counter answers), changed   what was inserted, and where
  answer, answer_ids            what the handoff answered on the contradicted note
  outcome                       "gold" | "counter" | "both" | "neither" (``contradiction_outcome``)
  p_gold, p_counter             on the contradicted note (0 to 1; None where the handoff recorded no lens)
  gold_token, counter_token     the first tokens followed; same_first_token when they are one token
                                (then the two probabilities cannot tell the answers apart)
  p_gold_clean, p_counter_clean the same on the original note, where its run's lens followed the same
                                gold (and counter) answer through the same first token
  applicable, reason            as the handoff's result on the contradicted note

``results`` runs a set of handoffs on one request and its contradiction (``python -m kvviz run
--contradict``); ``contradicted_result`` one handoff on one record (the benchmark's arm, ``bench
--swap --contradict``). The page's *Insert a contradiction* (under *Swap the fact*) streams the same
two requests (``counter_lens_request``, ``contradicted_request``) through its live runs and reads them
with ``contradiction_record``.
"""

from __future__ import annotations

import dataclasses

from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.data.contradictions import Contradiction, contradiction_outcome
from kvviz.engine import runner, stream
from kvviz.runtime.models import LoadedPair


def lens_inspect(request: HandoffRequest, gold: list[str] | None, counter: tuple[str, ...] | list[str]) -> dict:
    """The request's ``inspect`` with the gold and counter answers the lens follows."""
    return {**(request.inspect or {}), "gold": (gold or [None])[0], "counter": (list(counter) or [None])[0]}


def counter_lens_request(request: HandoffRequest, contradiction: Contradiction, gold: list[str] | None) -> HandoffRequest:
    """The request on the original note, its logit lens (when it records one) following the counter
    answer too: the probabilities of both on the original note."""
    if request.inspect is None:
        return request
    return dataclasses.replace(request, inspect=lens_inspect(request, gold, contradiction.answers))


def contradicted_request(request: HandoffRequest, contradiction: Contradiction, gold: list[str] | None) -> HandoffRequest:
    """The request on the contradicted note, its logit lens following both answers' first tokens."""
    return dataclasses.replace(request, context=contradiction.context, inspect=lens_inspect(request, gold, contradiction.answers))


def _last(values) -> float | None:
    return float(values[-1]) if values else None


def _follows(clean: dict, lens: dict, name: str, answers) -> bool:
    """Whether the original note's lens (``clean``) followed the first of ``answers`` as its ``name``
    ("gold", "counter") through the same token as the contradicted note's ``lens``: a run made for
    another contradiction (or none) follows another counter, and a stored run recorded by other
    code may have followed another token of the same answer."""
    token = lens.get(f"{name}_token")
    return bool(answers) and bool(clean.get(name)) and clean.get(name) == list(answers)[0] and bool(token) and (
        clean.get(f"{name}_token") == token)


def contradiction_record(result: HandoffResult | dict, contradicted: HandoffResult | dict, contradiction: Contradiction,
                         gold: list[str] | None) -> dict:
    """What one handoff did on the contradicted note (the module docstring), from its result on the
    original note (``result``) and on the contradicted one."""
    original = result if isinstance(result, dict) else result.to_dict()
    other = contradicted if isinstance(contradicted, dict) else contradicted.to_dict()
    lens, clean = other.get("logit_lens") or {}, original.get("logit_lens") or {}
    record = {**contradiction.to_dict(), "answer": other.get("answer", ""), "answer_ids": list(other.get("answer_ids") or []),
              "applicable": bool(other.get("applicable", True)), "reason": other.get("reason", ""), "outcome": None,
              "p_gold": _last(lens.get("gold_probability")), "p_counter": _last(lens.get("counter_probability")),
              "gold_token": lens.get("gold_token"), "counter_token": lens.get("counter_token"),
              "same_first_token": bool(lens.get("gold_token")) and lens.get("gold_token") == lens.get("counter_token"),
              "p_gold_clean": _last(clean.get("gold_probability")) if _follows(clean, lens, "gold", gold) else None,
              "p_counter_clean": _last(clean.get("counter_probability"))
              if _follows(clean, lens, "counter", contradiction.answers) else None}
    if record["applicable"] and original.get("applicable", True) and gold:
        record["outcome"] = contradiction_outcome(record["answer"], gold, contradiction.answers)
    return record


def results(pair: LoadedPair, request: HandoffRequest, names, contradiction: Contradiction, gold: list[str] | None,
            swap=None) -> list[HandoffResult]:
    """The handoffs on ``request`` (and its swap, as ``stream.results`` runs it), then again on the
    contradicted note as a second run; each result's ``contradiction`` says what it did there. The
    original run's lens follows the counter answer too (its clean probabilities)."""
    first = stream.results(pair, counter_lens_request(request, contradiction, gold), names, swap=swap, gold=gold)
    second = stream.results(pair, contradicted_request(request, contradiction, gold), names)
    for result, other in zip(first, second):
        result.contradiction = contradiction_record(result, other, contradiction, gold)
    return first


def contradicted_result(name: str, pair: LoadedPair, request: HandoffRequest, contradiction: Contradiction,
                        gold: list[str] | None) -> HandoffResult:
    """One handoff on the contradicted note of ``request`` (a run of one)."""
    return runner.run_handoff(name, pair, contradicted_request(request, contradiction, gold))
