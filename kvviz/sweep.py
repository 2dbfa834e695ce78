"""The page's sweep: one handoff's accuracy on the built-in set against one of its options.

A handoff declares the experiment in its descriptor (``Sweep``: which option is the x axis, which
one draws one line per value, which x values are the same for every line). The receiver-alone
floor and the Skyline ceiling (the registry's ``floor`` and ``ceiling`` roles) run once per
question as reference lines. Used by the page and by ``scripts/precompute_presets.py``.
"""

from __future__ import annotations

import time

from kvviz import engine, zerogpu
from kvviz.data import contains_answer
from kvviz.handoffs import registry
from kvviz.presets import SWEEP_ITEMS, SWEEP_METRIC
from kvviz.results import GenerationSettings, HandoffRequest


def default_handoff() -> registry.Handoff:
    handoffs = registry.with_sweep()
    if not handoffs:
        raise ValueError("No registered handoff declares a sweep.")
    return handoffs[0]


def run_sweep(pair, series=None, max_new_tokens: int = 12, items=None, progress=None, handoff: str | None = None) -> dict:
    """Accuracy against the sweep's x values for each chosen series value, with the references.

    ``pair`` is a pair name or a loaded pair; ``series`` the values of the series option to draw
    (default: the sweep's defaults); ``progress(fraction, desc=...)`` is called after every run.
    """
    swept = registry.get(handoff) if handoff else default_handoff()
    spec = swept.sweep
    items = list(items or SWEEP_ITEMS)
    allowed = list(spec.series_values)
    series = [value for value in (series or spec.series_default) if value in allowed] or [spec.series_default[0]]
    pair = pair if hasattr(pair, "receiver") else engine.load_pair(pair)
    generation = GenerationSettings(max_new_tokens=int(max_new_tokens))
    references = [h.name for h in registry.with_role("floor") + registry.with_role("ceiling")]
    shared = [x for x in spec.x_values if x in spec.shared_x]
    inner = [x for x in spec.x_values if x not in spec.shared_x]
    total = len(items) * (len(references) + len(shared) + len(inner) * len(series))
    done = 0
    started = time.perf_counter()

    def tick(description):
        nonlocal done
        done += 1
        if progress is not None:
            progress(done / total, desc=description)

    reference_correct = {name: 0 for name in references}
    correct: dict[tuple, int] = {}
    counts: dict[tuple, int] = {}
    answers = []
    for index, item in enumerate(items):
        base = HandoffRequest(query=item["query"], context=item["context"], generation=generation)
        for name in references:
            result = engine.run_handoff(name, pair, base)
            hit = result.applicable and contains_answer(result.answer, item["answers"])
            reference_correct[name] += int(hit)
            answers.append({"item": index, "handoff": name, "answer": result.answer, "correct": bool(hit)})
            tick(f"question {index + 1}/{len(items)}: {registry.label_of(name)}")
        for x in shared + inner:
            for value in series if x in inner else series[:1]:
                request = swept.with_options(base, {spec.x_option: x, spec.series_option: value})
                result = engine.run_handoff(swept.name, pair, request)
                hit = result.applicable and contains_answer(result.answer, item["answers"])
                for target in series if x in shared else [value]:
                    correct[(target, x)] = correct.get((target, x), 0) + int(hit)
                    if spec.count_detail:
                        counts[(target, x)] = int(result.details.get(spec.count_detail, 0))
                answers.append({"item": index, "handoff": swept.name, spec.series_option: value, spec.x_option: x,
                                "answer": result.answer, "correct": bool(hit)})
                tick(f"question {index + 1}/{len(items)}: {swept.label} {value}, {spec.x_option} {x:g}")
    n = len(items)
    points = []
    for value in series:
        for x in spec.x_values:
            point = {spec.series_option: value, spec.x_option: x}
            if spec.count_name:
                point[spec.count_name] = counts.get((value, x), 0)
            point.update(correct=correct.get((value, x), 0), n=n, accuracy=correct.get((value, x), 0) / n)
            points.append(point)
    return {
        "handoff": swept.name,
        "pair": pair.name,
        "n": n,
        "metric": SWEEP_METRIC,
        "max_new_tokens": int(max_new_tokens),
        "series": series,
        "points": points,
        "baselines": {name: count / n for name, count in reference_correct.items()},
        "answers": answers,
        "seconds": time.perf_counter() - started,
        "precomputed": False,
    }


# --- on a ZeroGPU Space: the sweep inside @spaces.GPU, a plain dict out ---------------------------


def sweep_seconds(pair_name: str, series: list[str], max_new_tokens: int, handoff: str) -> int:
    """GPU seconds for the page's sweep: every question at every x value for every series."""
    spec = registry.get(handoff).sweep
    runs = len(SWEEP_ITEMS) * len(spec.x_values) * max(1, len(series))
    return zerogpu.bounded_seconds(zerogpu.BASE_SECONDS + zerogpu.SECONDS_PER_TOKEN * runs * int(max_new_tokens))


def _sweep(pair_name: str, series: list[str], max_new_tokens: int, handoff: str) -> dict:
    """The page's sweep (``run_sweep``) as a plain dict (no progress bar across)."""
    return run_sweep(pair_name, series, int(max_new_tokens), handoff=handoff)


# Decorated once, at import (ZeroGPU registers its functions before the app starts).
gpu_sweep = zerogpu.on_gpu(_sweep, sweep_seconds)
