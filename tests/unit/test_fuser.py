"""The C2C fuser module: layer alignment, fusion invariants, checkpoints, training signal.

Tiny random models only (tests/tiny_models.py); runs in seconds.
"""

from __future__ import annotations

import json

import pytest
import torch

from kvviz.handoffs.c2c.align import terminal_layer_map
from kvviz.handoffs.c2c.config import FuserError
from kvviz.handoffs.c2c.fuser import C2CFuser, annealed_temperature, load_fuser, new_fuser
from kvviz.runtime.models import LoadedPair, PairSpec
from tests.tiny_models import tiny_gemma, tiny_llama

# tiny models run fastest on one thread, above all on a busy machine
pytestmark = pytest.mark.usefixtures("one_thread")


def mixed_pair() -> LoadedPair:
    sharer, receiver = tiny_llama(), tiny_gemma()
    spec = PairSpec(name="tiny-llama+tiny-gemma", sharer=sharer.name, receiver=receiver.name, description="tiny")
    return LoadedPair(spec=spec, sharer=sharer, receiver=receiver, same_shape_sender=sharer)


def random_layers(layers, heads, tokens, dim, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(1, heads, tokens, dim, generator=generator), torch.randn(1, heads, tokens, dim, generator=generator))
        for _ in range(layers)
    ]


def trained_like(fuser: C2CFuser, seed: int = 1) -> C2CFuser:
    """Give every weight (also the zero-initialised projection) random values."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in fuser.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    return fuser


# --- layer alignment ---------------------------------------------------------------------------


def test_terminal_layer_map_deeper_receiver():
    # 30 receiver layers reading an 18-layer sharer: clamp(18 - 30 + t, 0, 17)
    mapping = terminal_layer_map(sharer_layers=18, receiver_layers=30)
    assert len(mapping) == 30
    assert mapping == [min(max(18 - 30 + t, 0), 17) for t in range(30)]
    assert mapping[:13] == [0] * 13 and mapping[12] == 0 and mapping[13] == 1 and mapping[-1] == 17


def test_terminal_layer_map_deeper_sharer_and_equal():
    assert terminal_layer_map(30, 18) == list(range(12, 30))
    assert terminal_layer_map(6, 6) == list(range(6))


# --- fusion invariants ---------------------------------------------------------------------------


def test_closed_gates_and_zero_projection_leave_the_cache_unchanged():
    pair = mixed_pair()
    fuser = trained_like(new_fuser(pair.sharer.facts, pair.receiver.facts, width=16))
    receiver = random_layers(6, 1, 7, 16)
    sharer = random_layers(4, 2, 9, 16, seed=3)
    positions_r, positions_s = [1, 2, 3, 4, 5], [3, 4, 5, 6, 7]
    fuser.eval()
    with torch.no_grad():
        fuser.gate_logits.fill_(-1.0)  # every gate closed
        fused, records = fuser.fuse(receiver, sharer, positions_r, positions_s)
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(fused, receiver))
        assert not any(r.gate_k_open or r.gate_v_open for r in records)
        fuser.gate_logits.fill_(1.0)  # open: now the cache changes, but only at the fused positions
        fused, records = fuser.fuse(receiver, sharer, positions_r, positions_s)
        assert not torch.equal(fused[0][0], receiver[0][0])
        assert torch.equal(fused[0][0][..., [0, 6], :], receiver[0][0][..., [0, 6], :])
        assert all(r.gate_k_open and r.gate_v_open for r in records)
        for projector in list(fuser.key_projectors) + list(fuser.value_projectors):
            projector.proj_out.weight.zero_()  # zero projection, gates open
        fused, _ = fuser.fuse(receiver, sharer, positions_r, positions_s)
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(fused, receiver))


def test_records_and_shapes():
    pair = mixed_pair()
    fuser = new_fuser(pair.sharer.facts, pair.receiver.facts, width=16).eval()
    fused, records = fuser.fuse(random_layers(6, 1, 5, 16), random_layers(4, 2, 5, 16), [0, 1, 2], [0, 1, 2])
    assert [tuple(k.shape) for k, _ in fused] == [(1, 1, 5, 16)] * 6
    assert [r.sharer_layer for r in records] == terminal_layer_map(4, 6)
    assert all(len(r.head_weights_k) == 1 and 0 < r.head_weights_k[0] < 1 for r in records)
    assert all(r.gate_k == 0.5 and r.gate_k_open is False for r in records)  # logits start at 0: undecided


def test_gumbel_gates_while_training_hard_at_inference():
    pair = mixed_pair()
    fuser = new_fuser(pair.sharer.facts, pair.receiver.facts, width=8)
    fuser.train()
    fuser.temperature = 1.0
    # the reference's noise: one Gumbel draw per batch item, receiver head and token
    soft = fuser.gate(0, 0, (2, 3, 5, 16), hard=False)
    assert soft.shape == (2, 3, 5, 1)
    assert ((soft > 0) & (soft < 1)).all() and not torch.equal(soft, fuser.gate(0, 0, (2, 3, 5, 16), hard=False))
    assert len(set(soft.flatten().tolist())) == soft.numel()  # every head and token draws its own noise
    fuser.eval()
    with torch.no_grad():
        fuser.gate_logits[0, 0] = 0.3
    hard = fuser.gates()
    assert set(hard.flatten().tolist()) <= {0.0, 1.0} and hard[0, 0] == 1 and hard[1, 0] == 0
    assert annealed_temperature(0, 100) == pytest.approx(1.0)
    assert annealed_temperature(99, 100) == pytest.approx(0.001)


# --- checkpoints ---------------------------------------------------------------------------------


def test_save_load_round_trip_exact(tmp_path):
    pair = mixed_pair()
    fuser = trained_like(new_fuser(pair.sharer.facts, pair.receiver.facts, width=16, pair=pair.name))
    fuser.config.training = {"steps": 3, "heldout_nll": 1.5}
    fuser.save(tmp_path / "f")
    loaded = load_fuser(tmp_path / "f", pair.sharer.facts, pair.receiver.facts, pair.name)
    original = fuser.state_dict()
    assert set(loaded.state_dict()) == set(original)
    assert all(torch.equal(loaded.state_dict()[k], original[k]) for k in original)
    assert loaded.config.to_dict() == fuser.config.to_dict()
    # fp16 storage: half the bytes, values within fp16 precision, gate logits exact
    fuser.save(tmp_path / "h", dtype=torch.float16)
    half = load_fuser(tmp_path / "h")
    assert torch.equal(half.gate_logits, fuser.gate_logits)
    assert torch.allclose(half.key_projectors[0].inp.weight, fuser.key_projectors[0].inp.weight, atol=1e-3)
    assert (tmp_path / "h" / "fuser.safetensors").stat().st_size < 0.6 * (tmp_path / "f" / "fuser.safetensors").stat().st_size


def test_wrong_pair_names_both_pairs(tmp_path):
    pair = mixed_pair()
    new_fuser(pair.sharer.facts, pair.receiver.facts, width=8, pair=pair.name).save(tmp_path / "f")
    other = tiny_llama(name="other-llama")
    with pytest.raises(FuserError) as error:
        load_fuser(tmp_path / "f", other.facts, other.facts, "other-pair")
    message = str(error.value)
    assert "tiny-llama+tiny-gemma" in message and "tiny-gemma" in message
    assert "other-pair" in message and "other-llama" in message


def test_corrupt_and_inconsistent_checkpoints_fail_clearly(tmp_path):
    pair = mixed_pair()
    folder = tmp_path / "f"
    new_fuser(pair.sharer.facts, pair.receiver.facts, width=8).save(folder)
    weights = folder / "fuser.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    with pytest.raises(FuserError, match="corrupt"):
        load_fuser(folder)
    weights.write_bytes(b"\x80\x04not a safetensors file, maybe a pickle")
    with pytest.raises(FuserError, match="corrupt"):
        load_fuser(folder)
    weights.write_bytes(good)
    config = json.loads((folder / "config.json").read_text())
    config["width"] = 12  # the config no longer describes the weights
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(FuserError, match="does not match its weights"):
        load_fuser(folder)
    (folder / "config.json").write_text(json.dumps({**config, "version": 99}))
    with pytest.raises(FuserError, match="format version 99; this kvviz reads versions 1, 2. .* train-fuser"):
        load_fuser(folder)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(FuserError, match="not a JSON object"):
        load_fuser(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(FuserError, match="not valid JSON"):
        load_fuser(folder)
    with pytest.raises(FuserError, match="missing"):
        load_fuser(tmp_path / "nowhere")


# --- training signal -----------------------------------------------------------------------------


def tiny_examples(pair):
    from kvviz.data import Record
    from kvviz.studies.c2c.examples import make_example

    texts = [
        ("What is the secret code word?", "The secret code word is pineapple.", "pineapple"),
        ("Where is Uma?", "Uma is at the Mahaffie House.", "the Mahaffie House"),
        ("What is the capital of France?", None, "Paris is the capital of France."),
    ]
    records = [Record(id=str(i), question=q, context=c, answers=[], choices=None, answer_index=None, source="t", response=r) for i, (q, c, r) in enumerate(texts)]
    return [make_example(pair, r, 256, 16) for r in records]


def test_gradients_reach_the_fuser_only_and_training_lowers_the_loss():
    from kvviz.studies.c2c.scoring import response_nll

    torch.manual_seed(0)
    pair = mixed_pair()
    examples = tiny_examples(pair)
    fuser = new_fuser(pair.sharer.facts, pair.receiver.facts, width=16, dropout=0.0)
    fuser.train()
    fuser.temperature = 0.5
    loss, n = response_nll(pair, fuser, examples[0])
    (loss / n).backward()
    assert fuser.key_projectors[0].proj_out.weight.grad is not None
    assert fuser.key_projectors[0].proj_out.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in pair.receiver.model.parameters())
    assert all(p.grad is None for p in pair.sharer.model.parameters())
    assert not any(p.requires_grad for p in pair.receiver.model.parameters())

    def total_loss():
        with torch.no_grad():
            return sum(float(response_nll(pair, fuser, e, hard=False)[0]) for e in examples)

    with torch.no_grad():
        fuser.gate_logits.fill_(3.0)  # keep gates open so the test measures the projection
    fuser.temperature = 1.0
    torch.manual_seed(1)
    before = total_loss()
    optimizer = torch.optim.AdamW([p for n_, p in fuser.named_parameters() if n_ != "gate_logits"], lr=3e-3)
    for _ in range(8):
        for example in examples:
            optimizer.zero_grad()
            loss, n = response_nll(pair, fuser, example)
            (loss / n).backward()
            optimizer.step()
    torch.manual_seed(1)
    after = total_loss()
    assert after < before - 0.1, (before, after)


def test_checkpoint_label_names_no_machine_folder(tmp_path):
    from kvviz.core.paths import PROJECT_ROOT
    from kvviz.runtime.checkpoints import checkpoint_label

    shipped = PROJECT_ROOT / "assets" / "fusers" / "some-pair" / "c2c"
    assert checkpoint_label(shipped) == "assets/fusers/some-pair/c2c"
    assert checkpoint_label(tmp_path) == str(tmp_path.resolve())
