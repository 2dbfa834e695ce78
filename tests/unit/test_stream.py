"""The streaming runner behind the page: events in order, columns that cannot run answer at once."""

from __future__ import annotations

from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine import runner
from kvviz.engine.stream import ALL_AT_ONCE, stream_handoffs
from kvviz.handoffs.registry import request_with_options
from tests.conftest import tiny_pair


def test_handoffs_that_cannot_run_are_done_before_any_model_runs(monkeypatch):
    pair = tiny_pair("llama")
    monkeypatch.setattr(runner, "load_pair", lambda name, progress=None: pair)
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
    monkeypatch.setattr(runner, "load_pair", lambda name, progress=None: pair)
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

    from kvviz.engine import stream

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


def test_a_handoff_that_writes_a_message_streams_it_before_its_answer(monkeypatch):
    """Text and CIPHER send ``message`` events while the sharer writes: the last one is the message
    the result holds, and every one comes before the handoff's first answer token."""
    pair = tiny_pair("gemma")  # sharer and receiver share a tokenizer: CIPHER runs
    monkeypatch.setattr(runner, "load_pair", lambda name, progress=None: pair)
    request = request_with_options(HandoffRequest(
        query="What is the secret code word?", context="The secret code word is pineapple.",
        generation=GenerationSettings(max_new_tokens=3),
    ), {"text": {"message_tokens": 5}})  # CIPHER writes under the text handoff's bound
    events = list(stream_handoffs("tiny", request, ["text", "cipher", "receiver"], workers=1))
    for name in ("text", "cipher"):
        kinds = [kind for kind, who, _ in events if who == name]
        messages = [data for kind, who, data in events if who == name and kind == "message"]
        done = next(data for kind, who, data in events if who == name and kind == "done")
        assert done["applicable"], done["reason"]
        assert len(messages) == done["tokens"]["message"] > 0
        assert messages[-1].strip() == done["seen"]["message"].strip()
        if "token" in kinds:
            assert max(i for i, kind in enumerate(kinds) if kind == "message") < kinds.index("token")
    assert not [data for kind, who, data in events if who == "receiver" and kind == "message"]


def test_batches_hold_the_same_events_in_order_and_idle_batches_are_empty(monkeypatch):
    """``run_event_batches`` (what the page reads): the events of ``run_events`` grouped as they
    waited, each batch non-empty but for the idle ones asked for, every handoff's answer the same."""
    from kvviz.engine.stream import run_event_batches

    pair = tiny_pair("gemma")
    monkeypatch.setattr(runner, "load_pair", lambda name, progress=None: pair)
    request = HandoffRequest(
        query="What is the secret code word?", context="The secret code word is pineapple.",
        generation=GenerationSettings(max_new_tokens=6),
    )
    names = ["receiver", "text", "skyline"]
    batches = list(run_event_batches("tiny", request, names, ALL_AT_ONCE, idle=0.001))
    events = [event for batch in batches for event in batch]
    assert all(batch for batch in batches[:1]) and not [e for e in events if e[0] in ("end", "error")]
    done = {name: data["answer"] for kind, name, data in events if kind == "done"}
    alone = {name: data["answer"] for kind, name, data in stream_handoffs("tiny", request, names, 1) if kind == "done"}
    assert done == alone and sorted(done) == sorted(names)
    for name in names:  # each handoff's own events in order: start, then tokens, then done
        kinds = [kind for kind, who, _ in events if who == name]
        assert kinds[0] == "start" and kinds.index("done") == len(kinds) - 1 - kinds[::-1].index("done")
    without_idle = list(run_event_batches("tiny", request, names, ALL_AT_ONCE))
    assert all(without_idle)  # no empty batch unless asked for
