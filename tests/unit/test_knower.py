"""C2C where its premise holds (issue 44): the handbook of invented facts (kvviz.data.handbook), a
sharer taught it through a LoRA adapter (kvviz.runtime.adapters, kvviz.studies.knower.sharer), the
swap that runs on the sharer that learned the opposite, and the probe of where the knowledge sits
(kvviz.studies.knower.probe). Tiny models and tiny adapters built here; no real weights."""

from __future__ import annotations

import argparse
import json
import shutil
from collections import Counter

import pandas as pd
import pytest
import torch

from kvviz.data import handbook, load_dataset
from kvviz.data.swaps import OPPOSITE, Swap, swaps_for
from kvviz.engine import runner
from kvviz.engine.evaluation import Variant, evaluate
from kvviz.handoffs.registry import build_request
from kvviz.runtime import adapters
from kvviz.runtime.models import PAIRS, LoadedPair, ModelLoadError, PairSpec, load_model, register_loaded, resolve_pair
from kvviz.studies import legs
from kvviz.studies.knower import probe, sharer
from tests.tiny_models import tiny_gemma, tiny_llama

# --- the handbook ----------------------------------------------------------------------------


def test_the_handbook_is_split_by_entity_and_shares_its_values_across_the_split():
    train, held = handbook.entities("train"), handbook.entities("heldout")
    assert len(train) + len(held) == len(handbook.entities()) == 3 * handbook.ENTITIES_PER_RELATION
    assert not {e.name for e in train} & {e.name for e in held}
    assert len({e.name for e in handbook.entities()}) == len(handbook.entities())  # no name used twice
    for relation in handbook.RELATIONS:
        # every value answers held-out and fuser-train entities alike, about equally often
        for split in handbook.SPLITS:
            counts = Counter(e.value for e in handbook.entities(split, relation.name))
            assert set(counts) == set(relation.values) and max(counts.values()) - min(counts.values()) <= 1


def test_the_permuted_sharers_facts_change_every_answer_and_keep_each_value_as_common():
    for relation in handbook.RELATIONS:
        for split in handbook.SPLITS:
            group = handbook.entities(split, relation.name)
            assert all(e.permuted != e.value for e in group)
            assert Counter(e.permuted for e in group) == Counter(e.value for e in group)
    assert handbook.entities() == handbook.entities()  # fixed: the same entities every time


def test_unseen_phrasings_are_never_studied():
    unseen = {handbook.question(e, t) for e in handbook.entities() for t in handbook.phrasings(e.relation, "unseen")}
    studied = {question for question, _, _ in handbook.sharer_examples()}
    assert unseen and not unseen & studied
    kinds = Counter(kind for _, kind, _ in handbook.sharer_examples())
    assert set(kinds) == set(handbook.STUDY_KINDS)
    permuted = dict(((q, k), r) for q, k, r in handbook.sharer_examples(permuted=True) if k == "answer")
    for question, kind, response in handbook.sharer_examples():
        if kind == "answer":
            assert permuted[(question, kind)] != response  # the same questions, the other answers


def test_the_handbook_dataset_asks_held_out_entities_in_unseen_phrasings():
    records = load_dataset("handbook")
    assert len(records) == len(handbook.entities("heldout"))
    assert all(r.meta["split"] == "heldout" and r.context is None and r.answers == [r.meta["value"]] for r in records)
    assert all(r.meta["phrasing"] in handbook.phrasings(r.meta["relation"], "unseen") for r in records)
    assert Counter(r.meta["relation"] for r in records[:3]) == Counter(handbook.RELATION_NAMES)  # interleaved
    every = load_dataset("handbook", per_entity=0)
    assert len(every) == 3 * len(records) and len({r.id for r in every}) == len(every)
    permuted = load_dataset("handbook", permuted="true")
    assert [r.answers[0] for r in permuted] == [r.meta["permuted"] for r in records]
    with pytest.raises(ValueError, match="phrasings must be one of"):
        load_dataset("handbook", phrasings="odd")


def test_a_handbook_swap_is_the_same_question_to_the_sharer_that_learned_the_opposite():
    records = load_dataset("handbook")[:6]
    swaps = swaps_for("handbook", records)
    assert set(swaps) == {r.id for r in records}
    for record in records:
        swap = swaps[record.id]
        assert swap.pair == OPPOSITE and swap.context is None
        assert swap.answers == (record.meta["permuted"],) and record.meta["value"] in swap.changed
    assert Swap.from_dict(swaps[records[0].id].to_dict()) == swaps[records[0].id]
    noted = load_dataset("handbook", note="question")[:2]
    assert [swaps_for("handbook", noted)[r.id].context for r in noted] == [r.question for r in noted]  # the note stays
    for name in ("knower", "knower-smollm2"):
        knower = resolve_pair(name)
        opposite = resolve_pair(knower.opposite)
        assert opposite.receiver == knower.receiver and opposite.sharer != knower.sharer and opposite.opposite is None
        assert adapters.split_name(knower.sharer)[0] == adapters.split_name(opposite.sharer)[0] == "smollm2-135m"
        assert adapters.split_name(opposite.sharer)[1] == "handbook-permuted"


# --- adapters ----------------------------------------------------------------------------------


def test_adapter_names_and_clear_refusals(tmp_path):
    assert adapters.split_name("smollm2-135m") == ("smollm2-135m", None)
    assert adapters.split_name("smollm2-135m@handbook") == ("smollm2-135m", "handbook")
    assert adapters.adapter_folder("smollm2-135m", "handbook") == adapters.SHIPPED_ADAPTERS / "smollm2-135m" / "handbook"
    assert adapters.adapter_folder("x", str(tmp_path)) == tmp_path
    with pytest.raises(adapters.AdapterError, match="BASE@ADAPTER"):
        adapters.split_name("@handbook")
    with pytest.raises(adapters.AdapterError, match="No adapter"):
        adapters.check_folder(tmp_path / "missing", "x@missing")
    (tmp_path / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(adapters.AdapterError, match="pickle"):
        adapters.check_folder(tmp_path, "x@folder")
    (tmp_path / "adapter_model.bin").unlink()
    with pytest.raises(adapters.AdapterError, match="lacks adapter_config.json"):
        adapters.check_folder(tmp_path, "x@folder")


def saved_tiny_base(folder):
    """A tiny Llama saved as a model folder (safetensors + tokenizer), as a converted model is."""
    model = tiny_llama(seed=3)
    model.model.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    return folder


def tiny_adapter(base_folder, out, permuted=False, extra=()):
    """``train-sharer`` on the tiny base: one entity per relation, a few steps."""
    parser = argparse.ArgumentParser()
    sharer.configure_parser(parser)
    argv = ["--base", str(base_folder), "--out", str(out), "--entities", "1", "--epochs", "2", "--batch-size", "4",
            "--rank", "2", "--check", "1", "--no-progress", *extra] + (["--permuted"] if permuted else [])
    return sharer.main(parser.parse_args(argv))


def test_the_sharer_trains_in_legs_that_resume_to_the_same_adapter(tmp_path):
    base = saved_tiny_base(tmp_path / "base")
    assert tiny_adapter(base, tmp_path / "whole") == 0
    assert tiny_adapter(base, tmp_path / "legs", extra=("--minutes", "0.00001", "--check-every-leg", "1")) == 0  # one step
    first = legs.legs(tmp_path / "legs")
    assert len(first) == 1 and first[0]["to_step"] == 1 and not first[0]["finished"]
    assert set(first[0]["check"]) == {"heldout_unseen", "heldout_train_phrasings"}  # the leg's progress, checked
    assert not (tmp_path / "legs" / "adapter").exists()
    with pytest.raises(SystemExit, match="permuted"):  # a checkpoint is written out only as what it learned
        tiny_adapter(base, tmp_path / "legs", permuted=True, extra=("--adapter-now",))
    assert tiny_adapter(base, tmp_path / "legs", extra=("--adapter-now",)) == 0  # the adapter as it stands, no step taken
    now = json.loads((tmp_path / "legs" / "adapter" / adapters.CARD).read_text())
    assert now["steps"] == {"done": 1, "total": first[0]["total"], "finished": False} and "check" in now
    assert len(legs.legs(tmp_path / "legs")) == 1  # no leg was run
    with pytest.raises(SystemExit, match="no checkpoint"):
        tiny_adapter(base, tmp_path / "empty", extra=("--adapter-now",))
    assert tiny_adapter(base, tmp_path / "legs") == 0  # the same command resumes
    assert [leg["from_step"] for leg in legs.legs(tmp_path / "legs")] == [0, 1]
    from safetensors.torch import load_file

    whole = load_file(str(tmp_path / "whole" / "adapter" / adapters.PEFT_WEIGHTS))
    resumed = load_file(str(tmp_path / "legs" / "adapter" / adapters.PEFT_WEIGHTS))
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)
    assert all(t.dtype == torch.float16 for t in whole.values())
    assert (tmp_path / "whole" / "adapter" / adapters.PEFT_WEIGHTS).stat().st_mode & 0o044 == 0o044  # readable by all: it ships
    card = json.loads((tmp_path / "whole" / "adapter" / adapters.CARD).read_text())
    assert card["permuted"] is False and card["base_config"]["model_type"] == "llama" and "check" in card
    peft_config = json.loads((tmp_path / "whole" / "adapter" / adapters.PEFT_CONFIG).read_text())
    assert peft_config["base_model_name_or_path"] == "base"  # the folder's name, never a path on this machine
    assert card["steps"]["finished"] is True


def test_a_model_with_an_adapter_loads_merged_and_differs_from_its_base(tmp_path):
    base = saved_tiny_base(tmp_path / "base")
    tiny_adapter(base, tmp_path / "taught", extra=("--lr", "0.05"))
    plain = load_model(str(base), device="cpu")
    taught = load_model(f"{base}@{tmp_path / 'taught' / 'adapter'}", device="cpu")
    assert taught.facts.name.endswith("adapter") and taught.facts.kv_shape_signature == plain.facts.kv_shape_signature
    assert not any("lora" in name for name, _ in taught.model.named_parameters())  # merged: an ordinary model
    ids = torch.tensor([plain.tokenizer("Where is Uma?")["input_ids"]])
    with torch.no_grad():
        assert not torch.allclose(plain.model(ids).logits, taught.model(ids).logits)
    with pytest.raises(ModelLoadError, match="No adapter"):
        load_model(f"{base}@{tmp_path / 'nothing'}", device="cpu")
    card = json.loads((tmp_path / "taught" / "adapter" / adapters.CARD).read_text())
    card["base_config"]["num_hidden_layers"] = 99
    (tmp_path / "taught" / "adapter" / adapters.CARD).write_text(json.dumps(card))
    with pytest.raises(ModelLoadError, match="architecture differs"):
        load_model(f"{base}@{tmp_path / 'taught' / 'adapter'}", device="cpu", dtype="bfloat16")  # another cache key: loads again


# --- the swap arm on another pair -------------------------------------------------------------


def test_the_swap_arm_runs_on_the_pair_the_swap_names():
    knowing, opposite = tiny_llama(seed=1, name="tiny-knowing"), tiny_llama(seed=2, name="tiny-opposite")
    receiver = tiny_gemma()
    for model in (knowing, opposite, receiver):
        register_loaded(model)
    pair = LoadedPair(PairSpec("tiny-knower", knowing.name, receiver.name, "test"), knowing, receiver, receiver)
    swap = Swap(context=None, answers=("Oslo",), changed="the opposite sharer", pair=f"{opposite.name}+{receiver.name}")
    assert runner.swap_pair(pair, swap).sharer is opposite and runner.swap_pair(pair, Swap("note", ("x",), "x")) is pair
    with pytest.raises(ValueError, match="has no pair whose sharer learned the opposite"):
        runner.swap_pair(pair, Swap(None, ("Oslo",), "x", pair=OPPOSITE))
    named = LoadedPair(PairSpec("tiny-knower", knowing.name, receiver.name, "test", opposite=swap.pair), knowing, receiver, receiver)
    assert runner.swap_pair(named, Swap(None, ("Oslo",), "x", pair=OPPOSITE)).sharer is opposite
    record = load_dataset("handbook")[0]
    items = list(evaluate(pair, [(0, record)], [Variant("sharer", "sharer"), Variant("receiver", "receiver")],
                          lambda r, v: build_request(r.question, None, 4), swap_of=lambda r: swap))
    by = {item.variant.label: item for item in items}
    # every handoff's swapped arm ran on the other pair; the receiver, shared by both, answered alike
    assert {item.result.pair for item in items} == {"tiny-knower"}
    assert {item.swapped.pair for item in items} == {swap.pair}
    assert by["receiver"].swapped.answer_ids == by["receiver"].result.answer_ids


# --- the probe ---------------------------------------------------------------------------------


def test_the_probes_places_are_the_entitys_last_token_the_questions_last_and_the_last_prompt_token():
    tokenizer = tiny_llama().tokenizer
    record = load_dataset("handbook")[1]
    ids = probe.message_span(tokenizer, record.question).input_ids
    where = probe.place_indices(tokenizer, record)
    upto = tokenizer.decode(ids[: where["entity"] + 1])
    assert upto.endswith(record.meta["entity"][-1]) and record.meta["entity"][:-1] not in tokenizer.decode(ids[where["entity"] + 1:])
    assert tokenizer.decode(ids[where["question end"]]).endswith(record.question[-1])  # "." or "?"
    assert record.question[:-1].endswith(tokenizer.decode(ids[where["entity"] + 1: where["question end"]]).rstrip(".?"))
    assert where["prompt end"] == len(ids) - 1 > where["question end"] > where["entity"]


def test_a_probe_reads_a_linearly_coded_answer_and_not_noise():
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 12, (400,), generator=generator)
    codes = torch.randn(12, 16, generator=generator)
    noisy = codes[labels] + 0.3 * torch.randn(400, 16, generator=generator)
    predicted = probe.fit_probe(noisy[:300], labels[:300], noisy[300:], 12, steps=200, l2=1e-3)
    assert (predicted == labels[300:]).float().mean() > 0.9
    noise = torch.randn(400, 16, generator=generator)
    predicted = probe.fit_probe(noise[:300], labels[:300], noise[300:], 12, steps=200, l2=1e-3)
    assert (predicted == labels[300:]).float().mean() < 0.3


def test_the_knower_pairs_are_registered_with_their_adapters():
    assert {"knower", "knower-opposite", "knower-smollm2", "knower-smollm2-opposite"} <= set(PAIRS)
    for name in ("knower", "knower-opposite", "knower-smollm2", "knower-smollm2-opposite"):
        base, adapter = adapters.split_name(PAIRS[name].sharer)
        assert adapter is not None and adapters.adapter_folder(base, adapter).parent == adapters.SHIPPED_ADAPTERS / base


def test_the_sharer_that_learned_the_opposite_reads_the_fusers_trained_with_the_knowing_one(tmp_path, monkeypatch):
    """C2C with the permuted sharer is the knowing pair's fuser reading another sharer: the permuted
    adapter's card names its counterpart, and the fuser search takes the counterpart's folder first
    (before any other folder whose fingerprint also fits)."""
    from kvviz.handoffs.c2c import locate
    from kvviz.handoffs.c2c.fuser import new_fuser

    opposite = tmp_path / "adapters" / "opposite"
    opposite.mkdir(parents=True)
    (opposite / adapters.CARD).write_text(json.dumps({"permuted": True, "counterpart": "knowing"}))
    name = f"tiny-llama@{opposite}"
    assert locate.sharer_names(name) == [name, "tiny-llama@knowing"]
    assert locate.sharer_names("tiny-llama") == ["tiny-llama"]
    llama, gemma = tiny_llama(), tiny_gemma()
    pair = LoadedPair(PairSpec("tiny-opposite", name, gemma.name, "test"), llama, gemma, gemma)
    pair.sharer = type(llama)(**{**llama.__dict__, "name": name})
    fusers = tmp_path / "fusers"
    for folder in ("a-first-by-name__tiny-gemma", "tiny-llama@knowing__tiny-gemma"):
        new_fuser(llama.facts, gemma.facts, width=8).save(fusers / folder / "c2c")
    monkeypatch.setattr(locate, "SHIPPED_FUSERS", fusers)
    assert locate.find_shipped(pair, "c2c") == fusers / "tiny-llama@knowing__tiny-gemma" / "c2c"
    # without a fuser trained with the knowing sharer, the base model's fuser does not stand in for it
    shutil.rmtree(fusers / "tiny-llama@knowing__tiny-gemma")
    assert locate.find_shipped(pair, "c2c") is None
    base = LoadedPair(PairSpec("tiny-base", llama.name, gemma.name, "test"), llama, gemma, gemma)
    assert locate.find_shipped(base, "c2c") == fusers / "a-first-by-name__tiny-gemma" / "c2c"


def test_the_knower_report_pairs_each_method_with_its_control_and_counts_follows_where_text_follows():
    from kvviz.studies.knower import report

    def row(sample, variant, right, followed):
        return {"sample_id": f"s{sample}", "variant": variant, "handoff": variant, "swap_outcome": "followed" if followed else "kept",
                "right": right, "followed": followed, "kept": int(not followed)}

    # text follows on s0..s5; C2C follows on s0, s1, s2 and s7; the control never
    rows = [row(s, "text", 1, int(s < 6)) for s in range(10)]
    rows += [row(s, "c2c", int(s in (0, 1, 2, 7)), int(s in (0, 1, 2, 7))) for s in range(10)]
    rows += [row(s, "c2c_control", 0, 0) for s in range(10)] + [row(s, "receiver", 0, 0) for s in range(10)]
    by = report.outcomes(pd.DataFrame(rows))
    assert report.follow_where_text_follows(by) == (3, 6)
    text = report.tables(pd.DataFrame(rows))
    assert "| c2c | 10 | 0.40 [" in text and "(4/10)" in text
    assert "C2C minus its control | +0.400 [" in text and "4 / 0" in text
    assert "C2C follows too on 0.50 [" in text and "(3/6)" in text


def test_a_killed_sharer_leg_keeps_its_steps_up_to_the_last_save(tmp_path, monkeypatch):
    base = saved_tiny_base(tmp_path / "base")
    real, calls = sharer.make_batch, []

    def dies_on_the_third_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the machine restarts mid-leg
        return real(*args, **kwargs)

    monkeypatch.setattr(sharer, "make_batch", dies_on_the_third_batch)
    with pytest.raises(KeyboardInterrupt):
        tiny_adapter(base, tmp_path / "killed", extra=("--save-every", "2"))
    assert json.loads((tmp_path / "killed" / "checkpoint" / legs.TRAINER_FILE).read_text())["step"] == 2
    monkeypatch.setattr(sharer, "make_batch", real)
    assert tiny_adapter(base, tmp_path / "killed", extra=("--minutes", "0.00001")) == 0
    assert legs.legs(tmp_path / "killed")[0]["from_step"] == 2  # resumed where the last save left it


# --- the page: a preset on the knower pair, its swap the sharer that learned the opposite ---------


def test_a_knower_preset_runs_on_its_pair_and_swaps_its_sharer_not_a_note():
    from kvviz.app.presets import _preset
    from kvviz.data.swaps import SHARER_SWAP

    raw = {"key": "x", "title": "X", "scenario": "shared", "query": "Name the capital of Quorveth Island.",
           "answers": ["Saltmere"], "pair": "knower", "swap": {"sharer": "opposite", "answers": ["Ravenmoor"]}}
    picked = _preset(raw)
    assert picked.pair == "knower" and picked.swap_words == ()  # the page's note fields stay empty
    assert picked.swap == Swap(context=None, answers=("Ravenmoor",), changed=SHARER_SWAP, pair=OPPOSITE)
    with pytest.raises(ValueError, match="pair must be a registered pair"):
        _preset({**raw, "pair": "knowr"})
    with pytest.raises(ValueError, match="needs a pair whose sharer has an opposite"):
        _preset({**raw, "pair": "embedded"})
    with pytest.raises(ValueError, match="a sharer swap is"):
        _preset({**raw, "swap": {"sharer": "knower-opposite", "answers": ["Ravenmoor"]}})
    with pytest.raises(ValueError, match="a sharer swap is"):
        _preset({**raw, "swap": {"sharer": "opposite", "by": "x", "answers": ["Ravenmoor"]}})


def test_a_stored_sharer_swap_paints_on_its_own_pair_and_says_which_sharer_it_was():
    from kvviz.app.page import views
    from kvviz.app.present.cards import swap_row_html
    from kvviz.app.presets import PRESETS

    key = next(p.key for p in PRESETS if p.pair == "knower")
    swapped = {"context": None, "answers": ["Ravenmoor"], "changed": "the sharer that learned the opposite",
               "pair": OPPOSITE, "answer": "Ravenmoor", "outcome": "followed", "right": True, "applicable": True}
    result = {"handoff": "text", "pair": "knower", "answer": "Greyhaven", "applicable": True, "swap": swapped}
    stored = {"pair": "embedded", "presets": {key: {"pair": "knower", "request": None, "results": [result],
                                                    "swap": {k: swapped[k] for k in ("context", "answers", "changed", "pair")}}}}
    payload, status = views.precomputed_payload(stored, key, "embedded")
    assert payload["pair"] == "knower" and "knower" in status  # not the file's pair
    assert payload["swap_shown"]  # a sharer swap is the preset's lesson: on the cards at once
    reading = views.reading_of(payload, ["Greyhaven"])
    row = swap_row_html(reading.column("text"))
    assert "with the sharer that learned the opposite: “Ravenmoor”" in row and "swapped note" not in row
    note = {**swapped, "pair": None, "context": "a note"}
    plain = views.reading_of({**payload, "results": [{**result, "swap": note}]}, ["Greyhaven"])
    assert "on the swapped note: “Ravenmoor”" in swap_row_html(plain.column("text"))
