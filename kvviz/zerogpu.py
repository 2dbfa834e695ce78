"""ZeroGPU: Hugging Face Spaces' shared GPUs, lent per call to functions decorated ``@spaces.GPU``.

On a ZeroGPU Space the ``spaces`` package is installed and its ``GPU`` decorator runs the
decorated function in a forked worker that holds a GPU for at most ``duration`` seconds; the
arguments and what it returns (or yields) are pickled across. kvviz keeps to its rules:

* the page's model work (``kvviz.stream``'s handoff runs, the sweep) runs inside the decorated
  functions below, with a duration that fits the request (``run_seconds``, ``sweep_seconds``);
* only plain data crosses: the request as a dict in, events and results as dicts out, never a
  cache, a model or a tensor;
* models are moved to CUDA at start-up (``app.py`` loads the pair on the main thread, where the
  ``spaces`` package intercepts ``.to("cuda")``; kvviz.models picks CUDA and bfloat16 there).

Without the package (a laptop, a GPU server, the tests) nothing changes: ``available()`` is false
and the functions run as they are. Off ZeroGPU the decorator itself does nothing, so a CPU Space
that has the package runs the same code on its CPU. The repository's own ``spaces/`` folder (a
README, no ``__init__.py``) imports as an empty namespace package when the package is missing:
only a module that has ``GPU`` counts.

This module imports no torch: ``app.py`` imports it first, so that ``spaces`` is imported
before anything touches CUDA.
"""

from __future__ import annotations

import importlib
import os

# GPU seconds asked for one page run: a fixed part (the pair's first use in the worker, prompts,
# KVComm's calibration) plus a per-token part for every token a run may generate, within bounds.
# Estimates for models up to ~1B parameters on one GPU (not measured on a GPU in this repository).
BASE_SECONDS = 15
SECONDS_PER_TOKEN = 0.05
MIN_SECONDS = 20
MAX_SECONDS = 120  # ZeroGPU gives shorter requests priority in its queue: ask for what is needed


def spaces_module():
    """The ``spaces`` package when it offers the ``GPU`` decorator, else None."""
    try:
        spaces = importlib.import_module("spaces")
    except ImportError:
        return None
    return spaces if hasattr(spaces, "GPU") else None


def available() -> bool:
    """True where the ``spaces`` package is installed (on a Space): model work goes through it."""
    return spaces_module() is not None


def on_zerogpu() -> bool:
    """True on a ZeroGPU Space (the package is there and the platform says so)."""
    return available() and os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")


def _bounded(seconds: float) -> int:
    return int(min(MAX_SECONDS, max(MIN_SECONDS, round(seconds))))


def run_seconds(pair_name: str, request: dict, names: list[str], workers: int = 1, max_seconds: float | None = None) -> int:
    """GPU seconds for one page run: every handoff may write a message and an answer (counted one
    after another whatever ``workers`` is: on a GPU handoffs run one at a time)."""
    per_handoff = request["generation"]["max_new_tokens"] + request["text_message_tokens"]
    return _bounded(BASE_SECONDS + SECONDS_PER_TOKEN * per_handoff * len(names))


def sweep_seconds(pair_name: str, series: list[str], max_new_tokens: int, handoff: str) -> int:
    """GPU seconds for the page's sweep: every question at every x value for every series."""
    from kvviz.handoffs import registry
    from kvviz.presets import SWEEP_ITEMS

    spec = registry.get(handoff).sweep
    runs = len(SWEEP_ITEMS) * len(spec.x_values) * max(1, len(series))
    return _bounded(BASE_SECONDS + SECONDS_PER_TOKEN * runs * int(max_new_tokens))


# --- the model work, as plain data in and out -------------------------------------------------


def _run_events(pair_name: str, request: dict, names: list[str], workers: int = 1, max_seconds: float | None = None):
    """One page run's events (see ``kvviz.stream.stream_handoffs``), computed where this runs."""
    from kvviz.results import HandoffRequest
    from kvviz.stream import run_events

    yield from run_events(pair_name, HandoffRequest.from_dict(request), names, workers, max_seconds)


def _sweep(pair_name: str, series: list[str], max_new_tokens: int, handoff: str) -> dict:
    """The page's sweep (``kvviz.sweep.run_sweep``) as a plain dict (no progress bar across)."""
    from kvviz.sweep import run_sweep

    return run_sweep(pair_name, series, int(max_new_tokens), handoff=handoff)


def _on_gpu(function, duration):
    spaces = spaces_module()
    return function if spaces is None else spaces.GPU(duration=duration)(function)


# Decorated once, at import (ZeroGPU registers its functions before the app starts).
gpu_run_events = _on_gpu(_run_events, run_seconds)
gpu_sweep = _on_gpu(_sweep, sweep_seconds)
