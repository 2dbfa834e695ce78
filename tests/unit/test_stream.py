"""The streaming runner behind the page: events in order, columns that cannot run answer at once."""

from __future__ import annotations

from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine import runner
from kvviz.engine.events import Done, Failed, Message, Started, Token
from kvviz.engine.stream import ALL_AT_ONCE, run
from kvviz.handoffs.registry import request_with_options
from tests.conftest import tiny_pair


def flat_run(*args, **kwargs) -> list:
    """A run's events one by one (``run``'s batches flattened)."""
    return [event for batch in run(*args, **kwargs) for event in batch]


def of(name: str, events: list) -> list:
    """The events of one handoff, in order."""
    return [event for event in events if getattr(event, "handoff", None) == name]


def test_handoffs_that_cannot_run_are_done_before_any_model_runs(monkeypatch):
    pair = tiny_pair("llama")
    monkeypatch.setattr(runner, "load_pair", lambda name, progress=None: pair)
    # no context: Skyline and KVComm cannot run, the receiver can
    request = HandoffRequest(query="What is the secret code word?", generation=GenerationSettings(max_new_tokens=3))
    events = [(type(event), getattr(event, "handoff", None)) for event in flat_run("tiny", request, ["receiver", "skyline", "kvcomm"])]
    first_start = events.index((Started, "receiver"))
    assert (Done, "skyline") in events[:first_start] and (Done, "kvcomm") in events[:first_start]
    assert (Started, "skyline") not in events and (Started, "kvcomm") not in events
    assert events[-1] == (Done, "receiver")


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
        events = flat_run("tiny", request, names, workers)
        done = {event.handoff: event.result for event in events if isinstance(event, Done)}
        assert sorted(event.handoff for event in events if isinstance(event, Started)) == sorted(names)
        assert sorted(done) == sorted(names) and not [e for e in events if isinstance(e, Failed)]
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
    """Text and CIPHER send ``Message`` events while the sharer writes: the last one is the message
    the result holds, and every one comes before the handoff's first answer token."""
    pair = tiny_pair("gemma")  # sharer and receiver share a tokenizer: CIPHER runs
    monkeypatch.setattr(runner, "load_pair", lambda name, progress=None: pair)
    request = request_with_options(HandoffRequest(
        query="What is the secret code word?", context="The secret code word is pineapple.",
        generation=GenerationSettings(max_new_tokens=3),
    ), {"text": {"message_tokens": 5}})  # CIPHER writes under the text handoff's bound
    events = flat_run("tiny", request, ["text", "cipher", "receiver"], workers=1)
    for name in ("text", "cipher"):
        kinds = [type(event) for event in of(name, events)]
        messages = [event.text for event in of(name, events) if isinstance(event, Message)]
        done = next(event.result for event in of(name, events) if isinstance(event, Done))
        assert done["applicable"], done["reason"]
        assert len(messages) == done["tokens"]["message"] > 0
        assert messages[-1].strip() == done["seen"]["message"].strip()
        if Token in kinds:
            assert max(i for i, kind in enumerate(kinds) if kind is Message) < kinds.index(Token)
    assert not [event for event in of("receiver", events) if isinstance(event, Message)]


def test_batches_hold_the_same_events_in_order_and_idle_batches_are_empty(monkeypatch):
    """``run``'s batches (what the page reads): the run's events grouped as they waited, each batch
    non-empty but for the idle ones asked for, every handoff's answer the same."""
    pair = tiny_pair("gemma")
    monkeypatch.setattr(runner, "load_pair", lambda name, progress=None: pair)
    request = HandoffRequest(
        query="What is the secret code word?", context="The secret code word is pineapple.",
        generation=GenerationSettings(max_new_tokens=6),
    )
    names = ["receiver", "text", "skyline"]
    batches = list(run("tiny", request, names, ALL_AT_ONCE, idle=0.001))
    events = [event for batch in batches for event in batch]
    assert any(batches) and not [e for e in events if isinstance(e, Failed)]  # idle ones may come first: nothing loads
    done = {event.handoff: event.result["answer"] for event in events if isinstance(event, Done)}
    alone = {event.handoff: event.result["answer"] for event in flat_run("tiny", request, names, 1) if isinstance(event, Done)}
    assert done == alone and sorted(done) == sorted(names)
    for name in names:  # each handoff's own events in order: start, then tokens, then done
        kinds = [type(event) for event in of(name, events)]
        assert kinds[0] is Started and kinds.index(Done) == len(kinds) - 1 - kinds[::-1].index(Done)
    without_idle = list(run("tiny", request, names, ALL_AT_ONCE))
    assert all(without_idle)  # no empty batch unless asked for
