"""The decode batch (kvviz.batching) on a fake step: threads that join late, leave early or fail."""

from __future__ import annotations

import threading

import pytest
import torch

from kvviz.batching import ComputeGate, DecodeBatch, Sequence
from kvviz.cache import KVState


def counting_step(log):
    """A fake batched step: each state's position goes up by one; the hidden state of a row is its
    fed token; greedy choice: token + 1."""

    def step(states, tokens):
        log.append(len(states))
        for state in states:
            state.next_position += 1
        return torch.tensor(tokens, dtype=torch.float32)[:, None]

    return step, lambda hidden: [int(h) + 1 for h in hidden[:, 0]]


def decode(batch: DecodeBatch, first: int, steps: int, before_each=None, after_join=None) -> list[int]:
    sequence = Sequence(state=KVState())
    batch.join(sequence)
    tokens, token = [first], first
    try:
        if after_join:
            after_join()
        for _ in range(steps):
            if before_each:
                before_each()
            token = batch.step(sequence, token).token
            tokens.append(token)
    finally:
        batch.leave(sequence)
    return tokens


def run_threads(functions):
    results, errors = [None] * len(functions), []

    def run(index, function):
        try:
            results[index] = function()
        except BaseException as error:  # noqa: BLE001 - the test inspects it
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate(functions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), "a decode thread hung"
    return results, errors


def test_every_sequence_gets_its_own_tokens_and_steps_are_shared():
    log = []
    batch = DecodeBatch(*counting_step(log))
    start = threading.Barrier(3)
    results, errors = run_threads([lambda f=f, n=n: decode(batch, f, n, after_join=start.wait) for f, n in ((0, 5), (100, 3), (1000, 7))])
    assert not errors
    assert results == [list(range(0, 6)), list(range(100, 104)), list(range(1000, 1008))]
    assert sum(log) == 5 + 3 + 7  # every token fed exactly once
    assert log[:3] == [3, 3, 3]  # all three joined before the first step: they share it


def test_a_late_sequence_joins_and_an_early_one_does_not_hold_the_others():
    log = []
    batch = DecodeBatch(*counting_step(log))
    late = threading.Event()
    results, errors = run_threads([
        lambda: decode(batch, 0, 20, before_each=lambda: late.set()),
        lambda: (late.wait(5), decode(batch, 50, 2))[1],
    ])
    assert not errors
    assert results == [list(range(0, 21)), [50, 51, 52]]
    assert sum(log) == 22


def test_an_error_in_a_step_reaches_every_member_and_the_batch_recovers():
    calls = []

    def failing(states, tokens):
        calls.append(len(states))
        if len(calls) == 2:
            raise RuntimeError("step broke")
        return torch.tensor(tokens, dtype=torch.float32)[:, None]

    batch = DecodeBatch(failing, lambda hidden: [int(h) + 1 for h in hidden[:, 0]])
    start = threading.Barrier(2)
    _, errors = run_threads([lambda: decode(batch, 0, 4, after_join=start.wait), lambda: decode(batch, 10, 4, after_join=start.wait)])
    assert len(errors) == 2 and all("step broke" in str(e) for e in errors)
    assert decode(batch, 7, 2) == [7, 8, 9]  # nobody is left waiting in the batch


def test_a_callback_that_stops_its_sequence_leaves_the_others_running():
    class Stop(BaseException):
        pass

    log = []
    batch = DecodeBatch(*counting_step(log))
    start = threading.Barrier(2)
    count = {"n": 0}

    def stop_after_two():
        count["n"] += 1
        if count["n"] > 2:
            raise Stop()

    results, errors = run_threads([
        lambda: decode(batch, 0, 10, before_each=stop_after_two, after_join=start.wait),
        lambda: decode(batch, 100, 6, after_join=start.wait),
    ])
    assert [type(e) for e in errors] == [Stop]
    assert results[1] == list(range(100, 107))


def test_sampling_sequences_get_their_hidden_state_and_no_greedy_token():
    batch = DecodeBatch(*counting_step([]))
    sequence = Sequence(state=KVState(), greedy=False)
    batch.join(sequence)
    result = batch.step(sequence, 41)
    batch.leave(sequence)
    assert result.token is None and float(result.hidden[0, 0]) == 41


def test_the_gate_lets_prompts_go_first():
    gate = ComputeGate(1)
    order, inside = [], threading.Event()
    release = threading.Event()

    def hold():
        inside.set()
        release.wait(5)

    holder = threading.Thread(target=lambda: gate.run(hold, prompt=True))
    holder.start()
    inside.wait(5)
    step = threading.Thread(target=lambda: gate.run(lambda: order.append("step"), prompt=False))
    step.start()
    prompt = threading.Thread(target=lambda: gate.run(lambda: order.append("prompt"), prompt=True))
    prompt.start()
    for _ in range(100):  # both wait now
        if gate._waiting_prompts == 1:
            break
        threading.Event().wait(0.01)
    release.set()
    for thread in (holder, step, prompt):
        thread.join(5)
    assert order == ["prompt", "step"]


def test_the_gate_is_reentrant():
    gate = ComputeGate(1)
    assert gate.run(lambda: gate.run(lambda: 5, prompt=True), prompt=False) == 5


@pytest.mark.parametrize("permits", [1, 2])
def test_the_gate_admits_at_most_its_permits(permits):
    gate = ComputeGate(permits)
    active, peak, lock = [0], [0], threading.Lock()

    def work():
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        threading.Event().wait(0.02)
        with lock:
            active[0] -= 1

    run_threads([lambda p=p: gate.run(work, prompt=p) for p in (True, False, True, False, True)])
    assert peak[0] <= permits
