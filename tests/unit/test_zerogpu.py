"""ZeroGPU: with the ``spaces`` package the page's model work (a run, the sweep) goes through one
``@spaces.GPU`` worker (``zerogpu.dispatch``) with a duration fitted to the request and only plain
data across; without it nothing changes.

The package is not installed here: a stand-in module plays it. Its decorator records the duration
it was asked for and does what ZeroGPU does to the data: it pickles the arguments on the way in
and every yielded or returned value on the way out (a forked worker in between).
"""

from __future__ import annotations

import dataclasses
import importlib
import pickle
import sys
import threading
import types

import pytest
import torch

from kvviz.app import sweep
from kvviz.core import zerogpu
from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine import runner, stream
from kvviz.engine.events import Done
from tests.conftest import tiny_pair


def plain(value) -> bool:
    """Only built-in data (or a frozen event of it, ``kvviz.engine.events``): no tensor, model or
    cache anywhere inside."""
    if isinstance(value, (str, int, float, bool, type(None))):
        return True
    if dataclasses.is_dataclass(value) and type(value).__module__ == "kvviz.engine.events":
        return type(value).__dataclass_params__.frozen and plain(dataclasses.asdict(value))
    if isinstance(value, (list, tuple)):
        return all(plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain(v) for k, v in value.items())
    return False


def standin_spaces() -> types.ModuleType:
    """A ``spaces`` module whose GPU decorator crosses a pickle boundary, as ZeroGPU's does."""
    module = types.ModuleType("spaces")
    module.calls = []

    def GPU(task=None, *, duration=60):
        def decorate(function):
            def wrapper(*args):
                seconds = duration(*args) if callable(duration) else duration
                args = pickle.loads(pickle.dumps(args))
                module.calls.append({"function": function.__name__, "seconds": seconds, "args": args})
                result = function(*args)
                if isinstance(result, types.GeneratorType):
                    return (pickle.loads(pickle.dumps(item)) for item in result)
                return pickle.loads(pickle.dumps(result))

            return wrapper

        return decorate if task is None else decorate(task)

    module.GPU = GPU
    return module


def reload_gpu_entry_points() -> None:
    """The module that decorates its GPU worker at import (kvviz.core.zerogpu)."""
    importlib.reload(zerogpu)


@pytest.fixture()
def with_spaces(monkeypatch):
    """The GPU entry points re-imported with the stand-in package installed; restored afterwards."""
    standin = standin_spaces()
    monkeypatch.setitem(sys.modules, "spaces", standin)
    reload_gpu_entry_points()
    yield standin
    monkeypatch.delitem(sys.modules, "spaces")
    reload_gpu_entry_points()


def request(max_new_tokens=3, message_tokens=4) -> HandoffRequest:
    return HandoffRequest(query="What is the secret code word?", context="The secret code word is pineapple.",
                          generation=GenerationSettings(max_new_tokens=max_new_tokens), options={"text": {"message_tokens": message_tokens}})


NAMES = ["receiver", "text", "kvcomm", "skyline"]


def events(monkeypatch, **kwargs):
    pair = tiny_pair("gemma")
    monkeypatch.setattr(runner, "load_pair", lambda name, progress=None: pair)
    return [event for batch in stream.run("tiny", request(), NAMES, **kwargs) for event in batch]


def done(events) -> dict[str, dict]:
    return {event.handoff: event.result for event in events if isinstance(event, Done)}


def test_without_the_package_nothing_changes(monkeypatch, one_thread):
    assert sys.modules.get("spaces") is None or not hasattr(sys.modules["spaces"], "GPU")
    assert not zerogpu.available() and not zerogpu.on_zerogpu()
    # undecorated, and neither the run nor the sweep goes through it
    assert zerogpu._worker is zerogpu._call
    monkeypatch.setattr(zerogpu, "_worker", lambda *a: pytest.fail("went through the GPU worker"))
    assert list(done(events(monkeypatch))) == NAMES
    # what only this process has is given here (a stop flag, a progress bar)
    stop, seen = threading.Event(), []
    assert list(done(events(monkeypatch, stop=stop))) == NAMES
    monkeypatch.setattr(sweep, "run_sweep", lambda pair, series, tokens, progress=None, handoff=None: seen.append(progress) or {})
    assert sweep.page_sweep("embedded", None, 12, "kvcomm", progress=print) == {} and seen == [print]


def test_the_repository_spaces_folder_does_not_count(monkeypatch, tmp_path):
    """A `spaces/` folder without __init__.py imports as an empty namespace package."""
    (tmp_path / "spaces").mkdir()
    (tmp_path / "spaces" / "README.md").write_text("not a package")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "spaces", raising=False)
    assert importlib.import_module("spaces").__path__  # it does import ...
    assert zerogpu.spaces_module() is None  # ... but has no GPU
    monkeypatch.delitem(sys.modules, "spaces")


def test_with_the_package_the_run_crosses_as_plain_data(with_spaces, monkeypatch, one_thread):
    seen = events(monkeypatch, stop=threading.Event())  # the stop flag stays behind
    (call,) = with_spaces.calls
    assert call["function"] == "_call"
    function, seconds, pair_name, sent, names, workers, max_seconds = call["args"]
    assert function is stream._run  # one worker for every function; this one crossed by reference
    assert pair_name == "tiny" and names == NAMES and workers == 1 and plain(sent) and sent == request().to_dict()
    assert max_seconds is None  # the time cap crosses too (None: the policy's cap, applied inside)
    # the duration was computed from this request: tokens x handoffs
    assert call["seconds"] == seconds == stream.run_seconds("tiny", request().to_dict(), NAMES, 1)
    # every event came back through pickle, as plain data, and the run is complete
    assert all(plain(event) for event in seen), [e for e in seen if not plain(e)][:1]
    results = done(seen)
    assert list(results) == NAMES
    assert results["receiver"]["answer_ids"] and results["kvcomm"]["applicable"]


def test_the_same_answers_with_and_without_the_package(monkeypatch, one_thread):
    without = {name: data["answer_ids"] for name, data in done(events(monkeypatch)).items()}
    standin = standin_spaces()
    monkeypatch.setitem(sys.modules, "spaces", standin)
    reload_gpu_entry_points()
    try:
        with_package = {name: data["answer_ids"] for name, data in done(events(monkeypatch)).items()}
    finally:
        monkeypatch.delitem(sys.modules, "spaces")
        reload_gpu_entry_points()
    assert with_package == without and len(standin.calls) == 1


def test_duration_fits_the_request_within_bounds():
    def seconds(max_new_tokens, message_tokens, handoffs, name="text"):
        return stream.run_seconds("p", request(max_new_tokens, message_tokens).to_dict(), [name] * handoffs)

    assert seconds(1, 1, 1) == zerogpu.MIN_SECONDS
    assert seconds(1024, 512, 9) == zerogpu.MAX_SECONDS
    middle = seconds(100, 64, 5)  # a handoff that writes a message first counts it (Handoff.message_tokens)
    assert middle == round(zerogpu.BASE_SECONDS + zerogpu.SECONDS_PER_TOKEN * (100 + 64) * 5)
    assert seconds(100, 64, 5, "receiver") == round(zerogpu.BASE_SECONDS + zerogpu.SECONDS_PER_TOKEN * 100 * 5)
    assert zerogpu.MIN_SECONDS < middle < zerogpu.MAX_SECONDS
    assert seconds(100, 64, 5) < seconds(200, 64, 5) and seconds(100, 64, 2) < seconds(100, 64, 5)
    assert zerogpu.MIN_SECONDS <= sweep.sweep_seconds("p", ["kvcomm"], 12, "kvcomm") <= zerogpu.MAX_SECONDS


def test_the_sweep_runs_inside_the_same_gpu_worker_and_returns_plain_data(with_spaces, monkeypatch):
    def run_sweep(pair, series, tokens, progress=None, handoff=None):
        assert progress is None  # the progress bar stays behind
        return {"pair": pair, "points": [[0.5, 1.0]]}

    monkeypatch.setattr(sweep, "run_sweep", run_sweep)
    data = sweep.page_sweep("embedded", ["kvcomm"], 12, "kvcomm", progress=print)
    (call,) = with_spaces.calls
    assert call["function"] == "_call" and call["args"][0] is sweep._sweep
    assert call["seconds"] == sweep.sweep_seconds("embedded", ["kvcomm"], 12, "kvcomm")
    assert data == {"pair": "embedded", "points": [[0.5, 1.0]]} and plain(data)


def test_on_zerogpu_models_default_to_cuda_bfloat16_without_asking_cuda(with_spaces, monkeypatch):
    from kvviz.runtime import models

    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert zerogpu.on_zerogpu()
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a: pytest.fail("asked CUDA in the main process"))
    assert models.default_dtype("cuda") == torch.bfloat16
    monkeypatch.setenv("SPACES_ZERO_GPU", "false")
    assert not zerogpu.on_zerogpu()  # a CPU Space has the package too: nothing moves to CUDA there


def test_app_loads_the_models_on_the_main_thread_on_zerogpu(with_spaces, monkeypatch):
    """ZeroGPU intercepts `.to("cuda")` on the main thread only: the preload must run there, before launch.
    Each run goes to a GPU worker of its own there, so the server lets one at a time onto the models, and
    computes none in worker processes of its own (they would each hold the models)."""
    import app
    from kvviz.app import ui
    from kvviz.core import policy

    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setenv("KVVIZ_CONCURRENCY", "")  # restored after the test: app.main sets it
    monkeypatch.delenv("KVVIZ_CONCURRENCY")
    order = []
    monkeypatch.setattr(app, "_preload", lambda pair: order.append(("preload", pair, threading.current_thread() is threading.main_thread())))

    class Demo:
        def launch(self, **kwargs):
            order.append(("launch",))

    def build_demo(default_pair, compute):
        order.append(("runs computed", "in this process" if compute is None else "in worker processes"))
        return Demo()

    monkeypatch.setattr(ui, "build_demo", build_demo)
    monkeypatch.setattr(stream, "use_one_thread_per_handoff", lambda: None)  # no thread change for the session
    app.main(["--pair", "embedded-gemma"])
    assert order == [("runs computed", "in this process"), ("preload", "embedded-gemma", True), ("launch",)]
    assert policy.model_concurrency() == 1
