"""Training the KV translator through the frozen receiver (kvviz.studies.c2c: ``translator_train``'s
receiver-side loss, ``translator_data``'s notes, ``train_translator``'s resumable legs), and the
translator with per receiver layer sharer layers (``sources``). Tiny models; seconds."""

from __future__ import annotations

import argparse
import json
import random

import pytest
import torch

from kvviz.core.prompts import build_segments
from kvviz.data import whereabouts
from kvviz.handoffs.translate import align as tr_align
from kvviz.handoffs.translate import prefix as tr_prefix
from kvviz.handoffs.translate import ridge as tr_ridge
from kvviz.handoffs.translate import translator as tr
from kvviz.studies.c2c import train_translator as tt
from kvviz.studies.c2c import translator_data as td
from kvviz.studies.c2c.translator_loss import FollowLoss, ReceiverLoss, teacher_targets
from tests.unit.test_translator import CONTEXT, QUERY, OwnKV, random_translator

NOTES = [
    td.Note("whereabouts", "Mira is at the Louvre.", "Which country is Mira in?", "France"),
    td.Note("continue", "The library opens at nine.", None, "It closes at six in the evening on weekdays."),
    td.Note("recall", "The code for locker 12 is 4471.", "What is the code for locker 12?", "4471"),
]


def own_kv_translator(pair, translator, context):
    alignment = tr_align.align_context(pair.receiver.tokenizer, pair.sharer.tokenizer, context)
    own = tr_align.read_kv(pair.receiver, [alignment.receiver_ids])
    keys = torch.stack([k[0, :, alignment.own_count:] for k, _ in own])
    values = torch.stack([v[0, :, alignment.own_count:] for _, v in own])
    exact = OwnKV(translator.config, keys, values)
    with torch.no_grad():
        exact.gate_logits.fill_(30.0)
    return exact


def test_the_receiver_side_loss_is_zero_kl_for_the_receivers_own_kv(mixed_tiny_pair, one_thread):
    """Skyline is the teacher: a map that gives the receiver its own KV of the note matches it (KL ~0);
    a random map does not, and its gradient reaches the map, the weights and the gates only."""
    pair = mixed_tiny_pair
    translator = random_translator(pair)
    read = build_segments(pair.receiver.tokenizer, QUERY).query_ids
    target = pair.receiver.tokenizer(" the garden shed", add_special_tokens=False)["input_ids"]
    loss_fn = ReceiverLoss(kd_weight=1.0, ce_weight=1.0, top_k=8)
    exact = own_kv_translator(pair, translator, CONTEXT)
    with torch.no_grad():
        _, parts = loss_fn(pair, exact, CONTEXT, read, target)
    assert parts["kd"] < 1e-5
    loss, parts = loss_fn(pair, translator, CONTEXT, read, target)
    assert parts["kd"] > 1e-3
    loss.backward()
    assert translator.up.grad.abs().sum() > 0 and translator.gate_logits.grad.abs().sum() > 0
    assert all(p.grad is None for p in pair.receiver.model.parameters())
    alignment = tr_align.align_context(pair.receiver.tokenizer, pair.sharer.tokenizer, CONTEXT)
    teacher = teacher_targets(pair.receiver, alignment.receiver_ids, read, target, 4)
    assert teacher.candidates.shape == (len(target), 4)
    assert all(int(c[g]) == t for c, g, t in zip(teacher.candidates, teacher.gold, target))  # gold always a candidate
    assert torch.allclose(teacher.log_probs.exp().sum(-1), torch.ones(len(target)))


def test_a_swap_pair_asks_each_note_for_its_own_answer(mixed_tiny_pair, one_thread):
    """A note with a swap twin: the receiver loss of both, plus the follow hinge at the first answer
    token, whose gradient reaches the map; without the hinge, the two receiver losses' mean."""
    pair = mixed_tiny_pair
    translator = random_translator(pair)
    twin = td.Note("recall", "The code for locker 12 is 8125.", "What is the code for locker 12?", "8125")
    pair_note = td.Note("recall", NOTES[2].context, NOTES[2].question, NOTES[2].target, twin=twin)
    receiver_loss = ReceiverLoss(top_k=8)
    loss, parts = FollowLoss(receiver_loss, follow_weight=1.0, follow_margin=2.0)(pair, translator, pair_note)
    assert {"kd", "ce", "follow", "follow_gap"} <= set(parts) and parts["follow"] > 0
    loss.backward()
    assert translator.up.grad.abs().sum() > 0
    tokenizer = pair.receiver.tokenizer
    alone = [receiver_loss(pair, translator, n.context, *td.target_ids(tokenizer, n))[0] for n in (NOTES[2], twin)]
    without, parts = FollowLoss(receiver_loss, follow_weight=0.0)(pair, translator, pair_note)
    assert "follow" not in parts and torch.allclose(without, (alone[0] + alone[1]) / 2)
    plain, _ = FollowLoss(receiver_loss, follow_weight=0.0, harm_weight=0.0)(pair, translator, NOTES[2])
    assert torch.allclose(plain, alone[0])


def test_the_harm_guard_costs_nothing_for_the_receiver_alone_and_is_one_sided(mixed_tiny_pair, one_thread):
    """A mismatched note read through a side branch at gate 0 is the receiver alone: its excess NLL
    over the receiver alone is 0 and the guard is 0; a random splice
    moves the answer's NLL, and the guard acts only past its tolerance, its gradient reaching the map."""
    from tests.unit.test_translator_side import side_translator

    pair = mixed_tiny_pair
    note = td.Note("mismatched", "The bakery on Elm Street sells rye bread.", NOTES[2].question, NOTES[2].target)
    guard = FollowLoss(ReceiverLoss(top_k=8), harm_weight=1.0, harm_tolerance=0.1)
    loss, parts = guard(pair, side_translator(pair), note)
    assert abs(parts["harm_excess"]) < 1e-5 and parts["harm"] == 0.0 and float(loss) == 0.0
    translator = random_translator(pair)
    _, parts = guard(pair, translator, note)
    excess = parts["harm_excess"]
    assert abs(excess) > 1e-4  # a random map's note moves the answer's NLL away from the receiver alone's
    above = FollowLoss(ReceiverLoss(top_k=8), harm_weight=1.0, harm_tolerance=excess + 1.0)
    loss, parts = above(pair, translator, note)
    assert parts["harm"] == 0.0 and float(loss) == 0.0  # within the tolerance: nothing to push
    below = FollowLoss(ReceiverLoss(top_k=8), harm_weight=2.0, harm_tolerance=excess - 1.0)
    loss, parts = below(pair, translator, note)
    assert parts["harm"] == pytest.approx(1.0, abs=1e-4) and float(loss) == pytest.approx(2.0, abs=1e-3)
    loss.backward()
    assert translator.up.grad.abs().sum() > 0


def test_notes_read_on_or_answer_and_name_nothing_held_out(mixed_tiny_pair, shared_data):
    pair = mixed_tiny_pair
    read, target = td.target_ids(pair.receiver.tokenizer, NOTES[1])
    assert len(read) == 1 and 0 < len(target) <= td.CONTINUATION_TOKENS
    read, target = td.target_ids(pair.receiver.tokenizer, NOTES[0])
    assert read == build_segments(pair.receiver.tokenizer, NOTES[0].question).query_ids and target
    note, rest = td.split_continuation("One sentence here is short. Another one follows it. And a third.", random.Random(0))
    assert note.endswith(".") and rest and f"{note} {rest}".startswith("One sentence")
    allowed = td.heldout_filter()
    held_landmark = whereabouts.places("landmark", "heldout")[0][0]
    assert not allowed(f"Ada is at {held_landmark}.") and not allowed(f"{whereabouts.first_names('heldout')[0]} is here.")
    assert allowed(f"Ada is at {whereabouts.places('landmark', 'train')[0][0]}.")
    notes = td.mixture(60, seed=1, mix={"whereabouts": 2, "unneeded": 1, "who": 1, "recall": 1})
    assert len(notes) == 60 and td.mixture(60, seed=1, mix={"whereabouts": 2, "unneeded": 1, "who": 1, "recall": 1}) == notes
    assert {n.kind for n in notes} == {"whereabouts", "unneeded", "who", "recall"}
    assert all(allowed(n.context) for n in notes)
    unneeded = [n for n in notes if n.kind == "unneeded"]
    assert all(n.question.split(" in?")[0].removeprefix("Which country is ") not in n.context for n in unneeded)
    with pytest.raises(ValueError, match="unknown kinds"):
        td.mixture(10, mix={"poetry": 1.0})


def leg_args(tmp_path, init, **changes):
    values = dict(out=str(tmp_path / "run"), init=str(init), pair="tiny", device="cpu", minutes=60.0, steps=2,
                  save_minutes=60.0, notes=len(NOTES), epochs=4, mix="", batch=2, lr=1e-3, gate_lr=0.01, kd_weight=1.0,
                  ce_weight=1.0, top_k=8, validation=0, seed=0, threads=1, argv=[], no_twins=False, follow_weight=1.0,
                  follow_margin=2.0, harm_weight=1.0, harm_tolerance=0.1, attach="splice")
    values.update(changes)
    return argparse.Namespace(**values)


def weights_of(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / tr.WEIGHTS_FILE))


def test_two_legs_end_where_one_leg_of_their_steps_does(mixed_tiny_pair, one_thread, tmp_path):
    """A leg checkpoints and the next resumes exactly: 2 + 2 steps give the weights and optimiser
    state 4 steps give; legs.jsonl has one line per leg; the leg's translator loads."""
    pair = mixed_tiny_pair
    init = random_translator(pair).save(tmp_path / "init", dtype=torch.float32)
    quiet = lambda message: None  # noqa: E731
    first = tt.run_leg(pair, leg_args(tmp_path, init), quiet, notes=NOTES)
    second = tt.run_leg(pair, leg_args(tmp_path, ""), quiet, notes=NOTES)
    assert (first["step"], second["step"], second["cursor"]) == (2, 4, 8) and second["leg"] == 2
    whole = tt.run_leg(pair, leg_args(tmp_path, init, out=str(tmp_path / "whole"), steps=4), quiet, notes=NOTES)
    assert whole["step"] == 4
    for name in ("state", "leg-2"):
        a, b = weights_of(tmp_path / "run" / name), weights_of(tmp_path / "whole" / ("state" if name == "state" else "leg-1"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / run / "state" / "optimizer.safetensors")) for run in ("run", "whole"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(weights_of(init)["up"], weights_of(tmp_path / "run" / "leg-2")["up"])  # it trained
    assert [json.loads(line)["leg"] for line in (tmp_path / "run" / "legs.jsonl").read_text().splitlines()] == [1, 2]
    trained = tr.load_translator(tmp_path / "run" / "leg-2", pair.sharer.facts, pair.receiver.facts, pair.name)
    assert trained.config.training["receiver_side"]["steps"] == 4


def test_a_corrupt_or_foreign_training_state_is_refused(mixed_tiny_pair, one_thread, tmp_path):
    pair = mixed_tiny_pair
    init = random_translator(pair).save(tmp_path / "init", dtype=torch.float32)
    quiet = lambda message: None  # noqa: E731
    tt.run_leg(pair, leg_args(tmp_path, init, steps=1), quiet, notes=NOTES)
    with pytest.raises(tt.TrainingStateError, match="other settings"):  # a flag that would change the run
        tt.run_leg(pair, leg_args(tmp_path, "", lr=5e-4, argv=["--lr", "5e-4"]), quiet, notes=NOTES)
    other = random_translator(pair, seed=3).save(tmp_path / "other", dtype=torch.float32)
    with pytest.raises(tt.TrainingStateError, match="init"):
        tt.run_leg(pair, leg_args(tmp_path, other), quiet, notes=NOTES)
    state = tmp_path / "run" / "state"
    progress = json.loads((state / "progress.json").read_text())
    (state / "progress.json").write_text(json.dumps({**progress, "run": "0123456789abcdef"}))
    with pytest.raises(tt.TrainingStateError, match="another run"):
        tt.run_leg(pair, leg_args(tmp_path, ""), quiet, notes=NOTES)
    (state / "progress.json").write_text(json.dumps(progress))
    (state / "optimizer.safetensors").write_bytes(b"\x00" * 32)
    with pytest.raises(tt.TrainingStateError, match="corrupt"):
        tt.run_leg(pair, leg_args(tmp_path, ""), quiet, notes=NOTES)
    (state / "progress.json").write_text("{not json")
    with pytest.raises(tt.TrainingStateError, match="No readable training state"):
        tt.run_leg(pair, leg_args(tmp_path, ""), quiet, notes=NOTES)
    with pytest.raises(ValueError, match="--init"):
        tt.run_leg(pair, leg_args(tmp_path, "", out=str(tmp_path / "empty")), quiet, notes=NOTES)


def test_a_leg_reports_held_out_numbers(mixed_tiny_pair, one_thread, tmp_path, shared_data):
    pair = mixed_tiny_pair
    numbers = tt.validate(pair, random_translator(pair), 2)
    assert set(numbers) == {"whereabouts", "recall", "passages"}  # passages: Dolly's extractive ones, never trained on
    assert set(numbers["whereabouts"]["follow"]) == {"control", "translator"} and "gain" in numbers["recall"]
    assert 0.0 <= numbers["recall"]["translator"]["rate"] <= 1.0


# --- sender layers per receiver layer ------------------------------------------------------------


def routed_translator(pair, sources=None):
    sources = sources or [[0, 2], [1, 3], [0, 3], [2, 3], [0, 1], [1, 2]]
    layers = sorted({s for chosen in sources for s in chosen})
    return tr.new_translator(pair.sharer.facts, pair.receiver.facts, pair.name, pair.sharer.tokenizer,
                             sharer_layers=layers, sources=sources)


def test_a_routed_translator_fits_each_receiver_layer_from_its_own_sharer_layers(mixed_tiny_pair):
    """Ridge per receiver layer recovers a map that reads only its sources; the translator saves and
    loads (version 2) and its gates closed still give the receiver alone."""
    pair = mixed_tiny_pair
    translator = routed_translator(pair)
    config, columns = translator.config, translator.config.source_columns()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4000, config.in_width, generator=generator)
    truth = [torch.randn(len(c), 2 * config.kv_width, generator=generator) * 0.1 for c in columns]
    y = torch.cat([x[:, c] @ w for c, w in zip(columns, truth)], dim=1) + 3.0
    stats = tr_ridge.RidgeStats(config.in_width, config.out_width)
    stats.add(x, y)
    tr_ridge.install_fit(translator, tr_ridge.fit_ridge_routed(stats, config, 1e-6))
    with torch.no_grad():
        predicted = translator.standardised(x) * translator.y_scale + translator.y_mean
    assert float(((predicted - y) ** 2).mean() / y.var(0).mean()) < 1e-4
    assert tr_ridge.r_squared(translator, x, y, pair.receiver.facts.num_layers)["k"] > 0.999
    assert translator.num_parameters < tr.KVTranslator(tr.TranslatorConfig(**{**config.to_dict(), "sources": None})).num_parameters
    folder = translator.save(tmp := (pair_tmp := __import__("tempfile").mkdtemp()) + "/routed")
    loaded = tr.load_translator(folder, pair.sharer.facts, pair.receiver.facts, pair.name)
    assert tr.read_config(folder).version == 2 and loaded.routed
    for a, b in zip(translator(x[:5]), loaded(x[:5])):
        assert torch.allclose(a, b, atol=2e-2, rtol=2e-2)
    alignment = tr_align.align_context(pair.receiver.tokenizer, pair.sharer.tokenizer, CONTEXT)
    alone = build_segments(pair.receiver.tokenizer, QUERY)
    from kvviz.runtime.cache import KVState
    from kvviz.runtime.decode import full_logits, prefill

    state = KVState()
    prefill(pair.receiver, state, alone.context_ids, need_logits=False)
    expected = full_logits(pair.receiver, state, alone.query_ids)
    closed, _, _ = tr_prefix.translate(pair, loaded, alignment, gates=[0.0] * pair.receiver.facts.num_layers)
    assert torch.allclose(full_logits(pair.receiver, closed.state, alone.query_ids), expected, atol=1e-4)
    assert pair_tmp and tmp


@pytest.mark.parametrize("sources, match", [
    ([[0, 2]] * 5, "each of the 6"),
    ([[0, 2]] * 5 + [[1]], "same number"),
    ([[0, 0]] * 6, "distinct"),
])
def test_bad_sources_are_refused(mixed_tiny_pair, sources, match):
    pair = mixed_tiny_pair
    with pytest.raises(tr.TranslatorError, match=match):
        tr.new_translator(pair.sharer.facts, pair.receiver.facts, pair.name, sharer_layers=[0, 1, 2], sources=sources)
