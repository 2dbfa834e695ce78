"""The numeric modes (kvviz.runtime.numerics): the setting, the choice per machine, the bf16 stack's
products on tiny models, and batch invariance in the bf16 mode (a sequence's bits alone and at any
slot of a batch; every handoff's tokens alone and with all the others at once)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kvviz.core import policy
from kvviz.handoffs import registry
from kvviz.runtime import numerics
from kvviz.runtime.models import LoadedPair, PairSpec
from kvviz.runtime.step import DecodeStep
from tests.conftest import untrained_checkpoints
from tests.tiny_models import tiny_gemma, tiny_llama
from tests.unit.test_batching import CONTEXT, QUERY, assert_every_handoff_alone_as_together, copied, prompt_states


def bf16_packing() -> bool:
    """oneDNN packs bfloat16 weights on this CPU (natively or emulated on AVX-512)."""
    try:
        numerics.pack(torch.zeros(16, 16, dtype=torch.bfloat16))
        return True
    except RuntimeError:
        return False


needs_bf16 = pytest.mark.skipif(not bf16_packing(), reason="oneDNN has no bfloat16 product on this CPU (AVX2 or older)")


def in_bf16(loaded):
    numerics.apply(loaded.model, "bf16")
    loaded.numerics = "bf16"
    return loaded


def test_the_setting_defaults_to_auto_and_refuses_what_it_does_not_know(monkeypatch):
    monkeypatch.delenv("KVVIZ_NUMERICS", raising=False)
    assert policy.numerics_setting() == policy.DEFAULT_NUMERICS == "auto"  # bf16 where the CPU has it
    monkeypatch.setenv("KVVIZ_NUMERICS", " BF16 ")
    assert policy.numerics_setting() == "bf16"
    monkeypatch.setenv("KVVIZ_NUMERICS", "int4")
    with pytest.raises(ValueError, match="KVVIZ_NUMERICS must be one of auto, fp32, bf16"):
        policy.numerics_setting()


def test_the_mode_follows_the_cpu(monkeypatch):
    monkeypatch.setattr(numerics, "native_bf16", lambda: True)
    assert numerics.mode_for("cpu", torch.float32, "auto") == "bf16"
    assert numerics.mode_for("cpu", torch.float32, "fp32") == "fp32"
    assert numerics.mode_for("cpu", torch.bfloat16, "bf16") == "fp32"  # a bf16 model computes as loaded
    assert numerics.mode_for("cuda", torch.float32, "bf16") == "fp32"  # the mode is the CPU's
    monkeypatch.setattr(numerics, "native_bf16", lambda: False)
    assert numerics.mode_for("cpu", torch.float32, "auto") == "fp32"
    with pytest.raises(ValueError, match="needs a CPU with bfloat16 dot products"):
        numerics.mode_for("cpu", torch.float32, "bf16")


def test_native_bf16_reads_the_cpu_flags(monkeypatch):
    monkeypatch.setattr(numerics, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert not numerics.native_bf16()  # AVX-512 without its bf16 dot products: emulated, slower than fp32


@needs_bf16
@pytest.mark.parametrize("build", [tiny_llama, tiny_gemma], ids=["llama", "gemma"])
def test_the_bf16_stack_keeps_its_layers_hooks_and_gradients(build):
    loaded = build(name="tiny-bf16-layers")
    ids = torch.tensor([list(range(5, 25))])
    with torch.no_grad():
        reference = loaded.model.model(input_ids=ids).last_hidden_state
    layers = loaded.model.model.layers
    linears = sum(1 for m in layers.modules() if type(m) is nn.Linear)
    assert numerics.apply(loaded.model, "bf16") == linears > 0
    assert not any(type(m) is nn.Linear for m in layers.modules())
    assert all(m.weight.dtype == torch.bfloat16 for m in layers.modules() if isinstance(m, numerics.PackedLinear))
    seen = []
    handle = layers[1].register_forward_hook(lambda module, args, output: seen.append(1))  # AC arms hooks like this
    try:
        with torch.no_grad():
            ours = loaded.model.model(input_ids=ids).last_hidden_state
    finally:
        handle.remove()
    assert seen == [1] and ours.dtype == torch.float32
    relative = float((ours - reference).norm() / reference.norm())
    assert 0 < relative < 0.05, relative  # bf16 weights: close to fp32, not equal
    # a gradient through the stack (C2C's fuser training) takes a product autograd knows
    x = torch.randn(3, layers[0].mlp.down_proj.in_features, requires_grad=True)
    layers[0].mlp.down_proj(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@needs_bf16
def test_fp32_changes_nothing():
    loaded = tiny_llama(name="tiny-fp32-mode")
    assert numerics.apply(loaded.model, "fp32") == 0
    assert any(type(m) is nn.Linear for m in loaded.model.model.layers.modules())
    with pytest.raises(ValueError, match="unknown numeric mode"):
        numerics.apply(loaded.model, "int8")


@needs_bf16
@pytest.mark.parametrize("build", [tiny_llama, tiny_gemma], ids=["llama", "gemma"])
def test_invariance_bf16_a_sequence_gets_the_same_bits_alone_and_at_any_slot_of_a_batch(build, one_thread):
    loaded = in_bf16(build(name="tiny-bf16-slots"))
    step = DecodeStep(loaded)
    assert step.supported, step.reason
    assert "bf16" in step.products
    states = prompt_states(loaded, 5)
    alone = [copied(s) for s in states]
    together = [copied(s) for s in reversed(states)]
    for round_ in range(12):  # past the tiny Gemma's window of 8
        tokens = [7 + round_ + b for b in range(len(states))]
        batched = step.step(together, tokens[::-1])
        for b, state in enumerate(alone):
            assert torch.equal(batched[len(states) - 1 - b], step.step([state], [tokens[b]])[0])


@needs_bf16
def test_invariance_bf16_every_handoff_gets_the_same_tokens_in_a_shared_batch_as_alone(tmp_path, one_thread):
    model = in_bf16(tiny_gemma(name="tiny-gemma-bf16"))
    pair = LoadedPair(spec=PairSpec(name="tiny-gemma-bf16", sharer=model.name, receiver=model.name, description="bf16"),
                      sharer=model, receiver=model, same_shape_sender=model)
    assert_every_handoff_alone_as_together(pair, registry.build_request(QUERY, CONTEXT, 12, options=untrained_checkpoints(pair, tmp_path)))
