"""The shared decode: the batch (kvviz.runtime.batching) on a fake step (threads that join late, leave early
or fail), the batched step (kvviz.runtime.step) on tiny models, and every handoff decoding in a shared batch
with the tokens it gets alone."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from kvviz.engine.runner import RunContext, run_handoff
from kvviz.handoffs import registry
from kvviz.runtime import cache as kv
from kvviz.runtime import batching
from kvviz.runtime import decode as decoding
from kvviz.runtime.batching import DecodeBatch, Sequence
from kvviz.runtime.cache import KVState
from kvviz.runtime.step import DecodeStep, row_floor
from tests.conftest import tiny_pair, untrained_checkpoints


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


QUERY, CONTEXT = "Where does Mira keep her bicycle?", "Mira keeps her red bicycle in the garden shed behind the old library."


def copied(state: KVState) -> KVState:
    return KVState(cache=kv.copy_cache(state.cache), next_position=state.next_position,
                   prefix_positions=dict(state.prefix_positions), reference_mask=state.reference_mask)


def prompt_states(loaded, count: int) -> list[KVState]:
    """``count`` different states: prompts of different lengths, one KVComm-style splice (the
    context in some layers only, the sink in the others), all longer than the tiny Gemma's window."""
    states = []
    for index in range(count - 1):
        state = KVState()
        decoding.prefill(loaded, state, list(range(5, 17 + 5 * index)), need_logits=False)
        states.append(state)
    sender = KVState()
    decoding.prefill(loaded, sender, list(range(30, 50)), need_logits=False)
    spliced = kv.splice_prefix(sender.cache, loaded.facts.num_layers, selected={0, 2})
    decoding.prefill(loaded, spliced, list(range(60, 70)), need_logits=False)
    return states + [spliced]


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_a_sequence_gets_the_same_bits_alone_and_at_any_slot_of_a_batch(kind, one_thread):
    loaded = tiny_pair(kind).receiver
    step = DecodeStep(loaded)
    assert step.supported, step.reason
    states = prompt_states(loaded, 5)
    alone = [copied(s) for s in states]
    together = [copied(s) for s in reversed(states)]  # every sequence at another slot
    for round_ in range(12):  # past the tiny Gemma's window of 8: the sliding layers drop keys
        tokens = [7 + round_ + b for b in range(len(states))]
        batched = step.step(together, tokens[::-1])
        for b, state in enumerate(alone):
            single = step.step([state], [tokens[b]])[0]
            assert torch.equal(batched[len(states) - 1 - b], single)


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_the_batched_step_computes_what_the_models_own_forward_does(kind, one_thread):
    loaded = tiny_pair(kind).receiver
    step = DecodeStep(loaded)
    for state in prompt_states(loaded, 3):
        ours, theirs = copied(state), copied(state)
        for token in range(20, 32):
            mine = step.step([ours], [token])[0]
            reference, _ = decoding.prefill(loaded, theirs, [token])
            assert torch.allclose(mine, reference.hidden[0], rtol=1e-4, atol=1e-4)


def qwen_like(qk_norms: bool):
    """Tiny Qwen2-like (bias on Q, K, V) or Qwen3-like (Q and K norms) models."""
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

    from kvviz.core.facts import facts_from_config
    from kvviz.runtime import attention
    from kvviz.runtime.models import LoadedModel
    from tests.tiny_models import tiny_tokenizer

    tokenizer = tiny_tokenizer(chat=True)
    config_class = Qwen3Config if qk_norms else Qwen2Config
    config = config_class(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
    attention.register()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention.ATTENTION_NAME, dtype=torch.float32)
    model.eval().requires_grad_(False)
    if not qk_norms:
        for layer in model.model.layers:  # make the biases matter
            for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                projection.bias.normal_(0, 0.5)
    name = "tiny-qwen3" if qk_norms else "tiny-qwen2"
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, facts=facts_from_config(name, model.config, tokenizer),
                       source="built from config", load_seconds=0.0)


@pytest.mark.parametrize("qk_norms", [False, True], ids=["qwen2-bias", "qwen3-norms"])
def test_the_batched_step_covers_qwen_layouts(qk_norms, one_thread):
    loaded = qwen_like(qk_norms)
    step = DecodeStep(loaded)
    assert step.supported, step.reason
    ours, theirs = KVState(), KVState()
    decoding.prefill(loaded, ours, list(range(5, 20)), need_logits=False)
    decoding.prefill(loaded, theirs, list(range(5, 20)), need_logits=False)
    for token in range(20, 26):
        reference, _ = decoding.prefill(loaded, theirs, [token])
        assert torch.allclose(step.step([ours], [token])[0], reference.hidden[0], rtol=1e-4, atol=1e-4)


def test_an_architecture_the_step_does_not_cover_decodes_through_the_models_forward(one_thread):
    loaded = tiny_pair("llama").receiver
    step = DecodeStep.__new__(DecodeStep)  # as if the check had refused it
    step.supported, step.reason, step.loaded = False, "no batched decode step for the test architecture", loaded
    saved = loaded._decoding
    loaded._decoding = (step, None)
    try:
        assert batching.decode_path(loaded) == {"batched": False, "reason": step.reason}
        state = KVState()
        first, _ = decoding.prefill(loaded, state, list(range(5, 20)))
        output = decoding.generate(loaded, state, first, registry.build_request("q").generation, max_new_tokens=5)
        assert output.batch_sizes is None and len(output.token_ids) <= 5
    finally:
        loaded._decoding = saved


def test_the_row_rule():
    assert row_floor([[1], list(range(2, 17))], 16, fast=6) == 6  # this CPU's oneDNN: pad to six
    assert row_floor([list(range(1, 17))], 16, fast=1) == 1  # one class: no padding
    assert row_floor([[1], [2, 3], list(range(4, 17))], 16, fast=1) == 4  # MKL's classes
    assert row_floor([[m] for m in range(1, 17)], 16, fast=1) == 16  # nothing alike: pad to the most


def test_a_growing_cache_layer_appends_in_place_and_keeps_what_was_assigned():
    cache = kv.new_cache()
    first = torch.randn(1, 2, 5, 4)
    cache.update(first, first + 1, 0)
    layer = cache.layers[0]
    buffer = layer._buffer
    for step in range(40):  # past the first buffer's room: it grows
        new = torch.full((1, 2, 1, 4), float(step))
        keys, values = kv.append_token(cache, 0, new, new + 1)
    assert keys.shape == (1, 2, 45, 4) and torch.equal(keys[:, :, :5], first) and torch.equal(values[:, :, 5:], keys[:, :, 5:] + 1)
    assert layer._buffer is not buffer
    layer.keys, layer.values = layer.keys.clone(), layer.values.clone()  # what place() does on a move
    keys, _ = kv.append_token(cache, 0, torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))
    assert keys.shape[2] == 46 and torch.equal(keys[:, :, :5], first)


@pytest.fixture(scope="module")
def contract_request(tmp_path_factory):
    """Every handoff on the tiny pair, C2C and the translation with untrained checkpoints saved for it."""
    pair = tiny_pair("gemma")
    return registry.build_request(QUERY, CONTEXT, 12, options=untrained_checkpoints(pair, tmp_path_factory.mktemp("fusers")))


def run_together(pair, request, names):
    """The handoffs in threads at once, as one run, each waiting (up to 5 s) at its first answer token
    until the others reached theirs, so that their decode steps overlap."""
    arrived, lock, everyone = [0], threading.Lock(), threading.Event()
    results = {}

    def first_token_waits(name):
        seen = []

        def on_token(text):
            if not seen:
                seen.append(text)
                with lock:
                    arrived[0] += 1
                    if arrived[0] == len(names):
                        everyone.set()
                everyone.wait(5)

        return on_token

    run = RunContext()  # one run: prompts several handoffs read are read once
    threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, run_handoff(n, pair, request, first_token_waits(n), run=run)))
               for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return results


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_every_handoff_gets_the_same_tokens_in_a_shared_batch_as_alone(sample, contract_request, one_thread):
    pair = tiny_pair("gemma")
    request = contract_request
    if sample:
        request = dataclasses.replace(request, generation=dataclasses.replace(request.generation, greedy=False, seed=3))
    assert_every_handoff_alone_as_together(pair, request)


def assert_every_handoff_alone_as_together(pair, request) -> None:
    """Every registered handoff alone, then all at once as one run: each applies, each gets the same
    tokens both ways, and the decode steps were shared."""
    names = [handoff.name for handoff in registry.all_handoffs()]
    alone = {name: run_handoff(name, pair, request) for name in names}
    together = run_together(pair, request, names)
    for name in names:
        assert alone[name].applicable, alone[name].reason
        assert together[name].answer_ids == alone[name].answer_ids, name
    sizes = [batch["max_size"] for result in together.values() for batch in result.details["decode_batches"] if batch["batched"]]
    assert max(sizes) >= 3  # the decode steps were shared


def test_a_prompt_read_by_several_handoffs_of_a_run_is_read_once_and_bitwise_the_same(one_thread):
    from kvviz.runtime.measure import StageTimer

    loaded = tiny_pair("gemma").receiver
    ids = list(range(5, 30))
    alone = KVState()
    first, _ = decoding.prefill(loaded, alone, ids)
    shared = decoding.SharedPrompts()  # one run's
    timers = [StageTimer(), StageTimer()]
    reads = [decoding.read_prompt_once(loaded, ids, timer, "sharer_prefill", shared) for timer in timers]
    other = decoding.read_prompt_once(loaded, ids[:-1], shared=shared)  # other tokens: read on its own
    assert [read.shared for read in reads] == [False, True] and not other.shared
    for read in reads:
        for layer in range(loaded.facts.num_layers):
            assert torch.equal(kv.layer_kv(read.state.cache, layer)[0], kv.layer_kv(alone.cache, layer)[0])
        assert read.state.next_position == len(ids)
    assert reads[0].state.cache is not reads[1].state.cache  # each reader may append to its own
    # the reuser's stage carries the reading's own cost, not the (near zero) wait
    assert timers[1].seconds["sharer_prefill"] >= reads[0].seconds - 1e-9
    # the layer inputs are those of the prompt's pass (the last one feeds the final norm)
    assert len(reads[0].layer_inputs) == loaded.facts.num_layers
