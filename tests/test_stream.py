"""The streaming runner behind the page: events in order, columns that cannot run answer at once."""

from __future__ import annotations

from kvviz import engine
from kvviz.results import GenerationSettings, HandoffRequest
from kvviz.stream import ALL_AT_ONCE, stream_handoffs
from tests.conftest import tiny_pair


def test_handoffs_that_cannot_run_are_done_before_any_model_runs(monkeypatch):
    pair = tiny_pair("llama")
    monkeypatch.setattr(engine, "load_pair", lambda name, progress=None: pair)
    # no context: Skyline and KVComm cannot run, the receiver can
    request = HandoffRequest(query="What is the secret code word?", generation=GenerationSettings(max_new_tokens=3))
    events = [(kind, name) for kind, name, _ in stream_handoffs("tiny", request, ["receiver", "skyline", "kvcomm"])]
    first_start = events.index(("start", "receiver"))
    assert ("done", "skyline") in events[:first_start] and ("done", "kvcomm") in events[:first_start]
    assert ("start", "skyline") not in events and ("start", "kvcomm") not in events
    assert events[-1] == ("done", "receiver")


def test_side_by_side_runs_give_the_answers_of_one_at_a_time(monkeypatch):
    """Two workers, or all at once, share the models: every handoff's greedy answer equals the
    sequential one, and every handoff starts and finishes exactly once."""
    pair = tiny_pair("gemma")
    monkeypatch.setattr(engine, "load_pair", lambda name, progress=None: pair)
    request = HandoffRequest(
        query="What is the secret code word?", context="The secret code word is pineapple.",
        generation=GenerationSettings(max_new_tokens=6),
    )
    names = ["receiver", "text", "kvcomm", "skyline"]

    def answers(workers):
        events = list(stream_handoffs("tiny", request, names, workers))
        done = {name: data for kind, name, data in events if kind == "done"}
        assert sorted(name for kind, name, _ in events if kind == "start") == sorted(names)
        assert sorted(done) == sorted(names) and not [e for e in events if e[0] == "error"]
        return {name: (data["answer"], data["answer_ids"]) for name, data in done.items()}

    assert answers(2) == answers(1)
    assert answers(ALL_AT_ONCE) == answers(1)  # all at once, decode steps shared per model


def test_the_serving_default_is_one_thread_per_handoff_on_a_cpu(monkeypatch):
    import torch

    from kvviz import stream

    threads = torch.get_num_threads()
    try:
        monkeypatch.delenv("KVVIZ_THREADS", raising=False)
        monkeypatch.delenv("KVVIZ_WORKERS", raising=False)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        stream.use_one_thread_per_handoff()
        assert torch.get_num_threads() == 1
        # decode steps shared per model: every handoff of a run at once
        assert stream.default_workers() == stream.ALL_AT_ONCE
        monkeypatch.setenv("KVVIZ_BATCHED_DECODE", "0")
        assert stream.default_workers() == min(2, __import__("os").cpu_count())
        monkeypatch.setenv("KVVIZ_WORKERS", "3")
        assert stream.default_workers() == 3
    finally:
        torch.set_num_threads(threads)
