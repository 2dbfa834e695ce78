"""Where kvviz runs for strangers: public mode, its caps, and which folders files may come from.

Public mode is on when ``KVVIZ_PUBLIC=1`` (``python app.py --public`` sets it) or on a Hugging Face
Space (``SPACE_ID`` is set). There, users choose only registered pairs (no typed model names,
local paths or hub ids), no custom fuser folders, and every run has smaller caps (``PUBLIC``).
Locally (``LOCAL``) the caps are what the models and one machine can take.

Fuser folders, in both modes, must lie (after following symlinks) inside an allowed root:
the project's shipped ``assets/fusers``, the kvviz cache folder's ``fusers``, the working
directory, or a folder named in ``KVVIZ_FUSER_DIRS`` (``os.pathsep``-separated). A symlink that
leads out of them is refused. Public mode allows the shipped fusers only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kvviz.core.paths import SHIPPED_FUSERS, cache_dir


def public_mode() -> bool:
    """True on a public server: ``KVVIZ_PUBLIC=1`` or a Hugging Face Space (``SPACE_ID``)."""
    return os.environ.get("KVVIZ_PUBLIC", "") == "1" or bool(os.environ.get("SPACE_ID"))


def set_public_mode() -> None:
    """Turn public mode on for this process (``app.py --public``)."""
    os.environ["KVVIZ_PUBLIC"] = "1"


@dataclass(frozen=True)
class Caps:
    """What one request may ask for, and how many may wait."""

    max_new_tokens: int  # answer length bound
    max_message_tokens: int  # message length bound of handoffs that write one
    max_prompt_tokens: int  # the longest prompt (template, context and question) any model reads
    max_run_seconds: float | None  # a live run stops at its next token after this; None: no limit
    queue_size: int  # requests waiting in the server's queue; one more is refused


LOCAL = Caps(max_new_tokens=1024, max_message_tokens=512, max_prompt_tokens=4096, max_run_seconds=None, queue_size=64)
# A shared public server: smaller answers and prompts; a run past max_run_seconds stops at its next token.
PUBLIC = Caps(max_new_tokens=64, max_message_tokens=64, max_prompt_tokens=1024, max_run_seconds=180.0, queue_size=16)


def caps() -> Caps:
    return PUBLIC if public_mode() else LOCAL


# How many runs the server lets onto the models at once (``KVVIZ_CONCURRENCY`` overrides). Runs on
# the models together share each model's decode steps (``kvviz.runtime.batching``: one pass of the
# weights for every sequence of every run), so a class with distinct questions gets its answers sooner
# with several at once: four distinct runs at once took 0.59x, eight 0.54x the time of running them
# one after another (``python research/runs_at_once.py``, docs/RESULTS.md "A class at once"), at
# 2.4x and 4.3x the time of one run. Four: most of the gain, and a long run holds one slot of four
# instead of the only one. Without shared decode steps (``KVVIZ_BATCHED_DECODE=0``) runs at once only
# compete for the CPU (docs/RESULTS.md "How many runs at once"): one. A pair whose model the shared
# step does not cover (``kvviz.runtime.step.DecodeStep.supported``) is in that case too: give it
# ``KVVIZ_CONCURRENCY=1``. Not measured on a GPU (four there too).
DEFAULT_CONCURRENCY = 4
DEFAULT_CONCURRENCY_UNSHARED = 1
# A server that computes its runs in worker processes (``kvviz.engine.run_processes``) lets this many runs a
# worker onto the models (``python app.py`` sets ``KVVIZ_CONCURRENCY`` to it times its workers, where not
# set). Thirty distinct questions through two workers (``scripts/load_test.py --class 30 --distinct
# --concurrency N``, 2026-12-07 00:20-00:33 UTC, docs/SPEED.md 13.9): 2 at once p95 29.0 s, 4 at once 26.6-27.0 s
# (three classes), 6 at once 22.9 and 26.8 s, 8 at once 22.7 s, the server's CPU falling from 66 to 53 s as more
# runs share each worker's decode steps.
RUNS_PER_WORKER_PROCESS = 4


def batched_decode_enabled() -> bool:
    """Whether the sequences decoding with one model share its decode steps (``kvviz.runtime.decode``):
    yes unless ``KVVIZ_BATCHED_DECODE=0``, which takes every decode token through the model's own
    forward, one sequence at a time."""
    return os.environ.get("KVVIZ_BATCHED_DECODE", "1") != "0"


# The numeric mode of the models' decoder stacks on the CPU (``kvviz.runtime.numerics``): "fp32", "bf16"
# (bfloat16 weights through oneDNN, where the CPU multiplies bfloat16 natively) or "auto" (bf16 where it
# pays, else fp32). ``KVVIZ_NUMERICS`` overrides. "auto" since issue 42's gates held (docs/RESULTS.md
# "Numeric mode bf16 against fp32"): every handoff's tokens the same alone and in any batch, accuracy
# and follow rates within fp32's paired intervals, and the stored presets computed in the mode they
# name (assets/precomputed/presets.json "numerics").
DEFAULT_NUMERICS = "auto"
NUMERICS_SETTINGS = ("auto", "fp32", "bf16")


def numerics_setting() -> str:
    """``KVVIZ_NUMERICS`` (auto, fp32 or bf16), else ``DEFAULT_NUMERICS``."""
    given = os.environ.get("KVVIZ_NUMERICS", "").strip().lower()
    if not given:
        return DEFAULT_NUMERICS
    if given not in NUMERICS_SETTINGS:
        raise ValueError(f"KVVIZ_NUMERICS must be one of {', '.join(NUMERICS_SETTINGS)}, got {given!r}.")
    return given


def run_processes_setting() -> int | None:
    """``KVVIZ_RUN_PROCESSES``: how many worker processes compute a served page's runs (0: the
    server's own process), or None where it is not set (``kvviz.engine.run_processes.default_count``
    chooses for the machine)."""
    return _not_negative("KVVIZ_RUN_PROCESSES", int, "a whole number of worker processes (0: none)")


def _not_negative(name: str, parse, what: str):
    """The setting ``name`` read with ``parse``, or None where it is not set; refused, saying ``what``
    it must be, where it does not read or is negative."""
    given = os.environ.get(name, "").strip()
    if not given:
        return None
    try:
        value = parse(given)
    except ValueError as error:
        raise ValueError(f"{name} must be {what}, got {given!r}.") from error
    if value < 0:
        raise ValueError(f"{name} must be 0 or more, got {given!r}.")
    return value


def model_concurrency() -> int:
    """Runs at once: ``KVVIZ_CONCURRENCY``, else ``DEFAULT_CONCURRENCY`` (``DEFAULT_CONCURRENCY_UNSHARED``
    without shared decode steps)."""
    given = os.environ.get("KVVIZ_CONCURRENCY", "").strip()
    if given:
        try:
            return max(1, int(given))
        except ValueError as error:
            raise ValueError(f"KVVIZ_CONCURRENCY must be a whole number of model runs, got {given!r}.") from error
    return DEFAULT_CONCURRENCY if batched_decode_enabled() else DEFAULT_CONCURRENCY_UNSHARED


DEFAULT_RUN_CACHE_MB = 256  # finished runs a server keeps for identical requests (a six-handoff run: ~2 MB)


def run_cache_bytes() -> int:
    """How many bytes of finished runs the server keeps (``kvviz.engine.shared_runs``):
    ``KVVIZ_RUN_CACHE_MB`` (0 keeps none; identical runs in flight are still computed once), else
    ``DEFAULT_RUN_CACHE_MB``."""
    megabytes = _not_negative("KVVIZ_RUN_CACHE_MB", float, "a number of megabytes (0 keeps no finished run)")
    return int((DEFAULT_RUN_CACHE_MB if megabytes is None else megabytes) * 1024 * 1024)


# How many live runs Gradio hands to the engine at once: the engine (kvviz.engine.shared_runs) computes
# identical ones once and lets ``model_concurrency()`` runs use the models, the others waiting in order and
# told their place; ``caps().queue_size`` may wait there, one more is refused. Each run handed over holds
# one of Gradio's 40 worker threads while it waits, so fewer than those; beyond it runs wait in Gradio's queue.
PAGE_RUNS_AT_ONCE = 32


@dataclass(frozen=True)
class WorkshopCaps:
    """What the workshop store takes (``kvviz.store``): classes, learners, predictions, saved runs; and
    what one client may ask of it (``kvviz.app.workshop.guard``)."""

    max_classes: int  # classes alive at once (expired ones do not count)
    max_learners: int  # learners in one class
    class_hours: float  # a class expires this long after it was made
    empty_class_hours: float  # ... or this long, while no learner has joined it
    idle_class_minutes: float  # a full server drops its oldest class with no learner, quiet this long, for a new one
    predictions_per_minute: int  # attempts from one learner's session; more get "wait a minute"
    max_saved_runs: int  # saved runs kept; one more is refused
    max_saved_run_bytes: int  # one saved run's page state and results, as JSON
    max_saved_bytes: int  # all saved runs together (when full, the oldest run pinned to no class goes first)
    saved_run_days: float  # a saved run is deleted this long after it was saved
    host_lease_seconds: float  # a host page holds its class this long after its last request
    creates_per_client: str  # classes one client may make (the ``limits`` package's notation)
    saves_per_client: str  # runs one client may save through the API, and again through the page's Save run


# One client (an address) makes at most 10 classes an hour, and an empty class goes after 2 hours: one
# client holds at most 20 of the 200 classes a server keeps; and when it is full, a new class takes the
# place of the oldest class that no learner joined and its host left quiet for 10 minutes.
LOCAL_WORKSHOP = WorkshopCaps(max_classes=200, max_learners=500, class_hours=24.0, empty_class_hours=2.0,
                              idle_class_minutes=10.0,
                              predictions_per_minute=30, max_saved_runs=10_000, max_saved_run_bytes=16_000_000,
                              max_saved_bytes=1_000_000_000, saved_run_days=30.0, host_lease_seconds=20.0,
                              creates_per_client="5/minute;10/hour", saves_per_client="30/minute;300/hour")
# A public Space: a few small classes, a day at most, saved runs without the attention arrays' bulk for a
# week; one client holds at most 3 of the 20 empty classes (3 an hour, empty ones gone after 1 hour).
PUBLIC_WORKSHOP = WorkshopCaps(max_classes=20, max_learners=60, class_hours=6.0, empty_class_hours=1.0,
                               idle_class_minutes=10.0,
                               predictions_per_minute=20, max_saved_runs=500, max_saved_run_bytes=2_000_000,
                               max_saved_bytes=200_000_000, saved_run_days=7.0, host_lease_seconds=20.0,
                               creates_per_client="2/minute;3/hour", saves_per_client="10/minute;60/hour")


def workshop_caps() -> WorkshopCaps:
    return PUBLIC_WORKSHOP if public_mode() else LOCAL_WORKSHOP


PUBLIC_PAIR_REFUSAL = (
    "This is a public server: choose one of the registered pairs ({pairs}). Typed model names, local "
    "folders and hub ids are turned off here; run kvviz on your own machine to use them."
)
PUBLIC_FUSER_REFUSAL = (
    "This is a public server: custom fuser folders are turned off; C2C uses the pair's shipped fuser."
)


def fuser_roots() -> list[Path]:
    """Folders a fuser checkpoint may come from (see the module docstring)."""
    if public_mode():
        return [SHIPPED_FUSERS]
    extra = [Path(p).expanduser() for p in os.environ.get("KVVIZ_FUSER_DIRS", "").split(os.pathsep) if p.strip()]
    return [SHIPPED_FUSERS, cache_dir() / "fusers", Path.cwd(), *extra]


def fuser_folder_refusal(folder: Path, files: tuple[str, ...] = ()) -> str | None:
    """Why a fuser folder may not be read (it, or one of its ``files``, resolves outside every
    allowed root, e.g. through a symlink), or None when it may."""
    roots = [root.resolve() for root in fuser_roots()]
    for path in (folder, *(folder / name for name in files)):
        real = path.resolve()
        if not any(real == root or real.is_relative_to(root) for root in roots):
            shown = f"{path} (which leads to {real})" if real != path.absolute() else str(path)
            return (
                f"The fuser file or folder {shown} is outside the folders fusers may come from: "
                + ", ".join(str(root) for root in roots)
                + ". Move it there"
                + ("" if public_mode() else ", or add its folder to KVVIZ_FUSER_DIRS")
                + "."
            )
    return None
