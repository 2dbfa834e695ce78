"""Shared fixtures: tiny models (no weights) and the real embedded pair; the test tiers.

A test's folder is its tier (README "Tests"): **unit** (``tests/unit/``: tiny models built from
configs, no server, no other process), **integration** (``tests/integration/``: a Gradio server, a
browser, other processes) and **real-model** (``tests/real_model/``: the embedded models, converted
in the kvviz cache). The folder sets the tier's marker, so ``-m integration`` and ``-m real_model``
select them (an integration test that also reads the real models says ``@pytest.mark.real_model``
too); both are ``slow``, so ``-m "not slow"`` is the unit tier and a bare ``python -m pytest`` runs
them all. A unit test marked with another tier's marker is refused at collection.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from pathlib import Path

# Tests never need the hub: fail fast instead of waiting on network retries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tests write fuser checkpoints into temporary folders: let fusers come from there (kvviz.core.policy).
os.environ.setdefault("KVVIZ_FUSER_DIRS", tempfile.gettempdir())

import pytest

from kvviz.handoffs.kvcomm.options import options_of
from kvviz.runtime.models import LoadedPair, PairSpec
from tests.tiny_models import tiny_gemma, tiny_llama

IN_CI = os.environ.get("CI", "").lower() == "true"


TESTS = Path(__file__).resolve().parent
REPO_ROOT = TESTS.parent
TIER_MARKERS = {"unit": None, "integration": "integration", "real_model": "real_model"}


def pytest_collection_modifyitems(config, items):
    """Each test gets its folder's tier marker, and ``slow`` unless it is a unit test."""
    for item in items:
        tier = Path(item.path).resolve().relative_to(TESTS).parts[0]
        if tier not in TIER_MARKERS:
            raise pytest.UsageError(f"{item.nodeid}: a test module sits in a tier folder ({', '.join(TIER_MARKERS)})")
        if TIER_MARKERS[tier]:
            item.add_marker(getattr(pytest.mark, TIER_MARKERS[tier]))
        elif item.get_closest_marker("integration") or item.get_closest_marker("real_model"):
            raise pytest.UsageError(f"{item.nodeid} is marked as a slower tier but sits in tests/unit/: move it to "
                                    "tests/integration/ or tests/real_model/")
        if item.get_closest_marker("integration") or item.get_closest_marker("real_model"):
            item.add_marker(pytest.mark.slow)


def embedded_models_missing(reason: str):
    """A real-model test without the embedded models: a failure in CI, a skip with the reason elsewhere."""
    if IN_CI:
        pytest.fail(f"CI needs the embedded models: {reason}")
    pytest.skip(reason)


def tiny_pair(kind: str) -> LoadedPair:
    """sharer and receiver of one tiny architecture (same weights: KVComm == Skyline exactly)."""
    model = tiny_llama() if kind == "llama" else tiny_gemma()
    spec = PairSpec(name=f"tiny-{kind}", sharer=model.name, receiver=model.name, description="tiny test pair")
    return LoadedPair(spec=spec, sharer=model, receiver=model, same_shape_sender=model)


def untrained_checkpoints(pair: LoadedPair, folder: Path, fuser_width: int | None = 8) -> dict:
    """An untrained C2C fuser pair (C2C and its control) and an untrained KV translator saved for
    ``pair`` under ``folder``; returns the handoff options that name them (every handoff then runs:
    their paths, not their quality)."""
    from kvviz.handoffs.c2c.fuser import new_fuser
    from kvviz.handoffs.translate.translator import new_translator

    width = {} if fuser_width is None else {"width": fuser_width}
    for kind in ("c2c", "control"):
        new_fuser(pair.sharer.facts, pair.receiver.facts, pair=pair.name, control=kind == "control", **width).save(folder / kind)
    new_translator(pair.sharer.facts, pair.receiver.facts, pair.name, pair.sharer.tokenizer, sharer_layers=[0, 1],
                   rank=4).save(folder / "translator")
    return {"c2c": {"fuser": str(folder / "c2c")}, "c2c_translate": {"translator": str(folder / "translator")}}


@pytest.fixture
def one_thread():
    """Run a test on one torch thread (tiny models run fastest so), then restore the count."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session", params=["llama", "gemma"])
def tiny(request) -> LoadedPair:
    return tiny_pair(request.param)


@pytest.fixture(scope="session")
def mixed_tiny_pair() -> LoadedPair:
    """Different architectures: KVComm must say it does not apply."""
    sharer, receiver = tiny_llama(), tiny_gemma()
    spec = PairSpec(name="tiny-mixed", sharer=sharer.name, receiver=receiver.name, description="tiny mixed pair")
    return LoadedPair(spec=spec, sharer=sharer, receiver=receiver, same_shape_sender=sharer)


@pytest.fixture(scope="session")
def embedded_pair() -> LoadedPair:
    """The real embedded pair (converted once into the kvviz cache directory)."""
    from kvviz.engine.runner import load_pair

    return load_pair("embedded", device="cpu")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data: required in CI, skipped with a reason elsewhere."""
    from kvviz.data import get_data_dir

    try:
        return get_data_dir()
    except FileNotFoundError as error:
        if IN_CI:
            pytest.fail(f"CI needs ../shared/data: {error}")
        pytest.skip(f"../shared/data is not here: {error}")


@contextlib.contextmanager
def served_on_loopback(demo):
    """Launch a Gradio demo on a free 127.0.0.1 port; yield its URL; close it afterwards."""
    from kvviz.app import ui

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **ui.launch_kwargs())
    try:
        yield demo.local_url.rstrip("/")
    finally:
        demo.close()


@pytest.fixture()
def tiny_engine(monkeypatch):
    """Point the engine's load_pair at the tiny gemma pair (for the bench and perf CLIs) and count
    handoff calls; one torch thread; runs computed in this process (``KVVIZ_RUN_PROCESSES=0``)."""
    import torch

    from kvviz.engine import runner

    pair = tiny_pair("gemma")
    monkeypatch.setattr(runner, "load_pair", lambda *a, **k: pair)
    calls = []
    real = runner.run_handoff

    def counting(name, loaded, request, on_token=None, on_message=None, run=None):
        calls.append((name, request.query, options_of(request).ratio, options_of(request).strategy))
        return real(name, loaded, request, on_token, on_message, run)

    monkeypatch.setattr(runner, "run_handoff", counting)
    monkeypatch.setenv("KVVIZ_RUN_PROCESSES", "0")  # the tiny pair lives in this process: no worker could load it
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only add overhead, badly so on a busy machine
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "ACCELERATE_PROCESS_INDEX", "ACCELERATE_NUM_PROCESSES"):
        monkeypatch.delenv(name, raising=False)
    yield pair, calls
    torch.set_num_threads(threads)
