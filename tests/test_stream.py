"""The streaming runner behind the page: events in order, columns that cannot run answer at once."""

from __future__ import annotations

from kvviz import engine
from kvviz.results import GenerationSettings, HandoffRequest
from kvviz.stream import stream_handoffs
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
