"""The page's sweep: one handoff's accuracy on the built-in set against one of its options.

A handoff declares the experiment in its descriptor (``Sweep``: which option is the x axis, which
one draws one line per value, which x values are the same for every line). The receiver-alone
floor and the Skyline ceiling (the registry's ``floor`` and ``ceiling`` roles) run once per
question as reference lines. Every run goes through the one evaluation loop (``kvviz.engine.evaluation``).
Used by the page and by ``scripts/precompute_presets.py``.
"""

from __future__ import annotations

import time

from kvviz.app.methods import registry as methods
from kvviz.app.methods.registry import MethodPage
from kvviz.app.presets import SWEEP_ITEMS, SWEEP_METRIC
from kvviz.core import zerogpu
from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.data import contains_answer
from kvviz.engine import runner
from kvviz.engine.evaluation import Variant, evaluate
from kvviz.handoffs import registry


def default_handoff() -> MethodPage:
    """The page entry of the first handoff whose page declares a sweep."""
    pages = methods.with_sweep()
    if not pages:
        raise ValueError("No handoff's page declares a sweep.")
    return pages[0]


def swept_page(handoff: str | None) -> MethodPage:
    """The page entry whose sweep runs: ``handoff``'s, or the default one."""
    page = methods.page_of(handoff) if handoff else default_handoff()
    if page is None or page.sweep is None:
        raise ValueError(f"The handoff {handoff!r} declares no sweep.")
    return page


def sweep_variants(swept: MethodPage, series: list, references: list[str]) -> list[Variant]:
    """The references, then the swept handoff at every x value for every series value (an x value
    shared by every series runs once, under the first series value)."""
    spec = swept.sweep
    variants = [Variant(name, name) for name in references]
    for x in [x for x in spec.x_values if x in spec.shared_x] + [x for x in spec.x_values if x not in spec.shared_x]:
        for value in series if x not in spec.shared_x else series[:1]:
            variants.append(Variant(f"{value}@{x:g}", swept.name, {spec.x_option: x, spec.series_option: value}))
    return variants


def run_sweep(pair, series=None, max_new_tokens: int = 12, items=None, progress=None, handoff: str | None = None) -> dict:
    """Accuracy against the sweep's x values for each chosen series value, with the references.

    ``pair`` is a pair name or a loaded pair; ``series`` the values of the series option to draw
    (default: the sweep's defaults); ``progress(fraction, desc=...)`` is called after every run.
    """
    swept = swept_page(handoff)
    spec = swept.sweep
    items = list(items or SWEEP_ITEMS)
    allowed = list(spec.series_values)
    series = [value for value in (series or spec.series_default) if value in allowed] or [spec.series_default[0]]
    pair = pair if hasattr(pair, "receiver") else runner.load_pair(pair)
    generation = GenerationSettings(max_new_tokens=int(max_new_tokens))
    references = [h.name for h in registry.with_role("floor") + registry.with_role("ceiling")]
    variants = sweep_variants(swept, series, references)
    started = time.perf_counter()

    def request_for(item, variant):
        base = HandoffRequest(query=item["query"], context=item["context"], generation=generation)
        return swept.handoff.with_options(base, variant.options) if variant.options else base

    reference_correct = {name: 0 for name in references}
    correct: dict[tuple, int] = {}
    counts: dict[tuple, int] = {}
    answers = []
    runs = evaluate(pair, enumerate(items), variants, request_for, record_id=lambda item: item["query"])
    for done, item in enumerate(runs, start=1):
        result, variant, index = item.result, item.variant, item.index
        hit = result.applicable and contains_answer(result.answer, item.record["answers"])
        if not variant.options:  # a reference line
            reference_correct[variant.handoff] += int(hit)
            answers.append({"item": index, "handoff": variant.handoff, "answer": result.answer, "correct": bool(hit)})
            description = f"question {index + 1}/{len(items)}: {registry.label_of(variant.handoff)}"
        else:
            x, value = variant.options[spec.x_option], variant.options[spec.series_option]
            for target in series if x in spec.shared_x else [value]:
                correct[(target, x)] = correct.get((target, x), 0) + int(hit)
                if spec.count_detail:
                    counts[(target, x)] = int(result.details.get(spec.count_detail, 0))
            answers.append({"item": index, "handoff": swept.name, spec.series_option: value, spec.x_option: x,
                            "answer": result.answer, "correct": bool(hit)})
            description = f"question {index + 1}/{len(items)}: {swept.handoff.label} {value}, {spec.x_option} {x:g}"
        if progress is not None:
            progress(done / (len(items) * len(variants)), desc=description)
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


# --- the page's sweep: on a ZeroGPU Space inside @spaces.GPU, a plain dict out --------------------


def page_sweep(pair_name: str, series: list[str] | None, max_new_tokens: int, handoff: str, progress=None) -> dict:
    """The page's sweep (``run_sweep``) through ``kvviz.core.zerogpu.dispatch``: on a Space inside
    ``@spaces.GPU`` for ``sweep_seconds``, without the progress bar (it cannot cross); here with it."""
    (data,) = zerogpu.dispatch(_sweep, sweep_seconds, pair_name, list(series or []), int(max_new_tokens), handoff,
                               here={"progress": progress})
    return data


def sweep_seconds(pair_name: str, series: list[str], max_new_tokens: int, handoff: str) -> int:
    """GPU seconds for the page's sweep: every question at every x value for every series."""
    spec = swept_page(handoff).sweep
    runs = len(SWEEP_ITEMS) * len(spec.x_values) * max(1, len(series))
    return zerogpu.bounded_seconds(zerogpu.BASE_SECONDS + zerogpu.SECONDS_PER_TOKEN * runs * int(max_new_tokens))


def _sweep(pair_name: str, series: list[str], max_new_tokens: int, handoff: str, progress=None) -> dict:
    """The page's sweep (``run_sweep``) where it runs, as a plain dict."""
    return run_sweep(pair_name, series, int(max_new_tokens), progress=progress, handoff=handoff)
