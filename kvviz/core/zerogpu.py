"""ZeroGPU: Hugging Face Spaces' shared GPUs, lent per call to functions decorated ``@spaces.GPU``.

On a ZeroGPU Space the ``spaces`` package is installed and its ``GPU`` decorator runs the
decorated function in a forked worker that holds a GPU for at most ``duration`` seconds; the
arguments and what it returns (or yields) are pickled across. kvviz keeps to its rules:

* the page's model work runs inside decorated functions, with a duration that fits the request:
  ``kvviz.engine.stream.gpu_run_events`` (a page run, ``kvviz.engine.stream.run_seconds``) and
  ``kvviz.app.sweep.gpu_sweep`` (the sweep, ``kvviz.app.sweep.sweep_seconds``), each decorated with
  ``on_gpu`` beside the function it runs;
* only plain data crosses: the request as a dict in, events and results as dicts out, never a
  cache, a model or a tensor;
* models are moved to CUDA at start-up (``app.py`` loads the pair on the main thread, where the
  ``spaces`` package intercepts ``.to("cuda")``; kvviz.runtime.models picks CUDA and bfloat16 there).

Without the package (a laptop, a GPU server, the tests) nothing changes: ``available()`` is false
and the functions run as they are. Off ZeroGPU the decorator itself does nothing, so a CPU Space
that has the package runs the same code on its CPU. The repository's own ``spaces/`` folder (a
README, no ``__init__.py``) imports as an empty namespace package when the package is missing:
only a module that has ``GPU`` counts.

This module is the probe: it imports no torch and nothing from kvviz. ``app.py`` imports it
first, so that ``spaces`` is imported before anything touches CUDA.
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


def bounded_seconds(seconds: float) -> int:
    """A GPU duration within ZeroGPU's bounds (whole seconds)."""
    return int(min(MAX_SECONDS, max(MIN_SECONDS, round(seconds))))


def on_gpu(function, duration):
    """``function`` inside ``@spaces.GPU(duration=duration)`` where the package is installed, else
    ``function`` itself. ``duration`` is called with the function's arguments. Decorate at import
    (ZeroGPU registers its functions before the app starts): ``kvviz.engine.stream`` and ``kvviz.app.sweep``
    do, beside the functions they decorate."""
    spaces = spaces_module()
    return function if spaces is None else spaces.GPU(duration=duration)(function)
