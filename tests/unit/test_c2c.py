"""The c2c handoff and token alignment on tiny random models (a Llama-like sharer, a Gemma-3-like
receiver). tests/real_model/test_c2c.py reads the real tokenizers and runs the embedded pair.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kvviz.app.methods import c2c as c2c_page
from kvviz.core.prompts import build_segments
from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine.runner import run_handoff
from kvviz.handoffs import HANDOFFS
from kvviz.handoffs.c2c import locate
from kvviz.handoffs.c2c.align import align_prompt
from kvviz.handoffs.c2c.fuser import new_fuser
from kvviz.handoffs.c2c.fusion import fuse_prompt
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import prefill
from tests.unit.test_fuser import mixed_pair, trained_like

QUERY = "What is the secret code word? Uma is at the Mahaffie House."


CONTEXT = "The secret code word is pineapple."


LAYER_KEYS = {
    "layer", "sharer_layer", "gate_k_logit", "gate_v_logit", "gate_k", "gate_v", "gate_k_open", "gate_v_open",
    "head_weights_k", "head_weights_v",
}


# tiny models run fastest on one thread, above all on a busy machine
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pair():
    return mixed_pair()


def request(folder, **kwargs) -> HandoffRequest:
    return HandoffRequest(query=QUERY, context=kwargs.pop("context", None), generation=GenerationSettings(max_new_tokens=6), options={"c2c": {"fuser": str(folder) if folder else ""}}, **kwargs)


def save(pair, folder, gate: float, zero_projection: bool = False, control: bool = False):
    fuser = trained_like(new_fuser(pair.sharer.facts, pair.receiver.facts, width=16, pair=pair.name, control=control))
    with torch.no_grad():
        fuser.gate_logits.fill_(gate)
        if zero_projection:
            for projector in list(fuser.key_projectors) + list(fuser.value_projectors):
                projector.proj_out.weight.zero_()
    fuser.save(folder)
    return folder


def last_logits(pair, result_fuser_folder, query=QUERY):
    """The receiver's first-token logits on the fused cache, through the handoff's own pipeline."""
    fuser = locate.get_fuser(Path(result_fuser_folder), pair)
    alignment = align_prompt(pair.receiver.tokenizer, pair.sharer.tokenizer, query)
    with torch.no_grad():
        state = fuse_prompt(pair, fuser, alignment, hard=True).state
    next_token, _ = prefill(pair.receiver, state, alignment.receiver_ids[-1:])
    return next_token.logits


def receiver_logits(pair, query=QUERY):
    segments = build_segments(pair.receiver.tokenizer, query)
    next_token, _ = prefill(pair.receiver, kv.KVState(), segments.input_ids)
    return next_token.logits


def test_closed_gates_equal_the_receiver_alone(pair, tmp_path):
    folder = save(pair, tmp_path / "closed", gate=-2.0)
    fused = run_handoff("c2c", pair, request(folder))
    alone = run_handoff("receiver", pair, request(None))
    assert fused.applicable, fused.reason
    assert fused.answer_ids == alone.answer_ids and fused.answer == alone.answer
    assert torch.allclose(last_logits(pair, folder), receiver_logits(pair), atol=1e-5)
    assert fused.details["open_gates"] == {"k": 0, "v": 0, "layers": pair.receiver.facts.num_layers}


def test_zero_projection_leaves_the_receiver_unchanged_even_with_open_gates(pair, tmp_path):
    folder = save(pair, tmp_path / "zero", gate=2.0, zero_projection=True)
    fused = run_handoff("c2c", pair, request(folder))
    alone = run_handoff("receiver", pair, request(None))
    assert fused.answer_ids == alone.answer_ids
    assert torch.allclose(last_logits(pair, folder), receiver_logits(pair), atol=1e-5)
    assert fused.details["open_gates"]["k"] == pair.receiver.facts.num_layers


def test_open_gates_change_the_receiver_and_report_every_layer(pair, tmp_path):
    folder = save(pair, tmp_path / "open", gate=2.0)
    assert not torch.allclose(last_logits(pair, folder), receiver_logits(pair), atol=1e-3)
    result = run_handoff("c2c", pair, request(folder, context=CONTEXT))
    assert result.applicable, result.reason
    assert result.communication == "kv" and result.bytes_communicated > 0
    assert len(result.layers) == pair.receiver.facts.num_layers
    assert all(set(layer) == LAYER_KEYS for layer in result.layers)
    assert [layer["sharer_layer"] for layer in result.layers] == [0, 0, 0, 1, 2, 3]  # 4 sharer, 6 receiver layers
    assert all(layer["gate_k_open"] and 0 < layer["gate_k"] < 1 for layer in result.layers)
    assert all(len(layer["head_weights_v"]) == pair.receiver.facts.num_kv_heads for layer in result.layers)
    for key in ("fuser_path", "fusion_seconds", "parameters", "control", "trained"):
        assert key in result.details
    assert result.details["control"] is False
    for stage in ("sharer_prefill", "transfer", "receiver_prefill", "receiver_decode"):
        assert result.timings[stage] > 0
    # the bytes: sharer KV of the layers the fuser reads, at the fused tokens (fp32)
    alignment = align_prompt(pair.receiver.tokenizer, pair.sharer.tokenizer, QUERY, CONTEXT)
    sharer_layers = len(set(result.details["layer_map"]))
    per_token = 2 * pair.sharer.facts.num_kv_heads * pair.sharer.facts.head_dim * 4
    assert result.bytes_communicated == sharer_layers * per_token * alignment.num_fused
    json.dumps(result.to_dict())  # plain data


def test_control_handoff_uses_no_sharer(pair, tmp_path):
    save(pair, tmp_path / "run" / "c2c", gate=2.0)
    save(pair, tmp_path / "run" / "control", gate=2.0, control=True)
    result = run_handoff("c2c_control", pair, request(tmp_path / "run" / "c2c"))
    assert result.applicable, result.reason
    assert result.details["control"] is True and result.bytes_communicated == 0
    assert result.timings["sharer_prefill"] == 0
    wrong = run_handoff("c2c", pair, request(tmp_path / "run" / "control"))
    assert not wrong.applicable and "control" in wrong.reason


def test_missing_or_foreign_fuser_is_not_applicable(pair, tmp_path, monkeypatch):
    monkeypatch.setattr(locate, "SHIPPED_FUSERS", tmp_path / "no-assets")
    result = run_handoff("c2c", pair, request(None))
    assert not result.applicable and "No trained" in result.reason and "train-fuser" in result.reason
    assert str(tmp_path) not in result.reason and "/work" not in result.reason  # the page never shows a server path
    other = mixed_pair()
    other_pair_fuser = new_fuser(other.receiver.facts, other.sharer.facts, width=8, pair="reversed")  # gemma -> llama
    other_pair_fuser.save(tmp_path / "reversed")
    result = run_handoff("c2c", pair, request(tmp_path / "reversed"))
    assert not result.applicable and "reversed" in result.reason and pair.name in result.reason
    assert "c2c" in HANDOFFS and "c2c_control" in HANDOFFS


def test_shipped_fusers_are_found_by_fingerprint(pair, tmp_path, monkeypatch):
    monkeypatch.setattr(locate, "SHIPPED_FUSERS", tmp_path)
    save(pair, tmp_path / "any-name" / "c2c", gate=-1.0)
    assert locate.find_shipped(pair, "c2c") == tmp_path / "any-name" / "c2c"
    assert locate.find_shipped(pair, "control") is None
    assert run_handoff("c2c", pair, request(None)).applicable


def test_identical_tokenizers_take_the_fast_path(pair):
    alignment = align_prompt(pair.receiver.tokenizer, pair.receiver.tokenizer, QUERY, CONTEXT)
    assert alignment.identical_tokenizers
    fused_receiver = [alignment.receiver_ids[i] for i in alignment.receiver_positions]
    assert [alignment.sharer_ids[i] for i in alignment.sharer_positions] == fused_receiver
    assert alignment.receiver_positions == alignment.sharer_positions  # same prompt layout: same positions


def test_train_cli_checkpoints_resumes_and_writes_the_curve(tmp_path):
    """Two steps with a checkpoint every step, then resume to four: the curve continues."""
    import argparse

    from kvviz.runtime.models import register_loaded
    from kvviz.studies.c2c import train as train_fuser
    from tests.tiny_models import tiny_gemma, tiny_llama

    register_loaded(tiny_llama())
    register_loaded(tiny_gemma())
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps({"instruction": f"Name thing {i}.", "input": "", "output": f"Thing {i}."}) for i in range(8)))

    def run(steps, resume):
        parser = argparse.ArgumentParser()
        train_fuser.configure_parser(parser)
        argv = ["--pair", "tiny-llama+tiny-gemma", "--data", str(data), "--out", str(tmp_path / "out"), "--steps", str(steps),
                "--heldout", "2", "--width", "8", "--device", "cpu", "--no-progress", "--save-every", "1", "--fp16"]
        return train_fuser.main(parser.parse_args(argv + (["--resume"] if resume else [])))

    assert run(2, False) == 0
    assert json.loads((tmp_path / "out" / "checkpoint_c2c" / "trainer.json").read_text())["step"] == 1
    assert run(4, True) == 0
    rows = (tmp_path / "out" / "loss_c2c.csv").read_text().strip().splitlines()
    assert [r.split(",")[0] for r in rows] == ["step", "1", "2", "3", "4"]  # resumed at step 1: no duplicate rows
    config = json.loads((tmp_path / "out" / "c2c" / "config.json").read_text())
    assert config["training"]["steps"] == 4 and config["training"]["storage"] == "float16"
    assert "heldout_nll" in config["training"] and (tmp_path / "out" / "loss_c2c.html").exists()


def test_a_partly_trained_fuser_is_written_as_it_stands_and_its_run_still_resumes(tmp_path):
    """--fuser-now: a leg cut after its first step, written as a fuser (its config says step 1 of 4),
    loadable and evaluable; the checkpoint, the legs and the curve stay as they were, and the run
    then resumes to the end."""
    import argparse

    from safetensors.torch import load_file

    from kvviz.handoffs.c2c.fuser import load_fuser
    from kvviz.runtime.models import register_loaded
    from kvviz.studies import legs
    from kvviz.studies.c2c import train as train_fuser
    from kvviz.studies.c2c.examples import heldout_examples
    from tests.tiny_models import tiny_gemma, tiny_llama

    register_loaded(tiny_llama())
    register_loaded(tiny_gemma())
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps({"instruction": f"Name thing {i}.", "input": "", "output": f"Thing {i}."}) for i in range(8)))
    out, now = tmp_path / "out", tmp_path / "now"

    def run(*extra):
        parser = argparse.ArgumentParser()
        train_fuser.configure_parser(parser)
        argv = ["--pair", "tiny-llama+tiny-gemma", "--data", str(data), "--out", str(out), "--steps", "4", "--heldout", "2",
                "--width", "8", "--device", "cpu", "--no-progress", "--resume", "--fp16", *extra]
        return train_fuser.main(parser.parse_args(argv))

    with pytest.raises(SystemExit, match="no checkpoint"):
        run("--fuser-now", str(now))
    assert run("--minutes", "0.00001") == 0  # the leg's budget is spent after its first step: saved at step 1
    checkpoint = out / "checkpoint_c2c"
    assert json.loads((checkpoint / "trainer.json").read_text())["step"] == 1
    before = (checkpoint / "state.safetensors").read_bytes(), (out / "loss_c2c.csv").read_text(), legs.legs(out, name="legs_c2c.jsonl")

    assert run("--fuser-now", str(now)) == 0
    config = json.loads((now / "c2c" / "config.json").read_text())
    assert config["training"]["steps_done"] == 1 and config["training"]["steps"] == 4 and not config["training"]["finished"]
    assert "heldout_nll" in config["training"] and json.loads((now / "summary_c2c.json").read_text())["steps_done"] == 1
    pair = mixed_pair()
    fuser = load_fuser(now / "c2c", pair.sharer.facts, pair.receiver.facts, pair.name)
    saved = load_file(str(checkpoint / "state.safetensors"))
    for name, parameter in fuser.named_parameters():  # the checkpoint's weights, in float16
        assert torch.allclose(parameter, saved[f"param::{name}"].float(), atol=2e-3, rtol=1e-2), name
    assert len(heldout_examples(pair, fuser, None)[0]) == 2  # its held-out split rebuilt from its config, as eval-fuser does
    assert (checkpoint / "state.safetensors").read_bytes() == before[0]  # nothing trained, nothing moved
    assert (out / "loss_c2c.csv").read_text() == before[1] and legs.legs(out, name="legs_c2c.jsonl") == before[2]
    assert not (out / "summary_c2c.json").exists() and not (out / "c2c").exists()  # the run is not marked finished

    assert run() == 0  # and it resumes to the end
    assert json.loads((out / "c2c" / "config.json").read_text())["training"]["steps_done"] == 4


def test_private_context_goes_to_the_sharer_only(pair, tmp_path):
    shared = align_prompt(pair.receiver.tokenizer, pair.sharer.tokenizer, QUERY, CONTEXT, receiver_sees_context=True)
    private = align_prompt(pair.receiver.tokenizer, pair.sharer.tokenizer, QUERY, CONTEXT, receiver_sees_context=False)
    alone = build_segments(pair.receiver.tokenizer, QUERY)
    assert private.receiver_ids == alone.input_ids  # the receiver reads the query alone
    assert "pineapple" in pair.sharer.tokenizer.decode(private.sharer_ids[: private.sharer_positions[0]])
    assert "pineapple" not in pair.receiver.tokenizer.decode(private.receiver_ids)
    assert private.num_fused < shared.num_fused  # only the query's tokens are fused
    fused = [private.receiver_ids[i] for i in private.receiver_positions]
    assert [private.sharer_ids[i] for i in private.sharer_positions] == fused  # same tokenizer: fast path
    # the handoff follows the fuser's training setting; closed gates still equal the receiver alone
    fuser = new_fuser(pair.sharer.facts, pair.receiver.facts, width=8, pair=pair.name)
    fuser.config.training = {"receiver_sees_context": False}
    with torch.no_grad():
        fuser.gate_logits.fill_(-1.0)
    fuser.save(tmp_path / "private")
    result = run_handoff("c2c", pair, request(tmp_path / "private", context=CONTEXT))
    assert result.details["receiver_sees_context"] is False
    assert result.answer_ids == run_handoff("receiver", pair, request(None, context=CONTEXT)).answer_ids


def test_c2c_figure_gates_and_head_heatmaps():
    from tests.unit.test_plots import c2c_result

    result = c2c_result(num_layers=4, heads=3)
    figure = c2c_page.gates_figure(result)
    data = figure.to_dict()["data"]
    gates = {t["meta"]["series"]: t for t in data if t["type"] == "bar"}
    assert set(gates) == {"gate_k", "gate_v"}
    for kind in ("k", "v"):
        trace = gates[f"gate_{kind}"]
        assert list(trace["x"]) == [0, 1, 2, 3]
        opened = [r[f"gate_{kind}_open"] for r in result["layers"]]
        # the bar is the gate applied (0 or 1; a closed one a thin sliver), not sigmoid(logit)
        assert [y == 1.0 for y in trace["y"]] == opened and all(y in (1.0, c2c_page.CLOSED_SLIVER) for y in trace["y"])
        assert trace["meta"]["applied"] == [int(o) for o in opened]
        # open gates in colour, closed ones pale grey
        assert [c != c2c_page.GATE_CLOSED_COLOR for c in trace["marker"]["color"]] == opened
        # the hover gives the logit and its sigmoid
        for text, r in zip(trace["hovertext"], result["layers"]):
            assert f"logit {r[f'gate_{kind}_logit']:+.3f}" in text and f"sigmoid(logit) {r[f'gate_{kind}']:.3f}" in text
            assert f"applied: <b>{int(r[f'gate_{kind}_open'])}</b>" in text
    heatmaps = {t["meta"]["series"]: t for t in data if t["type"] == "heatmap"}
    assert set(heatmaps) == {"head_weights_k", "head_weights_v"}
    for kind in ("k", "v"):
        z = heatmaps[f"head_weights_{kind}"]["z"]
        assert len(z) == 3 and all(len(row) == 4 for row in z)  # KV heads x layers
        assert list(heatmaps[f"head_weights_{kind}"]["x"]) == [0, 1, 2, 3]
        per_layer = [list(column) for column in zip(*z)]
        assert per_layer == [r[f"head_weights_{kind}"] for r in result["layers"]]
    assert "2 K gates and 2 V gates open of 4 layers" in figure.layout.title.text


def test_c2c_figure_off_says_why():
    from kvviz.core.results import HandoffResult

    off = HandoffResult.not_applicable("c2c", "hand", "No trained C2C fuser for pair 'hand'.").to_dict()
    figure = c2c_page.gates_figure(off)
    assert not figure.to_dict()["data"]
    assert "No trained C2C fuser" in figure.layout.annotations[0].text.replace("<br>", " ")


def test_fuser_requirement_is_checked_at_once_and_the_option_sets_the_request(pair, tmp_path, monkeypatch):
    from kvviz.handoffs import registry

    monkeypatch.setattr(locate, "SHIPPED_FUSERS", tmp_path / "none")
    for name in ("c2c", "c2c_control"):
        reason = registry.get(name).applicable(pair, HandoffRequest(query="Q?"))
        assert reason and "fuser" in reason
    request = registry.get("c2c").with_options(HandoffRequest(query="Q?"), {"fuser": str(tmp_path)})
    assert locate.fuser_option(request) == str(tmp_path)
    assert locate.fuser_option(registry.get("c2c").with_options(HandoffRequest(query="Q?"), {})) is None


def test_the_communication_measure_stored_beside_the_fusers_reaches_both_columns(tmp_path):
    import json

    from kvviz.runtime.checkpoints import checkpoint_label

    pair_folder = tmp_path / "sharer__receiver"
    (pair_folder / "c2c").mkdir(parents=True)
    (pair_folder / "control").mkdir()
    measure = {"examples": 44, "gain": 0.0125, "ci95": [-0.004, 0.03], "nll": {"right": 2.4, "other": 2.41, "zero": 2.42}}
    report = {
        "fuser": checkpoint_label(pair_folder / "c2c"), "control": checkpoint_label(pair_folder / "control"),
        "heldout": {"data": "dolly", "nll": {"receiver": 2.5, "control": 2.41, "c2c": 2.44},
                    "communication": {"c2c": measure, "control": dict(measure, gain=0.0, ci95=[0.0, 0.0])}},
    }
    (pair_folder / locate.COMMUNICATION_FILE).write_text(json.dumps(report))
    for kind in ("c2c", "control"):
        stored = locate.stored_communication(pair_folder / kind)
        assert stored["gain"] == 0.0125 and stored["ci95"] == [-0.004, 0.03]  # C2C's measure in both columns
        assert stored["heldout_nll"] == {"receiver": 2.5, "control": 2.41, "c2c": 2.44}
    # a report about other fusers is not shown
    (tmp_path / "other" / "c2c").mkdir(parents=True)
    (tmp_path / "other" / locate.COMMUNICATION_FILE).write_text(json.dumps(report))
    assert locate.stored_communication(tmp_path / "other" / "c2c") is None
    assert locate.stored_communication(tmp_path / "nowhere" / "c2c") is None

    note = c2c_page.communication_note(locate.stored_communication(pair_folder / "c2c"), control=False)
    assert len(note) == 1 and "+0.013 nats/token" in note[0] and "[-0.004, +0.030]" in note[0]
    assert "no measured evidence" in note[0]
    control_note = c2c_page.communication_note(locate.stored_communication(pair_folder / "control"), control=True)
    assert "receiver 2.500, control 2.410, c2c 2.440" in control_note[0]
    helps = c2c_page.communication_note(dict(measure, ci95=[0.01, 0.02]), control=False)
    assert "the sharer's cache helps" in helps[0]
    assert c2c_page.communication_note(None, control=False) == []


def test_the_walkthrough_step_of_the_control_loads_the_preset_where_they_differ_and_asks_for_a_prediction():
    from kvviz.app import ui
    from kvviz.app.presets import preset
    from kvviz.handoffs import registry

    by_title = {step.title.split(": ", 1)[1]: step for step in ui.walkthrough_steps()}
    steps = {title: (step.preset, step.text) for title, step in by_title.items()}
    step = by_title[registry.get("c2c_control").title]
    key, text = step.preset, step.text
    assert "c2c-differs-from-control" in preset(key).shows  # its lesson: one example against the held-out gain
    # the learner predicts before the lesson (which tells the outcome) shows: it comes with the reveal
    assert "Predict first" in step.predict.question and "control" in text
    assert step.predict.ask.kind == "beats" and step.reveal == preset(key).lesson and preset(key).lesson not in text
    # C2C's own step claims no gain: it names no preset where C2C "shines"
    assert "shines" not in steps[registry.get("c2c").title][1]
    assert {"c2c", "c2c_control"} <= set(registry.default_handoffs())
