"""Shared runs (kvviz.engine.shared_runs): identical greedy requests computed once, with the same
events; sampling never shared; the cache bounded by bytes and cleared by a fingerprint change; a
failure said to every waiter and not kept; the models' queue telling its place. Fakes, no model."""

from __future__ import annotations

import threading
import time

from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine.events import Computation, Done, Failed, Shared, Started, Status, Token
from kvviz.engine.shared_runs import Finished, ModelGate, QueueFull, RunCache, SharedRuns


class FakeCompute:
    """A run as ``stream.run`` gives it: Started, two tokens, Done; it waits on ``release`` after
    the first token (so that a second request can arrive while it is in flight)."""

    def __init__(self, fail: str | None = None, raise_error: bool = False):
        self.calls = 0
        self.release = threading.Event()
        self.first_token = threading.Event()
        self.fail, self.raise_error = fail, raise_error

    def __call__(self, pair, request, names, workers, stop=None):
        self.calls += 1
        yield [Started("text")]
        yield [Token("text", f"answer to {request.query}")]
        self.first_token.set()
        self.release.wait(10)
        if self.raise_error:
            raise RuntimeError("the models went away")
        if self.fail:
            yield [Failed(self.fail)]
            return
        yield [Token("text", f"answer to {request.query}!"), Done("text", {"handoff": "text", "answer": request.query})]


def request(query="What is the code?", greedy=True):
    return HandoffRequest(query=query, context="The code is 4471.", generation=GenerationSettings(greedy=greedy))


def runs_with(compute, **kwargs):
    return SharedRuns(compute=compute, slots=1, max_waiting=8, fingerprint_of=kwargs.pop("fingerprint_of", lambda pair: "fp"),
                      **kwargs)


def collect(runs, asked, out: list, stop=None):
    for batch in runs.batches("embedded", asked, ["text"], 0, stop=stop):
        out.extend(batch)


def two_at_once(runs, compute, first_request, second_request):
    """Two requests, the second sent while the first is in flight: both event lists."""
    first, second = [], []
    one = threading.Thread(target=collect, args=(runs, first_request, first))
    one.start()
    assert compute.first_token.wait(10)
    two = threading.Thread(target=collect, args=(runs, second_request, second))
    two.start()
    while runs.summary()["joined"] + runs.summary()["computed"] < 2 and two.is_alive():
        two.join(0.01)
    compute.release.set()
    one.join(10)
    two.join(10)
    return first, second


def without(events, *kinds):
    return [event for event in events if not isinstance(event, kinds)]


def test_two_identical_requests_at_once_are_computed_once_and_get_the_same_events():
    compute = FakeCompute()
    runs = runs_with(compute)
    first, second = two_at_once(runs, compute, request(), request())
    assert compute.calls == 1
    assert runs.summary()["computed"] == 1 and runs.summary()["joined"] == 1
    # both name the one computation first (a page draws its figures once for both)
    assert isinstance(first[0], Computation) and first[0] == second[0]
    assert isinstance(second[1], Shared) and "another learner" in second[1].text
    assert not any(isinstance(event, Shared) for event in first)  # the one it was computed for is not told
    assert without(first, Status) == without(second, Status, Shared)
    assert Done("text", {"handoff": "text", "answer": "What is the code?"}) in first
    later = []
    collect(runs, request(), later)  # finished: from the cache, no computation
    assert compute.calls == 1 and runs.summary()["cached"] == 1
    assert later[0] == first[0]  # the same computation
    assert isinstance(later[1], Shared) and "ago on this server for another learner" in later[1].text
    assert later[2:] == without(first, Status, Computation)


def test_a_sampling_request_is_never_shared():
    compute = FakeCompute()
    runs = runs_with(compute)
    first, second = two_at_once(runs, compute, request(greedy=False), request(greedy=False))
    assert compute.calls == 2 and runs.summary()["joined"] == 0 and runs.summary()["not_shared"] == 2
    assert not any(isinstance(event, (Shared, Computation)) for event in first + second)  # each its own
    again = []
    collect(runs, request(greedy=False), again)
    assert compute.calls == 3 and runs.summary()["cached"] == 0 and len(runs.cache) == 0


def test_distinct_questions_are_computed_apart():
    compute = FakeCompute()
    runs = runs_with(compute)
    compute.release.set()
    a, b = [], []
    collect(runs, request("one?"), a)
    collect(runs, request("two?"), b)
    assert compute.calls == 2 and a != b and len(runs.cache) == 2
    assert isinstance(a[0], Computation) and isinstance(b[0], Computation) and a[0] != b[0]


def test_the_cache_drops_the_least_recently_used_runs_past_its_bytes():
    cache = RunCache(max_bytes=100)
    cache.put("a", Finished([], 40, 0.0, "run"))
    cache.put("b", Finished([], 40, 0.0, "run"))
    assert cache.get("a") is not None  # a is now the most recently used
    cache.put("c", Finished([], 40, 0.0, "run"))
    assert "b" not in cache and "a" in cache and "c" in cache and cache.nbytes == 80
    cache.put("huge", Finished([], 101, 0.0, "run"))
    assert "huge" not in cache and cache.nbytes == 80


def test_the_runs_cache_is_bounded_by_the_bytes_of_their_events():
    compute = FakeCompute()
    compute.release.set()
    runs = runs_with(compute)
    collect(runs, request("one?"), [])
    one_run = runs.cache.nbytes
    assert one_run > 0
    runs.cache.max_bytes = int(one_run * 1.5)
    collect(runs, request("two?"), [])
    assert len(runs.cache) == 1 and runs.cache.nbytes <= runs.cache.max_bytes
    collect(runs, request("two?"), [])
    assert compute.calls == 2  # the newest stayed
    collect(runs, request("one?"), [])
    assert compute.calls == 3  # the oldest went


def test_a_fingerprint_change_clears_the_cache():
    compute = FakeCompute()
    compute.release.set()
    printed = {"value": "fuser v1"}
    runs = runs_with(compute, fingerprint_of=lambda pair: printed["value"])
    collect(runs, request("one?"), [])
    collect(runs, request("two?"), [])
    assert len(runs.cache) == 2
    printed["value"] = "fuser v2 (retrained)"
    collect(runs, request("one?"), [])
    assert compute.calls == 3 and len(runs.cache) == 1  # the other question's run went too


def test_an_error_in_the_shared_computation_reaches_every_waiter_once_and_is_not_cached():
    for compute in (FakeCompute(fail="the pair could not load"), FakeCompute(raise_error=True)):
        runs = runs_with(compute)
        first, second = two_at_once(runs, compute, request(), request())
        for events in (first, second):
            failures = [event for event in events if isinstance(event, Failed)]
            assert len(failures) == 1 and failures[0].reason in ("the pair could not load",
                                                                  "RuntimeError: the models went away")
        assert compute.calls == 1 and len(runs.cache) == 0
        compute.release.set()
        collect(runs, request(), [])
        assert compute.calls == 2  # asked again: computed again


def test_a_learner_who_stops_leaves_the_run_to_the_others_and_the_last_one_stops_it():
    compute = FakeCompute()
    runs = runs_with(compute)
    stop_first = threading.Event()
    first, second = [], []
    one = threading.Thread(target=collect, args=(runs, request(), first, stop_first))
    one.start()
    assert compute.first_token.wait(10)
    two = threading.Thread(target=collect, args=(runs, request(), second))
    two.start()
    while runs.summary()["joined"] < 1:
        two.join(0.01)
    stop_first.set()
    one.join(10)
    compute.release.set()
    two.join(10)
    assert any(isinstance(event, Done) for event in second) and not any(isinstance(event, Done) for event in first)
    assert len(runs.cache) == 1


def test_many_readers_of_one_computation_get_fewer_batches_together_and_every_event(monkeypatch):
    """Each reader of a computation gets its batches spaced by how many read it (the server's event
    loop sends one update per batch): here 2 readers at 4 batches a second together, 0.5 s apart,
    so 40 tokens over about 1 s arrive in a handful of batches, every event there, in order."""
    from kvviz.engine import shared_runs

    monkeypatch.setattr(shared_runs, "BATCHES_PER_SECOND", 4.0)
    assert shared_runs.spacing(2) == 0.5 and shared_runs.spacing(0) == 0.25

    def tokens(pair, request, names, workers, stop=None):
        started.wait(10)
        for number in range(40):
            time.sleep(0.025)
            yield [Token("text", str(number))]
        yield [Done("text", {"handoff": "text", "answer": "39"})]

    started = threading.Event()
    runs = runs_with(tokens)
    batches = [[], []]

    def read(index):
        for batch in runs.batches("embedded", request(), ["text"], 0):
            batches[index].append(batch)

    readers = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for reader in readers:
        reader.start()
    while runs.summary()["joined"] < 1:
        time.sleep(0.01)
    began = time.monotonic()
    started.set()
    for reader in readers:
        reader.join(20)
    most = 3 + (time.monotonic() - began) / shared_runs.spacing(2)  # the first, one per spacing, the last
    for got in batches:
        events = [event for batch in got for event in batch if isinstance(event, Token)]
        assert [event.text for event in events] == [str(n) for n in range(40)]
        assert len(got) <= most < 20, (len(got), most)  # unspaced: a batch per token or so


def test_the_queue_tells_each_waiting_run_its_place_and_refuses_when_full():
    gate = ModelGate(slots=1, max_waiting=1)
    assert gate.wait_turn(threading.Event(), lambda line: None)  # the running one
    gate.run_seconds.append(10.0)
    heard: list[str] = []
    cancel = threading.Event()
    waiter = threading.Thread(target=lambda: heard.append(gate.wait_turn(cancel, heard.append)))
    waiter.start()
    while not heard:
        waiter.join(0.01)
    assert "number 1 in the queue" in heard[0] and "about 20 s" in heard[0]
    try:
        gate.wait_turn(threading.Event(), lambda line: None)
        raise AssertionError("a full queue took one more")
    except QueueFull as full:
        assert "Press Run again in a minute" in str(full)
    gate.release(10.0)
    waiter.join(10)
    assert heard[-1] is True


def test_the_pairs_fingerprint_is_stable_and_changes_when_a_fuser_file_does(tmp_path, monkeypatch):
    from kvviz.engine.shared_runs import fingerprint

    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    first = fingerprint("embedded")
    assert fingerprint("embedded") == first
    (tmp_path / "fusers").mkdir()
    (tmp_path / "fusers" / "fuser.safetensors").write_bytes(b"retrained")
    assert fingerprint("embedded") != first
