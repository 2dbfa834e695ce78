"""C2C that carries the sharer's information: the fusion pipeline, RoPE-aware projection, the
communication measure, the recall data, and the paper's published fuser layout.

Tiny random models only (tests/tiny_models.py); runs in seconds.
"""

from __future__ import annotations

import json

import pytest
import torch

from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.data import Record, contains_answer, recall
from kvviz.engine.runner import run_handoff
from kvviz.handoffs.c2c import locate, reference
from kvviz.handoffs.c2c.align import align_prompt
from kvviz.handoffs.c2c.config import FuserError
from kvviz.handoffs.c2c.fuser import load_fuser, new_fuser
from kvviz.handoffs.c2c.fusion import fuse_prompt, sharer_kv
from kvviz.runtime.decode import prefill
from kvviz.runtime.models import LoadedPair, PairSpec
from kvviz.runtime.rope import RopeTables, apply_rotation, rotary_tables, undo_rotation
from tests.conftest import REPO_ROOT
from tests.unit.test_fuser import mixed_pair, trained_like

pytestmark = pytest.mark.usefixtures("one_thread")

QUERY = "What is the secret code word?"
CONTEXTS = ["The secret code word is pineapple.", "Mira keeps her red bicycle in the garden shed."]


@pytest.fixture(scope="module")
def pair():
    return mixed_pair()


def private_fuser(pair, control=False, rope="plain", seed=1):
    fuser = trained_like(new_fuser(pair.sharer.facts, pair.receiver.facts, width=16, pair=pair.name, control=control, rope=rope), seed)
    fuser.config.training = {"receiver_sees_context": False}
    with torch.no_grad():
        fuser.gate_logits.fill_(2.0)
    return fuser.eval()


def fused_keys(pair, fuser, context):
    alignment = align_prompt(pair.receiver.tokenizer, pair.sharer.tokenizer, QUERY, context, receiver_sees_context=False)
    with torch.no_grad():
        state = fuse_prompt(pair, fuser, alignment, hard=True).state
    return [state.cache.layers[i].keys.clone() for i in range(len(state.cache.layers))]


# --- the communication test --------------------------------------------------------------------


def test_c2c_output_changes_with_the_sharers_context_and_the_controls_does_not(pair, tmp_path):
    c2c_fuser, control = private_fuser(pair), private_fuser(pair, control=True)
    a, b = fused_keys(pair, c2c_fuser, CONTEXTS[0]), fused_keys(pair, c2c_fuser, CONTEXTS[1])
    assert any(not torch.allclose(x, y, atol=1e-5) for x, y in zip(a, b))  # the sharer's context reaches the cache
    a, b = fused_keys(pair, control, CONTEXTS[0]), fused_keys(pair, control, CONTEXTS[1])
    assert all(torch.equal(x, y) for x, y in zip(a, b))  # the control never reads it
    # through the handoff: first-token logits differ for C2C, are identical for the control
    c2c_fuser.save(tmp_path / "run" / "c2c")
    control.save(tmp_path / "run" / "control")

    def first_logits(name, context):
        fuser = locate.get_fuser(tmp_path / "run" / ("control" if name == "c2c_control" else "c2c"), pair)
        alignment = align_prompt(pair.receiver.tokenizer, pair.sharer.tokenizer, QUERY, context, receiver_sees_context=False)
        state = fuse_prompt(pair, fuser, alignment, hard=True).state
        next_token, _ = prefill(pair.receiver, state, alignment.receiver_ids[-1:])
        return next_token.logits

    assert not torch.allclose(first_logits("c2c", CONTEXTS[0]), first_logits("c2c", CONTEXTS[1]), atol=1e-5)
    assert torch.equal(first_logits("c2c_control", CONTEXTS[0]), first_logits("c2c_control", CONTEXTS[1]))
    request = HandoffRequest(query=QUERY, context=CONTEXTS[0], generation=GenerationSettings(max_new_tokens=4), options={"c2c": {"fuser": str(tmp_path / "run" / "c2c")}})
    result = run_handoff("c2c", pair, request)
    assert result.applicable, result.reason
    assert result.details["applied_gates"]["k"] == [1] * pair.receiver.facts.num_layers
    assert len(result.details["applied_gates"]["k_logit"]) == pair.receiver.facts.num_layers


def tiny_examples(pair, n=4):
    from kvviz.studies.c2c.examples import make_example

    records = recall.generate("heldout", n, seed=3, max_distractors=0)
    return [make_example(pair, r, 256, 8, receiver_sees_context=False, max_sharer_tokens=512) for r in records]


def test_communication_measure_is_zero_for_the_control_and_not_for_c2c(pair):
    from kvviz.data.stats import bootstrap_ratio
    from kvviz.studies.c2c.communication import communication_measure, derangement

    examples = tiny_examples(pair)
    assert all(e is not None for e in examples)
    control = communication_measure(pair, private_fuser(pair, control=True), examples, private=True, resamples=200)
    assert control["gain"] == 0 and control["ci95"] == [0.0, 0.0] and control["zero_gain"] == 0
    measured = communication_measure(pair, private_fuser(pair), examples, private=True, resamples=200)
    assert measured["gain"] != 0 and measured["nll"]["other"] != measured["nll"]["right"]
    low, high = measured["ci95"]
    assert low <= high
    again = communication_measure(pair, private_fuser(pair), examples, private=True, resamples=200)
    assert again["ci95"] == measured["ci95"]  # seeded
    partner = derangement(7, seed=0)
    assert sorted(partner) == list(range(7)) and all(partner[i] != i for i in range(7))
    assert bootstrap_ratio([1.0, 1.0], [2, 2]) == [0.5, 0.5]


# --- RoPE-aware projection -------------------------------------------------------------------------


def test_rotation_round_trip_and_per_layer_type_tables(pair):
    receiver = pair.receiver  # tiny Gemma 3: sliding layers theta 1e4, full layers 1e6
    cos_s, sin_s = rotary_tables(receiver, [3, 4, 9], "sliding_attention")
    cos_f, sin_f = rotary_tables(receiver, [3, 4, 9], "full_attention")
    assert not torch.allclose(cos_s, cos_f)
    tables = RopeTables(receiver, pair.sharer, [3, 4, 9], [5, 6, 7])
    assert torch.equal(tables.receiver(0)[0], cos_s) and torch.equal(tables.receiver(2)[0], cos_f)
    x = torch.randn(1, 2, 3, 16)
    assert torch.allclose(undo_rotation(apply_rotation(x, cos_f, sin_f), cos_f, sin_f), x, atol=1e-5)


@pytest.mark.parametrize("which", ["receiver", "sharer"])
def test_unrotated_cached_keys_do_not_depend_on_the_position(pair, which):
    """Keys cached at offset 0 and at offset 11 differ by the rotation only: undone, they agree."""
    from kvviz.runtime import cache as kv
    from kvviz.runtime.decode import prefill

    model = getattr(pair, which)
    ids = model.tokenizer("The secret code word is pineapple.", add_special_tokens=False)["input_ids"]
    keys = {}
    for offset in (0, 11):
        state = kv.KVState(next_position=offset)
        prefill(model, state, ids, need_logits=False)
        tables = RopeTables(model, model, list(range(offset, offset + len(ids))), [])
        keys[offset] = [undo_rotation(state.cache.layers[i].keys, *tables.receiver(i)) for i in range(model.facts.num_layers)]
        raw = [state.cache.layers[i].keys for i in range(model.facts.num_layers)]
        keys[(offset, "raw")] = raw
    for layer in range(model.facts.num_layers):
        assert torch.allclose(keys[0][layer], keys[11][layer], atol=1e-4)
        assert not torch.allclose(keys[(0, "raw")][layer], keys[(11, "raw")][layer], atol=1e-3)


def test_rope_aware_fusion_ignores_where_the_sharer_sat(pair):
    """The same sharer tokens at other positions: a RoPE-aware fuser fuses the same cache, the
    paper's plain projection does not."""
    alignment = align_prompt(pair.receiver.tokenizer, pair.sharer.tokenizer, QUERY)
    moved = type(alignment)(**{**alignment.__dict__, "sharer_start_position": alignment.sharer_start_position + 13})
    for rope, same in (("aware", True), ("plain", False)):
        fuser = private_fuser(pair, rope=rope)
        with torch.no_grad():
            a = fuse_prompt(pair, fuser, alignment, hard=True).state.cache
            b = fuse_prompt(pair, fuser, moved, hard=True).state.cache
        close = all(torch.allclose(a.layers[i].keys, b.layers[i].keys, atol=1e-4) for i in range(len(a.layers)))
        assert close is same, rope
    shared = sharer_kv(pair, moved)
    assert shared.rope_positions[0] == shared.positions[0] + moved.sharer_start_position


def test_rope_aware_fuser_saves_and_needs_tables(pair, tmp_path):
    fuser = private_fuser(pair, rope="aware")
    fuser.save(tmp_path / "f")
    loaded = load_fuser(tmp_path / "f", pair.sharer.facts, pair.receiver.facts)
    assert loaded.config.rope == "aware" and loaded.config.version == 2
    layers = [(torch.randn(1, 1, 4, 16), torch.randn(1, 1, 4, 16)) for _ in range(6)]
    with pytest.raises(FuserError, match="rotary"):
        loaded.fuse(layers, None, [1, 2], [1, 2])


def test_k_only_and_v_only_fusers_hold_the_other_gate_closed(pair):
    layers = [(torch.randn(1, 1, 4, 16), torch.randn(1, 1, 4, 16)) for _ in range(6)]
    sharer = [(torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16)) for _ in range(4)]
    for fuse, changed in (("k", 0), ("v", 1)):
        fuser = trained_like(new_fuser(pair.sharer.facts, pair.receiver.facts, width=8, fuse=fuse)).eval()
        with torch.no_grad():
            fuser.gate_logits.fill_(3.0)
            fused, records = fuser.fuse(layers, sharer, [1, 2], [1, 2])
        for (k, v), (k0, v0) in zip(fused, layers):
            assert torch.equal((k, v)[1 - changed], (k0, v0)[1 - changed])
            assert not torch.equal((k, v)[changed], (k0, v0)[changed])
        assert all((r.gate_k_open, r.gate_v_open) == (fuse == "k", fuse == "v") for r in records)


def test_format_1_checkpoints_still_load_and_newer_ones_say_so(pair, tmp_path):
    fuser = trained_like(new_fuser(pair.sharer.facts, pair.receiver.facts, width=8))
    fuser.save(tmp_path / "f")
    config = json.loads((tmp_path / "f" / "config.json").read_text())
    for key in ("bias", "intermediate", "proj_blocks", "rope", "fuse", "token_alignment", "source", "reference"):
        config.pop(key)
    config["version"] = 1
    (tmp_path / "f" / "config.json").write_text(json.dumps(config))
    old = load_fuser(tmp_path / "f")
    assert old.config.rope == "plain" and not old.config.bias
    assert all(torch.equal(old.state_dict()[k], v) for k, v in fuser.state_dict().items())
    config["version"] = 99
    (tmp_path / "f" / "config.json").write_text(json.dumps(config))
    with pytest.raises(FuserError, match="version 99"):
        load_fuser(tmp_path / "f")


# --- recall data --------------------------------------------------------------------------------


def test_recall_records_are_seeded_and_split_by_entity():
    train, held = recall.generate("train", 3000, seed=0), recall.generate("heldout", 300, seed=0)
    assert recall.generate("train", 50, seed=0)[:50] == train[:50]  # seeded
    assert recall.generate("train", 50, seed=1)[0] != train[0]
    assert all(isinstance(r, Record) and r.source == "recall" for r in train[:10])
    assert all(contains_answer(r.context, r.answers) and r.response == r.answers[0] for r in held)
    assert len({r.meta["kind"] for r in train}) == len(recall.KINDS)
    assert {r.meta["entity"] for r in train}.isdisjoint({r.meta["entity"] for r in held})
    assert {r.response for r in train}.isdisjoint({r.response for r in held})  # values never seen in training
    p_train, p_held = recall.pools("train"), recall.pools("heldout")
    for field in ("people", "towns", "pets", "codes", "colours", "jobs", "rooms"):
        assert set(getattr(p_train, field)).isdisjoint(getattr(p_held, field)), field
    assert len(p_train.people) >= 2000 and len(p_train.codes) >= 5000


def test_recall_and_dolly_mix_and_the_trainer_runs_on_it(tmp_path):
    import argparse

    from kvviz.runtime.models import register_loaded
    from kvviz.studies.c2c import train as train_fuser
    from tests.tiny_models import tiny_gemma, tiny_llama

    register_loaded(tiny_llama())
    register_loaded(tiny_gemma())
    parser = argparse.ArgumentParser()
    train_fuser.configure_parser(parser)
    argv = ["--pair", "tiny-llama+tiny-gemma", "--data", "recall", "--context", "private", "--out", str(tmp_path / "out"),
            "--steps", "3", "--heldout", "3", "--measure", "3", "--width", "8", "--device", "cpu", "--no-progress",
            "--save-every", "0", "--rope", "aware", "--fuse", "v", "--max-prompt-tokens", "256", "--max-sharer-tokens", "512"]
    assert train_fuser.main(parser.parse_args(argv)) == 0
    config = json.loads((tmp_path / "out" / "c2c" / "config.json").read_text())
    assert config["rope"] == "aware" and config["fuse"] == "v" and config["training"]["data"] == "recall"
    assert "gain" in config["training"]["communication"]


# --- the paper's published fuser layout ------------------------------------------------------------


def reference_state(source_width, target_width, target_heads, hidden, inner, num_layers, seed):
    """Random weights under the reference C2CProjector's parameter names."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.3

    state = {}
    for side in ("key", "value"):
        state[f"{side}_in.weight"], state[f"{side}_in.bias"] = r(hidden, source_width + target_width), r(hidden)

        def block(prefix, inner_width):
            state[f"{prefix}.norm.weight"] = 1 + r(hidden)
            state[f"{prefix}.w1.weight"] = r(inner_width, hidden)
            state[f"{prefix}.w2.weight"] = r(hidden, inner_width)

        block(f"{side}_mlp1.blocks.0", inner)
        block(f"{side}_scalar_mlp2.blocks.0", hidden)
        for k in range(num_layers - 2):
            block(f"{side}_proj_mlp2.blocks.{k}", inner)
        state[f"{side}_scalar_head.weight"], state[f"{side}_scalar_head.bias"] = r(target_heads, hidden), r(target_heads)
        state[f"{side}_proj_out.weight"], state[f"{side}_proj_out.bias"] = r(target_width, hidden), r(target_width)
    state["key_gate_logit"] = torch.tensor(0.7)
    state["value_gate_logit"] = torch.tensor(-0.2 if seed % 2 else 0.4)
    state["gate_temperature"] = torch.tensor(0.001)
    return state


def write_reference(folder, pair, num_layers=4, hidden=12, inner=20, skip_layer=None):
    folder.mkdir(parents=True, exist_ok=True)
    s, r = pair.sharer.facts, pair.receiver.facts
    mapping = {}
    for layer in range(r.num_layers):
        if layer == skip_layer:
            continue
        source = min(max(s.num_layers - r.num_layers + layer, 0), s.num_layers - 1)
        mapping[str(layer)] = [[source, layer]]
        args = {
            "source_dim": s.head_dim, "target_dim": r.head_dim, "source_num_heads": s.num_kv_heads,
            "target_num_heads": r.num_kv_heads, "intermediate_dim": inner, "hidden_dim": hidden, "num_layers": num_layers,
            "dropout": 0.1, "initial_temperature": 1.0, "final_temperature": 0.001, "anneal_steps": 1929,
            "dtype": {"__type__": "torch.dtype", "value": "float32"},
        }
        (folder / f"projector_{layer}.json").write_text(json.dumps({"class": "C2CProjector", "init_args": args}))
        state = reference_state(s.num_kv_heads * s.head_dim, r.num_kv_heads * r.head_dim, r.num_kv_heads, hidden, inner, num_layers, layer)
        torch.save(state, folder / f"projector_{layer}.pt")
    (folder / "projector_config.json").write_text(json.dumps({"0": {"1": mapping}}))
    return folder


def paper_formula(state, source_kv, target_kv, num_layers):
    """The reference C2CProjector's forward at inference, written out from the paper's formula."""

    def lin(x, name):
        return x @ state[f"{name}.weight"].T + state[f"{name}.bias"]

    def block(x, prefix):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * state[f"{prefix}.norm.weight"]
        h = torch.nn.functional.gelu(h @ state[f"{prefix}.w1.weight"].T) @ state[f"{prefix}.w2.weight"].T
        return x + h

    out = []
    for side, source, target in (("key", source_kv[0], target_kv[0]), ("value", source_kv[1], target_kv[1])):
        b, hs, n, ds = source.shape
        _, ht, _, dt = target.shape
        z = torch.cat([source.transpose(1, 2).reshape(b, n, hs * ds), target.transpose(1, 2).reshape(b, n, ht * dt)], -1)
        x = block(lin(z, f"{side}_in"), f"{side}_mlp1.blocks.0")
        y = x
        for k in range(num_layers - 2):
            y = block(y, f"{side}_proj_mlp2.blocks.{k}")
        projected = lin(y, f"{side}_proj_out").reshape(b, n, ht, dt).transpose(1, 2)
        weight = torch.sigmoid(lin(block(x, f"{side}_scalar_mlp2.blocks.0"), f"{side}_scalar_head")).permute(0, 2, 1)[..., None]
        gate = float(state[f"{side}_gate_logit"] > 0)
        out.append(target + gate * weight * projected)
    return out


@pytest.mark.parametrize("num_layers", [3, 4])
def test_reference_fuser_converts_and_matches_the_papers_formula(pair, tmp_path, num_layers):
    folder = write_reference(tmp_path / "final", pair, num_layers=num_layers, skip_layer=5)
    assert reference.is_reference_layout(folder)
    out = reference.convert_reference(folder, pair.sharer.facts, pair.receiver.facts, pair.name, out=tmp_path / "converted")
    again = reference.convert_reference(folder, pair.sharer.facts, pair.receiver.facts, pair.name, out=tmp_path / "converted")
    assert again == out
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "fuser.safetensors"]  # no pickle in kvviz's form
    fuser = load_fuser(out, pair.sharer.facts, pair.receiver.facts)
    config = fuser.config
    assert config.source == "reference" and config.bias and config.intermediate == 20 and config.proj_blocks == num_layers - 2
    assert config.layer_map[5] == -1 and config.layer_map[:5] == [0, 0, 0, 1, 2]
    generator = torch.Generator().manual_seed(0)
    s, r = pair.sharer.facts, pair.receiver.facts
    receiver = [(torch.randn(1, r.num_kv_heads, 6, r.head_dim, generator=generator),) * 2 for _ in range(r.num_layers)]
    receiver = [(k, torch.randn(k.shape, generator=generator)) for k, _ in receiver]
    sharer = [(torch.randn(1, s.num_kv_heads, 6, s.head_dim, generator=generator), torch.randn(1, s.num_kv_heads, 6, s.head_dim, generator=generator)) for _ in range(s.num_layers)]
    positions = [1, 2, 3, 4]
    with torch.no_grad():
        fused, records = fuser.fuse(receiver, sharer, positions, positions)
    for layer in range(r.num_layers):
        k, v = fused[layer]
        if layer == 5:  # no projector for this layer: untouched, and reported closed
            assert torch.equal(k, receiver[layer][0]) and not records[layer].gate_k_open
            continue
        state = torch.load(folder / f"projector_{layer}.pt", weights_only=True)
        source = config.layer_map[layer]
        want_k, want_v = paper_formula(
            state,
            (sharer[source][0][:, :, positions], sharer[source][1][:, :, positions]),
            (receiver[layer][0][:, :, positions], receiver[layer][1][:, :, positions]),
            num_layers,
        )
        assert torch.allclose(k[:, :, positions], want_k, atol=1e-5), layer
        assert torch.allclose(v[:, :, positions], want_v, atol=1e-5), layer
        assert torch.equal(k[:, :, [0, 5]], receiver[layer][0][:, :, [0, 5]])
        assert records[layer].gate_k_logit == pytest.approx(0.7) and records[layer].gate_k_open


def test_reference_fuser_errors_are_clear(pair, tmp_path):
    folder = write_reference(tmp_path / "final", pair)
    other = mixed_pair()
    # a pair whose KV shapes differ (receiver and sharer swapped)
    with pytest.raises(FuserError, match="does not fit|another pair|outside"):
        reference.convert_reference(folder, other.receiver.facts, other.sharer.facts, "swapped", out=tmp_path / "x")
    (folder / "projector_2.pt").write_bytes(b"not a torch file")
    with pytest.raises(FuserError, match="corrupt"):
        reference.convert_reference(folder, pair.sharer.facts, pair.receiver.facts, out=tmp_path / "y")

    class Evil:
        def __reduce__(self):
            return (print, ("pickled code ran",))

    torch.save({"key_in.weight": Evil()}, folder / "projector_2.pt")
    with pytest.raises(FuserError, match="weights_only"):
        reference.convert_reference(folder, pair.sharer.facts, pair.receiver.facts, out=tmp_path / "z")
    write_reference(folder, pair)
    state = torch.load(folder / "projector_1.pt", weights_only=True)
    state["key_in.weight"] = state["key_in.weight"][:, :3]  # weights that do not fit the config
    torch.save(state, folder / "projector_1.pt")
    with pytest.raises(FuserError, match="does not match its weights"):
        reference.convert_reference(folder, pair.sharer.facts, pair.receiver.facts, out=tmp_path / "w")
    write_reference(folder, pair)
    (folder / "projector_0.json").write_text(json.dumps({"class": "AllInOneProjector", "init_args": {}}))
    with pytest.raises(FuserError, match="AllInOneProjector"):
        reference.convert_reference(folder, pair.sharer.facts, pair.receiver.facts, out=tmp_path / "v")
    with pytest.raises(FuserError, match="paper's layout"):
        load_fuser(folder)


def test_reference_fuser_runs_through_the_handoff(pair, tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "converted_root", lambda: tmp_path / "cache")
    folder = write_reference(tmp_path / "final", pair)
    request = HandoffRequest(query=QUERY, generation=GenerationSettings(max_new_tokens=4), options={"c2c": {"fuser": str(folder)}})
    result = run_handoff("c2c", pair, request)
    assert result.applicable, result.reason
    assert result.details["fuser_source"] == "reference" and result.details["receiver_sees_context"] is True
    assert len(list((tmp_path / "cache").iterdir())) == 1  # converted once, into the cache
    assert run_handoff("c2c", pair, request).answer_ids == result.answer_ids
    control = run_handoff("c2c_control", pair, request)
    assert not control.applicable and "control" in control.reason


def test_published_fuser_for_the_qwen_pair_says_how_to_get_it_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(locate, "SHIPPED_FUSERS", tmp_path / "no-assets")
    base = mixed_pair()
    sharer_name, receiver_name = next(iter(reference.PUBLISHED_FUSERS))
    spec = PairSpec(name="qwen", sharer=sharer_name, receiver=receiver_name, description="tiny stand-ins")
    sharer = type(base.sharer)(**{**base.sharer.__dict__, "name": sharer_name})
    receiver = type(base.receiver)(**{**base.receiver.__dict__, "name": receiver_name})
    pair = LoadedPair(spec=spec, sharer=sharer, receiver=receiver, same_shape_sender=sharer)
    request = HandoffRequest(query=QUERY, generation=GenerationSettings(max_new_tokens=4))
    result = run_handoff("c2c", pair, request)
    assert not result.applicable
    assert "nics-efc/C2C_Fuser" in result.reason and "huggingface-cli download" in result.reason
    control = run_handoff("c2c_control", pair, request)
    assert not control.applicable and "no control" in control.reason
    assert reference.is_hub_path("nics-efc/C2C_Fuser/qwen3_0.6b+qwen2.5_0.5b_Fuser/final")
    assert not reference.is_hub_path(str(tmp_path)) and not reference.is_hub_path("Qwen/Qwen3-0.6B")


# --- multiple choice by likelihood, and its communication gain --------------------------------------

MC_RECORDS = [
    {"question": "Which gas do plants take in?", "choices": ["oxygen", "carbon dioxide", "helium", "neon"], "answer": 1},
    {"question": "What melts ice fastest?", "choices": ["salt", "sand", "wood"], "answer": 0},
    {"question": "Which planet is largest?", "choices": ["Mars", "Venus", "Jupiter", "Mercury"], "answer": 2},
    {"question": "What do bees make?", "choices": ["silk", "honey", "wax paper", "milk"], "answer": 1},
]


def save_shared_fusers(pair, folder, gate: float):
    """A C2C fuser trained (like) the paper's way, both models reading the prompt, and its control."""
    for kind, control in (("c2c", False), ("control", True)):
        fuser = trained_like(new_fuser(pair.sharer.facts, pair.receiver.facts, width=16, pair=pair.name, control=control))
        fuser.config.training = {"receiver_sees_context": True, "context": "shared"}
        with torch.no_grad():
            fuser.gate_logits.fill_(gate)
        fuser.save(folder / kind)
    return folder / "c2c"


def mc_file(tmp_path):
    path = tmp_path / "mc.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in MC_RECORDS))
    return path


def mc_request_for(folder):
    from kvviz.handoffs.registry import build_request

    return lambda query, context: build_request(query, context, 1, options={"c2c": {"fuser": str(folder)}})


@pytest.mark.parametrize("gate", [-2.0, 2.0])
def test_c2c_choice_likelihood_equals_the_receivers_with_closed_gates_only(pair, tmp_path, gate):
    from kvviz.data import choice_query, load_dataset
    from kvviz.studies.bench.scoring import choice_likelihoods

    folder = save_shared_fusers(pair, tmp_path / "run", gate)
    record = load_dataset(mc_file(tmp_path))[0]
    request = mc_request_for(folder)(choice_query(record), None)
    scores = {
        name: choice_likelihoods(pair, record, name, request, run_handoff(name, pair, request))
        for name in ("receiver", "c2c", "c2c_control")
    }
    assert all(s is not None and len(s) == len(record.choices) for s in scores.values())
    if gate < 0:  # closed gates: the fused cache is the receiver's own
        assert scores["c2c"] == pytest.approx(scores["receiver"], abs=1e-5)
        assert scores["c2c_control"] == pytest.approx(scores["receiver"], abs=1e-5)
    else:
        assert scores["c2c"] != pytest.approx(scores["receiver"], abs=1e-4)


def test_mc_likelihood_has_the_other_question_row_and_the_communication_gain(pair, tmp_path):
    from kvviz.studies.c2c.evaluate import OTHER_QUESTION, mc_likelihood

    path = mc_file(tmp_path)
    names = ["receiver", "c2c", "c2c_control"]
    opened = save_shared_fusers(pair, tmp_path / "open", 2.0)
    table = mc_likelihood(pair, names, [str(path)], 4, 0, mc_request_for(opened), opened, lambda _: None)[str(path)]
    assert list(table["rows"]) == names + [OTHER_QUESTION] and not table["skipped"]
    assert all(row["n"] == 4 and len(row["per_question"]) == 4 and len(row["gold_score"]) == 4 for row in table["rows"].values())
    assert all(table["partner"][i] != i for i in range(4))
    rows = table["rows"]
    # the sharer read another question: C2C's scores move; the control has no sharer to move it
    assert rows[OTHER_QUESTION]["gold_score"] != pytest.approx(rows["c2c"]["gold_score"], abs=1e-5)
    gain = next(c for c in table["comparisons"] if (c["first"], c["second"]) == ("c2c", OTHER_QUESTION))
    assert gain["accuracy"]["difference"] == pytest.approx(rows["c2c"]["accuracy"] - rows[OTHER_QUESTION]["accuracy"])
    assert gain["gold_score"]["ci95"][0] <= gain["gold_score"]["difference"] <= gain["gold_score"]["ci95"][1]
    assert {"only_first", "only_second", "mcnemar_p"} <= set(gain["accuracy"])
    # closed gates: C2C, C2C with another question and the receiver alone score alike, so the gain is 0
    closed = save_shared_fusers(pair, tmp_path / "closed", -2.0)
    table = mc_likelihood(pair, names, [str(path)], 4, 0, mc_request_for(closed), closed, lambda _: None)[str(path)]
    rows = table["rows"]
    assert rows["c2c"]["gold_score"] == pytest.approx(rows["receiver"]["gold_score"], abs=1e-5)
    assert rows[OTHER_QUESTION]["gold_score"] == pytest.approx(rows["receiver"]["gold_score"], abs=1e-5)
    gain = next(c for c in table["comparisons"] if (c["first"], c["second"]) == ("c2c", OTHER_QUESTION))
    assert gain["accuracy"]["difference"] == 0 and gain["accuracy"]["mcnemar_p"] == 1.0


def test_paired_comparison_of_accuracies_and_scores():
    from kvviz.data.stats import paired_comparison

    right = paired_comparison([1, 1, 0, 1, 0], [0, 1, 0, 0, 0], resamples=200)
    assert right["difference"] == pytest.approx(0.4) and right["only_first"] == 2 and right["only_second"] == 0
    assert right["mcnemar_p"] == pytest.approx(0.5) and right["ci95"][0] <= 0.4 <= right["ci95"][1]
    scores = paired_comparison([0.5, -0.25], [0.25, -0.5], resamples=200)
    assert scores["difference"] == pytest.approx(0.25) and scores["ci95"] == pytest.approx([0.25, 0.25])
    assert "mcnemar_p" not in scores
    with pytest.raises(ValueError):
        paired_comparison([1, 0], [1])


def test_the_c2c_paper_table_pairs_two_reports_per_question(tmp_path):
    import importlib.util

    path = REPO_ROOT / "research" / "c2c_paper_table.py"
    spec = importlib.util.spec_from_file_location("c2c_paper_table", path)
    table_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table_script)

    def row(correct):
        return {"per_question": correct, "gold_score": [-0.1 * (1 + c) for c in correct]}

    def report(rows):
        return {"mc_likelihood": {d: {"ids": ["a", "b", "c", "d"], "rows": {k: row(v) for k, v in rows.items()}} for d in ("arc_challenge", "openbookqa")}}

    receiver = [0, 1, 0, 0]
    c2c = report({"receiver": receiver, "c2c": [1, 1, 1, 0], "c2c_other_question": [1, 1, 0, 0], "c2c_control": [0, 1, 1, 0]})
    self_fusion = report({"receiver": receiver, "c2c": [1, 1, 0, 1], "c2c_other_question": [1, 0, 0, 1]})
    merged = table_script.per_question(c2c, self_fusion)
    assert set(merged) == {"arc_challenge", "openbookqa", "all"}
    assert merged["arc_challenge"]["self-fusion"]["correct"] == [1, 1, 0, 1]
    assert len(merged["all"]["c2c"]["correct"]) == 8 and "sharer" not in merged["all"]
    text = table_script.markdown(merged)
    assert "| ARC-Challenge | 4 |" in text and "41.0 / 49.5 / 54.5" in text
    # C2C 3/4 vs C2C with another question 2/4 on each dataset: +25 points, 1 question only C2C got right
    assert "| communication gain: C2C − C2C with another question | +25.0 [" in text and ", 1/0, p 1 |" in text
    # a self-fusion report on other questions (its receiver row differs) is refused
    other = report({"receiver": [1, 1, 1, 1], "c2c": [1, 1, 0, 1]})
    with pytest.raises(SystemExit, match="receiver rows differ"):
        table_script.per_question(c2c, other)
    # one side from two reports (say C2C and its control run apart): rows are joined per dataset
    (tmp_path / "a.json").write_text(json.dumps(report({"receiver": receiver, "c2c": [1, 1, 1, 0]})))
    (tmp_path / "b.json").write_text(json.dumps(report({"receiver": receiver, "c2c_control": [0, 1, 1, 0]})))
    joined = table_script.merged_reports([tmp_path / "a.json", tmp_path / "b.json"])
    assert set(joined["mc_likelihood"]["openbookqa"]["rows"]) == {"receiver", "c2c", "c2c_control"}
    (tmp_path / "c.json").write_text(json.dumps(report({"receiver": [1, 1, 1, 1]})))
    with pytest.raises(SystemExit, match="row receiver differs"):
        table_script.merged_reports([tmp_path / "a.json", tmp_path / "c.json"])
