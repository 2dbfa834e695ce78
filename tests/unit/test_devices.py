"""GPU code paths, tested on CPU: timers that wait for the device, peak GPU memory in every result,
KV that follows its receiving layer, models spread by accelerate, and the no-network GPU check.

What cannot be tested here: two real devices. torch has no second CPU device (``cpu:1`` is
``cpu``) and a ``meta`` tensor cannot compute, so a split over two devices is tested in two
halves: the placement logic moves each layer's KV to the device of its layer (``meta`` as the
target), and a model dispatched by accelerate with a per-layer device map (every layer its own
entry, all on ``cpu``) runs every handoff through accelerate's hooks with the same answers.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import time

import pytest
import torch

from kvviz.core.facts import facts_from_config
from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine import runner
from kvviz.handoffs import registry
from kvviz.runtime import cache as kv
from kvviz.runtime import measure
from kvviz.runtime.decode import generate, prefill
from kvviz.runtime.models import LoadedModel, LoadedPair, PairSpec
from tests.conftest import REPO_ROOT, tiny_pair, untrained_checkpoints


@pytest.fixture()
def fake_cuda(monkeypatch):
    """torch.cuda as a process that used two GPUs would see it; records every call."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("sync", device)))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(("reset", str(device))))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 1000 + 10 * (torch.device(device).index or 0))
    return calls


def request(max_new_tokens=3) -> HandoffRequest:
    return HandoffRequest(query="What is the secret code word?", context="The secret code word is pineapple.",
                          generation=GenerationSettings(max_new_tokens=max_new_tokens), options={"text": {"message_tokens": 4}})


# --- timers wait for the device ---------------------------------------------------------------


def test_clock_waits_for_every_gpu_in_use(fake_cuda):
    measure.clock()
    assert fake_cuda == [("sync", 0), ("sync", 1)]


def test_clock_leaves_cuda_alone_where_it_was_never_used(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # a ZeroGPU main process, a CPU run
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("initialised CUDA"))
    measure.clock()


def test_stage_timer_and_the_decode_loop_synchronise(fake_cuda, one_thread):
    timer = measure.StageTimer()
    with timer.stage("transfer"):
        pass
    assert fake_cuda.count(("sync", 0)) == 2  # at the start and at the stop
    fake_cuda.clear()
    model = tiny_pair("llama").receiver
    state = kv.KVState()
    first, _ = prefill(model, state, model.tokenizer("Hello there")["input_ids"])
    output = generate(model, state, first, GenerationSettings(max_new_tokens=3))
    # start, the first token, the end: the first-token time includes the device's work
    assert fake_cuda.count(("sync", 0)) >= 3 and output.first_token_seconds >= 0


def test_synchronised_clock_sees_queued_work(monkeypatch):
    """A timer must include work the device still has queued: the stand-in device needs 50 ms to
    finish, and a timer that did not wait would read ~0."""
    pending = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: [time.sleep(s) for s in pending] and pending.clear())
    timer = measure.StageTimer()
    with timer.stage("receiver_prefill"):
        pending.append(0.05)  # "launched a kernel" that runs for 50 ms
    assert timer.seconds["receiver_prefill"] >= 0.045


# --- peak GPU memory in every result -----------------------------------------------------------


def test_peak_gpu_memory_per_cuda_device(fake_cuda):
    with measure.PeakGpuMemory([torch.device("cuda", 1), "cuda:0", "cpu", torch.device("cuda", 0)]) as memory:
        pass
    assert memory.peak_bytes == {"cuda:0": 1000, "cuda:1": 1010}
    assert ("reset", "cuda:0") in fake_cuda and ("reset", "cuda:1") in fake_cuda
    with measure.PeakGpuMemory(["cpu"]) as nothing:
        pass
    assert nothing.peak_bytes == {}


def test_every_result_has_its_peak_gpu_memory_on_cuda(fake_cuda, monkeypatch, one_thread):
    pair = tiny_pair("gemma")
    on_cpu = runner.run_handoff("receiver", pair, request())
    assert "peak_gpu_memory_bytes" not in on_cpu.details
    monkeypatch.setattr(runner, "pair_devices", lambda loaded: {torch.device("cuda", 0)})
    for name in ("receiver", "kvcomm", "text"):
        result = runner.run_handoff(name, pair, request())
        assert result.details["peak_gpu_memory_bytes"] == {"cuda:0": 1000}, name


# --- KV follows its receiving layer ------------------------------------------------------------


def test_place_moves_each_layer_to_its_device_and_leaves_the_rest():
    keys = [torch.randn(1, 1, 3, 4) for _ in range(3)]
    cache = kv.from_tensors([(k, k.clone()) for k in keys])
    kept = cache.layers[0].keys
    kv.place(cache, [torch.device("cpu"), torch.device("meta"), torch.device("meta")])
    assert [cache.layers[i].keys.device.type for i in range(3)] == ["cpu", "meta", "meta"]
    assert [cache.layers[i].values.device.type for i in range(3)] == ["cpu", "meta", "meta"]
    assert cache.layers[0].keys is kept  # already in place: not copied
    assert cache.layers[1].device == torch.device("meta")


def test_a_spliced_cache_moves_to_the_receiver_layers_before_the_forward(monkeypatch):
    """KVComm splices the sender's cache; the receiver's forward places it on its own layers."""
    import kvviz.runtime.decode as decode

    pair = tiny_pair("llama")
    sender_state = kv.KVState()
    prefill(pair.same_shape_sender, sender_state, pair.sharer.tokenizer("The code is 4471.")["input_ids"], need_logits=False)
    state = kv.splice_prefix(sender_state.cache, 4, {0, 2})
    placed = []
    monkeypatch.setattr(decode, "place", lambda cache, devices: placed.append((cache, list(devices))))
    prefill(pair.receiver, state, [5, 6])
    assert placed and placed[0][0] is state.cache and placed[0][1] == pair.receiver.layer_devices


def test_layer_devices_report_where_each_layer_is():
    model = copy.deepcopy(tiny_pair("llama").receiver)
    assert model.layer_devices == [torch.device("cpu")] * 4
    model.model.model.layers[2].to("meta")
    assert [d.type for d in model.layer_devices] == ["cpu", "cpu", "meta", "cpu"]


# --- a model spread by accelerate (every layer its own device-map entry) -----------------------


def dispatched(loaded: LoadedModel) -> LoadedModel:
    from accelerate import dispatch_model

    model = copy.deepcopy(loaded.model)
    layers = len(model.model.layers)
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
    device_map.update({f"model.layers.{i}": "cpu" for i in range(layers)})
    model = dispatch_model(model, device_map=device_map, force_hooks=True)
    assert any(hasattr(module, "_hf_hook") for module in model.model.layers)  # accelerate's hooks are on
    return LoadedModel(name=loaded.name, model=model, tokenizer=loaded.tokenizer, facts=loaded.facts, source="dispatched",
                       load_seconds=0.0, device=next(model.parameters()).device)


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_every_handoff_runs_the_same_through_accelerate_hooks(kind, tmp_path, monkeypatch, one_thread):
    from kvviz.core.paths import cache_dir

    plain = tiny_pair(kind)
    model = dispatched(plain.receiver)
    spread = LoadedPair(spec=plain.spec, sharer=model, receiver=model, same_shape_sender=model)
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    # untrained checkpoints (C2C's and the translation's paths, not their quality) where fusers may come from
    given = dataclasses.replace(request(), options={**request().options,
                                                    **untrained_checkpoints(plain, cache_dir() / "fusers" / "tiny", None)})
    for handoff in registry.all_handoffs():
        a = runner.run_handoff(handoff.name, plain, given)
        b = runner.run_handoff(handoff.name, spread, given)
        assert a.applicable, (handoff.name, a.reason)
        assert a.answer_ids == b.answer_ids and b.applicable, handoff.name


def test_layer_devices_follow_accelerate_hooks():
    """A layer accelerate offloaded keeps its weights on meta between forwards; it computes on
    its hook's execution device, and that is where its KV belongs."""
    from types import SimpleNamespace

    model = copy.deepcopy(tiny_pair("llama").receiver)
    model.model.model.layers[1]._hf_hook = SimpleNamespace(execution_device=torch.device("meta"))
    model.model.model.layers[3]._hf_hook = SimpleNamespace(execution_device=None)  # no device named: its weights'
    assert [d.type for d in model.layer_devices] == ["cpu", "meta", "cpu", "cpu"]


def test_device_auto_asks_accelerate_for_a_device_map(tmp_path, monkeypatch, one_thread):
    """``--device auto`` loads with ``device_map="auto"`` (accelerate; on a CPU-only machine the map
    is one device, so transformers attaches no hooks) and runs."""
    from transformers import AutoModelForCausalLM

    from kvviz.runtime import models

    tiny = tiny_pair("llama").receiver
    folder = tmp_path / "tiny-llama"
    tiny.model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    asked = []
    real = AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: asked.append(k) or real(*a, **k))
    loaded = models.load_model(str(folder), device="auto", dtype="float32", progress=lambda *_: None)
    assert asked[0]["device_map"] == "auto"
    assert set(loaded.layer_devices) == {torch.device("cpu")}
    spec = PairSpec(name="auto", sharer=loaded.name, receiver=loaded.name, description="tiny, device auto")
    result = runner.run_handoff("kvcomm", LoadedPair(spec=spec, sharer=loaded, receiver=loaded, same_shape_sender=loaded), request())
    assert result.applicable and result.answer_ids


# --- the GPU check, tiny, on CPU --------------------------------------------------------------


def test_gpu_check_runs_every_handoff_on_tiny_models(capsys, tmp_path, monkeypatch, one_thread):
    spec = importlib.util.spec_from_file_location("gpu_check", REPO_ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    # the configs are the real models' shapes
    qwen3 = gpu_check.config_for("Qwen/Qwen3-0.6B", tiny=False)
    assert (qwen3.num_hidden_layers, qwen3.num_attention_heads, qwen3.num_key_value_heads, qwen3.head_dim, qwen3.vocab_size) == (28, 16, 8, 128, 151936)
    gemma = gpu_check.config_for("google/gemma-3-270m", tiny=False)
    assert (gemma.num_hidden_layers, gemma.num_key_value_heads, gemma.head_dim, gemma.sliding_window) == (18, 1, 256, 512)
    assert gemma.layer_types.count("full_attention") == 3
    facts = facts_from_config("qwen2.5", gpu_check.config_for("Qwen/Qwen2.5-0.5B-Instruct", tiny=False))
    assert (facts.num_layers, facts.num_heads, facts.num_kv_heads, facts.head_dim, facts.hidden_size) == (24, 14, 2, 64, 896)
    from transformers import AutoModelForCausalLM

    counts = {}
    for name in gpu_check.ARCHITECTURES:  # built on meta: shapes only, no memory
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(gpu_check.config_for(name, tiny=False))
        counts[name] = round(sum(p.numel() for p in model.parameters()) / 1e6)
    # the published sizes: Qwen3-0.6B 0.60B, Qwen2.5-0.5B 0.49B, Gemma-3-270M 268M (tied heads)
    assert counts == {"Qwen/Qwen3-0.6B": 596, "Qwen/Qwen2.5-0.5B-Instruct": 494, "google/gemma-3-270m": 268}

    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))  # the random fusers go here
    out = tmp_path / "check.json"
    assert gpu_check.main(["--tiny", "--pairs", "qwen", "--device", "cpu", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for handoff in registry.all_handoffs():
        assert f"| {handoff.name} |" in text
    assert "not applicable" not in text  # every handoff ran, C2C with its random fuser
    assert "C2C / text latency |" in text and "kvcomm@0.3 receiver-side" in text
    assert "| model | mode | step ms |" in text and "prefill ms/token" in text  # the speed table, per numeric mode
    import json

    report = json.loads(out.read_text())["pairs"]["qwen"]
    assert all(row["applicable"] and row["generated"] >= 0 for row in report["handoffs"])
    assert report["perf"]["speed"]["models"][0]["tokens_per_second"]["median"] > 0
