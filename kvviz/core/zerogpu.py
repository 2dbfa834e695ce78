"""ZeroGPU: Hugging Face Spaces' shared GPUs, lent per call to functions decorated ``@spaces.GPU``.

On a ZeroGPU Space the ``spaces`` package is installed and its ``GPU`` decorator runs the
decorated function in a forked worker that holds a GPU for at most ``duration`` seconds; the
arguments and what it returns (or yields) are pickled across. kvviz keeps to its rules:

* the page's model work goes through one function, ``dispatch``, and one decorated worker: a page
  run (``kvviz.engine.stream.run``, its seconds ``kvviz.engine.stream.run_seconds``) and the sweep
  (``kvviz.app.sweep.page_sweep``, ``kvviz.app.sweep.sweep_seconds``) both call ``dispatch`` with the
  function to run and its duration estimate, so that ``available()`` is asked in one place;
* only plain data crosses: the function itself (by reference: a module-level function), its
  positional arguments (the request as a dict) and what it yields or returns (frozen events of
  strings and dicts, ``kvviz.engine.events``; a dict), never a cache, a model or a tensor; what
  only this process has (a stop flag, a progress bar, a loaded pair) is given as ``here`` and
  stays behind;
* models are moved to CUDA at start-up (``app.py`` loads the pair on the main thread, where the
  ``spaces`` package intercepts ``.to("cuda")``; kvviz.runtime.models picks CUDA and bfloat16 there).

Without the package (a laptop, a GPU server, the tests) nothing changes: ``available()`` is false
and ``dispatch`` runs the function here, with ``here`` too. Off ZeroGPU the decorator itself does
nothing, so a CPU Space that has the package runs the same code on its CPU. The repository's own
``spaces/`` folder (a README, no ``__init__.py``) imports as an empty namespace package when the
package is missing: only a module that has ``GPU`` counts.

This module is the probe: it imports no torch and nothing from kvviz. ``app.py`` imports it
first, so that ``spaces`` is imported before anything touches CUDA; the worker is decorated when
this module is imported (ZeroGPU registers its functions before the app starts).
"""

from __future__ import annotations

import importlib
import inspect
import os
from typing import Callable, Iterator

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


def _items(result) -> Iterator:
    """What a function gave, as items: each item a generator yields, else the one value returned."""
    if inspect.isgenerator(result):
        yield from result
    else:
        yield result


def _call(function: Callable, seconds: int, *args) -> Iterator:
    """``function(*args)``'s items (``_items``), in the GPU worker; ``seconds``: for the decorator."""
    yield from _items(function(*args))


def _decorated_worker() -> Callable[..., Iterator]:
    """``_call`` inside ``@spaces.GPU``, asking for the seconds it is given, where the package is
    installed; else ``_call`` itself."""
    spaces = spaces_module()
    if spaces is None:
        return _call
    return spaces.GPU(duration=lambda function, seconds, *args: seconds)(_call)


_worker = _decorated_worker()  # decorated once, at import (ZeroGPU registers its functions first)


def dispatch(function: Callable, seconds: Callable[..., int], *args, here: dict | None = None) -> Iterator:
    """Run ``function(*args)`` and yield what it yields (or, once, what it returns).

    Where the ``spaces`` package is installed, inside the GPU worker for ``seconds(*args)`` seconds
    (ZeroGPU's duration, within ``bounded_seconds``): ``function`` must be a module-level function,
    its arguments and what it gives plain data (see the module docstring), and ``here`` is left
    behind. Elsewhere ``function(*args, **here)`` runs in this process. Closing the generator
    closes the function's own generator (or, on a Space, the worker's stream)."""
    if available():
        yield from _worker(function, seconds(*args), *args)
    else:
        yield from _items(function(*args, **(here or {})))
