"""Each row of ``eval-translator`` on each held-out record: the receiver's state, its greedy answer and
the gold answer's NLL (nats per token, teacher-forced after the question).

Rows:

* ``receiver``: the receiver alone on the question;
* ``skyline``: the receiver reads the context itself; ``skyline_control``: Skyline reading another
  record's context (the control's note: what reading the wrong note does to a reader of text);
* ``oracle``: the receiver's own KV of the context in the translated slots (equals Skyline: a
  check of the splice);
* ``translator``: the sharer reads the context, the receiver reads the translated KV (spliced in
  front of its question, or through a side-memory translator's gated branch);
* ``control``: the translator fed another record's context (a seeded derangement,
  ``translator_sets.partners``);
* ``closed``: the translator with every gate closed (equals the receiver alone: a check);
* with swaps, Skyline and the translator also read each record's swapped note (``SWAP_ROWS``).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from kvviz.core.prompts import build_segments
from kvviz.core.results import GenerationSettings
from kvviz.data import contains_answer
from kvviz.data.swaps import replace_fact, swap_outcome
from kvviz.handoffs.translate import align as tr_align
from kvviz.handoffs.translate import prefix as tr_prefix
from kvviz.handoffs.translate import side
from kvviz.runtime import cache as kv
from kvviz.runtime.cache import KVState
from kvviz.runtime.decode import generate, prefill
from kvviz.studies.c2c.examples import response_ids
from kvviz.studies.c2c.translator_sets import partners, preset_records, set_swaps
from kvviz.studies.c2c.translator_summary import SWAP_ROWS, control_follows_other, people_summary, summarise, swap_summary

ROWS = ("receiver", "skyline", "skyline_control", "oracle", "translator", "control", "closed")
CHECKS = {"oracle": "skyline", "closed": "receiver"}  # rows that must equal another: run on the first records only


class Runner:
    """Builds each row's receiver state for a record and answers / scores from it."""

    def __init__(self, pair, translator, max_new_tokens: int = 12):
        self.pair, self.translator = pair, translator
        self.settings = GenerationSettings(max_new_tokens=max_new_tokens)

    def state(self, row: str, record, other=None):
        """(the receiver's state before the question, the question's tokens, a side memory or None)."""
        receiver, sharer = self.pair.receiver, self.pair.sharer
        context = other.context if row in ("control", "skyline_control") else record.context
        with_context = build_segments(receiver.tokenizer, record.question, context)
        if row in ("receiver", "skyline", "skyline_control"):
            segments = build_segments(receiver.tokenizer, record.question) if row == "receiver" else with_context
            state = KVState()
            prefill(receiver, state, segments.context_ids, need_logits=False)
            return state, segments.query_ids, None
        alignment = tr_align.align_context(receiver.tokenizer, sharer.tokenizer, context, self.translator.config.sharer_start)
        if row == "oracle":
            return tr_prefix.oracle_prefix(self.pair, alignment).state, with_context.query_ids, None
        gates = [0.0] * receiver.facts.num_layers if row == "closed" else None
        prefix, _, _ = tr_prefix.translate(self.pair, self.translator, alignment, gates=gates)
        return prefix.state, with_context.query_ids, prefix.memory

    @torch.no_grad()
    def answer(self, row: str, record, other=None) -> tuple[str, float, int]:
        """(greedy answer, summed gold NLL, gold tokens)."""
        receiver = self.pair.receiver
        state, query_ids, memory = self.state(row, record, other)
        scoring = KVState(cache=kv.copy_cache(state.cache), next_position=state.next_position,
                          prefix_positions=state.prefix_positions, prefix_bias=state.prefix_bias)
        gold = response_ids(receiver.tokenizer, record.answers[0], 16)
        with side.reading(receiver, memory):
            nll = float(tr_prefix.nll_after(receiver, scoring, query_ids, gold))
        if memory is not None:  # the batched decode step fires no hook: decode through the model's forward
            return side.greedy_answer(receiver, state, memory, query_ids, self.settings.max_new_tokens), nll, len(gold)
        first, _ = prefill(receiver, state, query_ids)
        output = generate(receiver, state, first, self.settings)
        return output.text, nll, len(gold)


def run_set(runner, name: str, records, rows, swaps: dict, seed: int, checks: int, progress):
    """(results per row, results per swap row (None where a record has no swap), check rows): each a
    list of (answer, summed gold NLL, gold tokens) per record."""
    partner = partners(records, seed)
    measured = [row for row in rows if row not in CHECKS]
    results = {row: [] for row in measured}
    swapped = {row: [] for row in SWAP_ROWS if row in measured} if swaps else {}
    checked = {row: [] for row in rows if row in CHECKS}
    started = time.perf_counter()
    for index, record in enumerate(records):
        for row in measured:
            results[row].append(runner.answer(row, record, records[partner[index]]))
        swap = swaps.get(record.id)
        for row in swapped:
            twin = dataclasses.replace(record, context=swap.context, answers=list(swap.answers)) if swap else None
            swapped[row].append(runner.answer(row, twin) if swap else None)
        if index < checks:
            for row in checked:
                checked[row].append(runner.answer(row, record))
        if (index + 1) % 10 == 0 or index + 1 == len(records):
            progress(f"{name}: {index + 1}/{len(records)} ({time.perf_counter() - started:.0f} s)")
    return results, swapped, checked


def check_summary(checked: dict, results: dict) -> dict:
    """Each check row (oracle, closed) against the row it must equal, on the records it ran."""
    return {
        row: {"records": len(got), "equals": CHECKS[row],
              "same_answers": sum(a[0] == b[0] for a, b in zip(got, results[CHECKS[row]])),
              "max_nll_difference": max((abs(a[1] - b[1]) for a, b in zip(got, results[CHECKS[row]])), default=None)}
        for row, got in checked.items() if CHECKS[row] in results and got
    }


def evaluate(pair, translator, sets: dict, rows=ROWS, seed: int = 0, max_new_tokens: int = 12, progress=print,
             examples: int = 6, checks: int = 10, swap: bool = True) -> dict:
    """Every row on every record, except the checks (``CHECKS``: oracle = Skyline, closed gates =
    receiver alone), which run on the first ``checks`` records and are compared with their twin;
    with ``swap``, the swap rows on each record's swapped note (sets with swapped facts)."""
    runner = Runner(pair, translator, max_new_tokens)
    report = {}
    for name, records in sets.items():
        swaps = set_swaps(name, records, seed) if swap else {}
        results, swapped, checked = run_set(runner, name, records, rows, swaps, seed, checks, progress)
        summary = summarise(results, records, seed)
        if (other := control_follows_other(results, records, partners(records, seed))) is not None:
            summary["control_other_note"] = other
        if swaps:
            summary["swap"] = swap_summary(results, swapped, records, swaps)
        if name == "whereabouts":
            summary["by_people"] = people_summary(results, records)
        summary["checks"] = check_summary(checked, results)
        # every record's answer per row: a later report of other rows on the same records is paired with these
        summary["answers"] = {"ids": [r.id for r in records], "golds": [list(r.answers) for r in records],
                              **{row: [result[0] for result in results[row]] for row in results}}
        if swaps:  # every record's answer on its swapped note (None: no swap), paired across reports
            summary["answers"]["swap_golds"] = [list(swaps[r.id].answers) if r.id in swaps else None for r in records]
            summary["answers"].update({f"{row}_swap": [result[0] if result else None for result in swapped[row]]
                                       for row in swapped})
        summary["examples"] = [
            {"context": r.context, "question": r.question, "gold": r.answers[0],
             **{row: results[row][i][0] for row in results},
             **({"swapped": swaps[r.id].changed, **{f"{row}_swap": swapped[row][i][0] for row in swapped}} if r.id in swaps else {})}
            for i, r in enumerate(records[:examples])
        ]
        report[name] = summary
    return report


def run_presets(pair, translator, presets=None, max_new_tokens: int = 12) -> list[dict]:
    """The page's private presets: each row's answer on the preset's note, the translator on another
    preset's note (its control: the next preset's) and Skyline and the translator on its stored swap."""
    runner = Runner(pair, translator, max_new_tokens)
    presets = preset_records() if presets is None else presets
    out = []
    for index, (record, swap) in enumerate(presets):
        other = presets[(index + 1) % len(presets)][0]
        entry = {"preset": record.meta.get("preset", record.id), "gold": record.answers, "other_note": other.context}
        for row in ("receiver", "skyline", "translator", "control"):
            text = runner.answer(row, record, other)[0]
            entry[row] = {"answer": text, "right": contains_answer(text, record.answers)}
        if swap:
            twin = dataclasses.replace(record, context=replace_fact(record.context, swap["replace"], swap["by"]),
                                       answers=list(swap["answers"]))
            for row in SWAP_ROWS:
                text = runner.answer(row, twin)[0]
                entry[f"{row}_swap"] = {"answer": text, "outcome": swap_outcome(text, record.answers, twin.answers)}
        out.append(entry)
    return out
