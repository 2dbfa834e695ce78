"""The KV translator (kvviz.handoffs.translate.translator): the splice, its controls, its files, its fitting.

Tiny models: a Llama-like sharer and a Gemma-3-like receiver (one KV head, sliding layers with a
window of 8, so short prompts already cross it).
"""

from __future__ import annotations

import json

import pytest
import torch

from kvviz.core.prompts import build_segments
from kvviz.handoffs.translate import align as tr_align
from kvviz.handoffs.translate import prefix as tr_prefix
from kvviz.handoffs.translate import ridge as tr_ridge
from kvviz.handoffs.translate import translator as tr
from kvviz.runtime.cache import KVState
from kvviz.runtime.decode import full_logits, prefill

CONTEXT = "Mira keeps her red bicycle in the garden shed behind the old library in Lisbon."
OTHER = "The secret code word is pineapple."
QUERY = "Where does Mira keep her bicycle?"


def random_translator(pair, seed: int = 0, rank: int | None = 8) -> tr.KVTranslator:
    """A translator with small random weights (its output depends on the sharer's KV)."""
    translator = tr.new_translator(pair.sharer.facts, pair.receiver.facts, pair.name, pair.sharer.tokenizer,
                                   sharer_layers=[0, 2, 3], neighbours=1, rank=rank)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in (translator.down, translator.up):
            if parameter is not None:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    return translator


def logits_after(pair, state: KVState, tokens: list[int]) -> torch.Tensor:
    return full_logits(pair.receiver, state, tokens)


def test_alignment_reads_the_sharer_token_holding_each_last_character(mixed_tiny_pair):
    pair = mixed_tiny_pair
    alignment = tr_align.align_context(pair.receiver.tokenizer, pair.sharer.tokenizer, CONTEXT)
    # the receiver's context segment is Skyline's, token for token
    assert alignment.receiver_ids == build_segments(pair.receiver.tokenizer, QUERY, CONTEXT).context_ids
    receiver_pieces = [pair.receiver.tokenizer.decode([i]) for i in alignment.receiver_ids]
    assert "".join(receiver_pieces[: alignment.own_count]) == "<bos>Context:"
    sharer_text = [pair.sharer.tokenizer.decode([i]) for i in alignment.sharer_ids]
    ends = []
    for piece in sharer_text:
        ends.append((ends[-1] if ends else 0) + len(piece))
    # a receiver token ending at character c of the shared text reads the sharer token covering c
    position = len("".join(receiver_pieces[: alignment.own_count])) - len("<bos>") + len(sharer_text[0])
    for piece, index in zip(receiver_pieces[alignment.own_count :], alignment.sharer_index):
        position += len(piece)
        start = ends[index - 1] if index else 0
        assert start < position <= ends[index]
    assert len(alignment.pieces) == alignment.translated_count


def test_oracle_equals_skyline(mixed_tiny_pair, one_thread):
    """The receiver's own context KV in the translated slots is Skyline's prompt, exactly."""
    pair = mixed_tiny_pair
    alignment = tr_align.align_context(pair.receiver.tokenizer, pair.sharer.tokenizer, CONTEXT)
    skyline = build_segments(pair.receiver.tokenizer, QUERY, CONTEXT)
    answer = pair.receiver.tokenizer(" Lisbon", add_special_tokens=False)["input_ids"]
    state = KVState()
    prefill(pair.receiver, state, skyline.context_ids, need_logits=False)
    expected = logits_after(pair, state, skyline.query_ids + answer)
    got = logits_after(pair, tr_prefix.oracle_prefix(pair, alignment).state, skyline.query_ids + answer)
    assert torch.allclose(got, expected, atol=1e-4)


def test_gates_closed_equal_the_receiver_alone(mixed_tiny_pair, one_thread):
    pair = mixed_tiny_pair
    translator = random_translator(pair)
    alignment = tr_align.align_context(pair.receiver.tokenizer, pair.sharer.tokenizer, CONTEXT)
    alone = build_segments(pair.receiver.tokenizer, QUERY)
    state = KVState()
    prefill(pair.receiver, state, alone.context_ids, need_logits=False)
    expected = logits_after(pair, state, alone.query_ids)
    closed = [0.0] * pair.receiver.facts.num_layers
    prefix, _, _ = tr_prefix.translate(pair, translator, alignment, gates=closed)
    assert prefix.gates == closed
    assert torch.allclose(logits_after(pair, prefix.state, alone.query_ids), expected, atol=1e-4)
    # and with the gates open, the translated context changes what the receiver predicts
    opened, _, _ = tr_prefix.translate(pair, translator, alignment, gates=[1.0] * len(closed))
    assert not torch.allclose(logits_after(pair, opened.state, alone.query_ids), expected, atol=1e-3)


def test_another_context_changes_the_answer_nll(mixed_tiny_pair, one_thread):
    pair = mixed_tiny_pair
    translator = random_translator(pair)
    query_ids = build_segments(pair.receiver.tokenizer, QUERY).query_ids
    answer = pair.receiver.tokenizer(" Lisbon", add_special_tokens=False)["input_ids"]

    def nll(context):
        alignment = tr_align.align_context(pair.receiver.tokenizer, pair.sharer.tokenizer, context)
        with torch.no_grad():
            prefix, sent, made = tr_prefix.translate(pair, translator, alignment)
        assert sent == 3 * 2 * pair.sharer.facts.num_kv_heads * pair.sharer.facts.head_dim * len(alignment.sharer_ids) * 4
        assert made > 0
        return float(tr_prefix.nll_after(pair.receiver, prefix.state, query_ids, answer))

    assert abs(nll(CONTEXT) - nll(OTHER)) > 1e-3


def test_per_token_weights_enter_as_score_biases(mixed_tiny_pair, one_thread):
    """A translated token with weight ~0 is as good as absent; weight 1 leaves attention as it is."""
    pair = mixed_tiny_pair
    alignment = tr_align.align_context(pair.receiver.tokenizer, pair.sharer.tokenizer, CONTEXT)
    layers, count = pair.receiver.facts.num_layers, alignment.translated_count
    query_ids = build_segments(pair.receiver.tokenizer, QUERY).query_ids
    expected = logits_after(pair, tr_prefix.oracle_prefix(pair, alignment).state, query_ids)
    ones = tr_prefix.oracle_prefix(pair, alignment)
    ones.state.prefix_bias = {layer: torch.zeros(len(alignment.receiver_ids)) for layer in range(layers)}
    assert torch.allclose(logits_after(pair, ones.state, query_ids), expected, atol=1e-5)
    hidden = tr_prefix.oracle_prefix(pair, alignment)
    hidden.state.prefix_bias = {
        layer: torch.cat([torch.zeros(alignment.own_count), torch.full((count,), tr_prefix.CLOSED)]) for layer in range(layers)
    }
    assert not torch.allclose(logits_after(pair, hidden.state, query_ids), expected, atol=1e-3)


def test_soft_gates_and_the_map_get_gradients(mixed_tiny_pair, one_thread):
    from kvviz.studies.c2c.translator_train import answer_nll

    pair = mixed_tiny_pair
    translator = random_translator(pair)
    answer = pair.receiver.tokenizer(" Lisbon", add_special_tokens=False)["input_ids"]
    loss, tokens = answer_nll(pair, translator, CONTEXT, QUERY, answer)
    loss.backward()
    assert tokens == len(answer)
    assert translator.gate_logits.grad is not None and translator.gate_logits.grad.abs().sum() > 0
    assert translator.up.grad.abs().sum() > 0 and translator.weight_proj.grad.abs().sum() > 0
    assert all(p.grad is None for p in pair.receiver.model.parameters())


class OwnKV(tr.KVTranslator):
    """A stand-in map that returns the receiver's own position-free KV of the context."""

    def __init__(self, config, keys, values):
        super().__init__(config)
        self.own_keys, self.own_values = keys, values

    def forward(self, x):
        return self.own_keys, self.own_values, torch.ones(self.own_keys.shape[0], self.own_keys.shape[2])


def test_attention_loss_is_zero_for_the_receivers_own_kv(mixed_tiny_pair, one_thread, tmp_path):
    """The attention-output loss compares with the receiver's own KV: a map that reproduces it
    scores ~0 (the teacher's queries and keys are the receiver's own forward), a random one does not."""
    from kvviz.studies.c2c import translator_train as tt

    pair = mixed_tiny_pair
    translator = random_translator(pair)
    answer = pair.receiver.tokenizer(" Lisbon", add_special_tokens=False)["input_ids"]
    example = tt.teacher_example(pair, translator.config, CONTEXT, QUERY, answer)
    loss = tt.AttentionLoss(pair.receiver)
    value, per_layer = loss(translator, example)
    assert float(value) > 1e-3 and len(per_layer) == pair.receiver.facts.num_layers
    alignment = tr_align.align_context(pair.receiver.tokenizer, pair.sharer.tokenizer, CONTEXT)
    own = tr_align.read_kv(pair.receiver, [alignment.receiver_ids])
    keys = torch.stack([k[0, :, alignment.own_count :] for k, _ in own])
    values = torch.stack([v[0, :, alignment.own_count :] for _, v in own])
    # the example survives its file (float16 on disk)
    from safetensors.torch import load_file, save_file

    path = tmp_path / "teacher.safetensors"
    save_file(example.to_tensors("e0"), str(path))
    again = tt.TeacherExample.from_tensors(load_file(str(path)), "e0", pair.receiver.facts.num_layers)
    assert again.context_length == example.context_length and torch.allclose(again.queries[2], example.queries[2], atol=1e-2)
    exact = OwnKV(translator.config, keys, values)
    with torch.no_grad():
        exact.gate_logits.fill_(30.0)
        value, _ = loss(exact, example)
    assert float(value) < 1e-6


# --- files -------------------------------------------------------------------------------------


def test_save_and_load_round_trip_in_float16(mixed_tiny_pair, tmp_path):
    pair = mixed_tiny_pair
    translator = random_translator(pair)
    folder = translator.save(tmp_path / "t", dtype=torch.float16)
    loaded = tr.load_translator(folder, pair.sharer.facts, pair.receiver.facts, pair.name)
    x = torch.randn(5, translator.config.in_width)
    for a, b in zip(translator(x), loaded(x)):
        assert torch.allclose(a, b, atol=1e-2, rtol=1e-2)
    assert torch.equal(loaded.gate_logits, translator.gate_logits)


def test_a_translator_for_another_pair_is_refused(mixed_tiny_pair, tiny, tmp_path):
    folder = random_translator(mixed_tiny_pair).save(tmp_path / "t")  # llama -> gemma; tiny: llama -> llama, gemma -> gemma
    with pytest.raises(tr.TranslatorError, match="was trained for pair"):
        tr.load_translator(folder, tiny.sharer.facts, tiny.receiver.facts, tiny.name)


@pytest.mark.parametrize("damage", ["config-json", "config-format", "config-version", "config-field", "weights-bytes",
                                    "weights-shape", "missing"])
def test_a_corrupt_translator_is_refused_with_a_clear_error(mixed_tiny_pair, tmp_path, damage):
    pair = mixed_tiny_pair
    folder = random_translator(pair).save(tmp_path / "t")
    config = json.loads((folder / tr.CONFIG_FILE).read_text())
    if damage == "config-json":
        (folder / tr.CONFIG_FILE).write_text("{not json")
        match = "not valid JSON"
    elif damage == "config-format":
        (folder / tr.CONFIG_FILE).write_text(json.dumps({**config, "format": "kvviz-c2c-fuser"}))
        match = "not a kvviz KV translator"
    elif damage == "config-version":
        (folder / tr.CONFIG_FILE).write_text(json.dumps({**config, "version": 99}))
        match = "format version 99; this kvviz reads versions 1, 2. .* train-translator"
    elif damage == "config-field":
        (folder / tr.CONFIG_FILE).write_text(json.dumps({**config, "surprise": 1}))
        match = "unknown fields"
    elif damage == "weights-bytes":
        (folder / tr.WEIGHTS_FILE).write_bytes(b"\x00" * 64)
        match = "corrupt"
    elif damage == "weights-shape":
        (folder / tr.CONFIG_FILE).write_text(json.dumps({**config, "rank": 4}))
        match = "does not match its weights"
    else:
        (folder / tr.WEIGHTS_FILE).unlink()
        match = "no weights file"
    with pytest.raises(tr.TranslatorError, match=match):
        tr.load_translator(folder, pair.sharer.facts, pair.receiver.facts, pair.name)


# --- keys and stage 1 ------------------------------------------------------------------------------


def test_keys_round_trip_through_the_receivers_rotary_module_per_layer_type(mixed_tiny_pair):
    receiver = mixed_tiny_pair.receiver
    keys = torch.randn(1, receiver.facts.num_kv_heads, 6, receiver.facts.head_dim)
    positions = [3, 4, 5, 9, 10, 11]
    for layer in range(receiver.facts.num_layers):
        back = tr_align.unrotated(receiver, tr_align.rotated(receiver, keys, layer, positions), layer, positions)
        assert torch.allclose(back, keys, atol=1e-5)
    # sliding and full layers rotate differently (Gemma 3: theta per layer type)
    types = receiver.facts.layer_types
    sliding, full = types.index("sliding_attention"), types.index("full_attention")
    assert not torch.allclose(tr_align.rotated(receiver, keys, sliding, positions), tr_align.rotated(receiver, keys, full, positions))


def test_ridge_recovers_a_linear_map_and_sums_merge():
    generator = torch.Generator().manual_seed(0)
    truth = torch.randn(12, 7, generator=generator)
    x = torch.randn(3000, 12, generator=generator) * 3 + 5
    y = x @ truth + 0.01 * torch.randn(3000, 7, generator=generator) - 2
    whole = tr_ridge.RidgeStats(12, 7)
    whole.add(x, y)
    parts = tr_ridge.RidgeStats(12, 7)
    for chunk in (x[:1000], x[1000:]):
        part = tr_ridge.RidgeStats(12, 7)
        part.add(chunk, (chunk @ truth + 0.01 * torch.randn(chunk.shape[0], 7, generator=generator) - 2))
        parts.merge(part)
    for stats in (whole, parts):
        fit = tr_ridge.fit_ridge(stats, 1e-6)
        predicted = ((x - fit["x_mean"]) / fit["x_scale"]) @ fit["weight"] * fit["y_scale"] + fit["y_mean"]
        assert float(((predicted - y) ** 2).mean() / y.var(0).mean()) < 1e-4
    full, reduced = tr_ridge.fit_ridge(whole, 1e-3), tr_ridge.fit_ridge(whole, 1e-3, rank=7)
    assert torch.allclose(reduced["down"] @ reduced["up"], full["weight"], atol=1e-3)
    low = tr_ridge.fit_ridge(whole, 1e-3, rank=2)
    assert torch.linalg.matrix_rank(low["down"] @ low["up"]) == 2


# --- the handoff (kvviz.handoffs.translate) ----------------------------------------------------------------


def run_translation(pair, folder, name="c2c_translate", context=CONTEXT):
    from kvviz.engine.runner import run_handoff
    from kvviz.handoffs import registry

    request = registry.build_request(QUERY, context, 4, options={"c2c_translate": {"translator": str(folder)}})
    return run_handoff(name, pair, request)


def test_the_handoff_answers_with_its_gates_and_bytes(mixed_tiny_pair, one_thread, tmp_path):
    """The handoff reports its answer, one gate record per receiver layer, the sharer's KV it read
    (what crosses) and the translated size; with every gate closed it answers as the receiver alone."""
    from kvviz.engine.runner import run_handoff
    from kvviz.handoffs import registry

    pair = mixed_tiny_pair
    translator = random_translator(pair)
    result = run_translation(pair, translator.save(tmp_path / "open"))
    assert result.applicable, result.reason
    alignment = tr_align.align_context(pair.receiver.tokenizer, pair.sharer.tokenizer, CONTEXT)
    assert result.bytes_communicated == tr_prefix.read_bytes(translator.config, len(alignment.sharer_ids), pair.sharer.dtype)
    assert result.details["translated_bytes"] > 0
    assert [r["layer"] for r in result.layers] == list(range(pair.receiver.facts.num_layers))
    assert all(r["open"] for r in result.layers) and result.details["open_gates"] == pair.receiver.facts.num_layers
    with torch.no_grad():
        translator.gate_logits.fill_(-4.0)
    closed = run_translation(pair, translator.save(tmp_path / "closed"))
    alone = run_handoff("receiver", pair, registry.build_request(QUERY, CONTEXT, 4))
    assert closed.details["open_gates"] == 0 and closed.answer_ids == alone.answer_ids
    control = run_translation(pair, tmp_path / "open", name="c2c_translate_control")
    assert control.details["control"] and control.details["control_context"]


def test_the_handoff_without_a_translator_says_why(mixed_tiny_pair, tiny, tmp_path):
    """No translator found, one for another pair, or a corrupt one: "not applicable" with the reason."""
    from kvviz.handoffs.translate import locate

    missing = run_translation(mixed_tiny_pair, tmp_path / "nowhere")
    assert not missing.applicable and "No KV translator" in missing.reason
    assert locate.shipped_translator(tiny, tmp_path) is None
    other = run_translation(tiny, random_translator(mixed_tiny_pair).save(tmp_path / "mixed"))
    assert not other.applicable and "was trained for pair" in other.reason
    (tmp_path / "mixed" / tr.WEIGHTS_FILE).write_bytes(b"not safetensors")
    locate._loaded.clear()  # the cache of loaded translators (the file's modification time is also in its key)
    corrupt = run_translation(mixed_tiny_pair, tmp_path / "mixed")
    assert not corrupt.applicable and "corrupt" in corrupt.reason


def test_the_shipped_translator_is_small_and_for_the_embedded_pair():
    """assets/translators/embedded: <= 25 MB, float16 weights, the embedded pair's fingerprints,
    its held-out numbers beside it (files only; no model is loaded)."""
    from safetensors import safe_open

    from kvviz.handoffs.translate.locate import ASSETS_DIR, MEASURED_FILE

    folder = ASSETS_DIR / "embedded"
    assert (folder / tr.WEIGHTS_FILE).stat().st_size <= 25 * 1024 * 1024
    config = tr.read_config(folder)
    assert (config.sharer["name"], config.receiver["name"]) == ("smollm2-135m", "gemma3-270m")
    with safe_open(str(folder / tr.WEIGHTS_FILE), "pt") as handle:
        assert handle.get_slice("up").get_dtype() == "F16"
    measured = json.loads((folder / MEASURED_FILE).read_text())
    assert measured["command"].startswith("python -m kvviz")


def test_the_batched_decode_step_keeps_the_translated_tokens_weights(mixed_tiny_pair, one_thread):
    """A decode step of kvviz.runtime.step (the shared batch) applies the prefix's score biases as the
    model's own forward does: a translated token's weight holds for generated tokens too."""
    from kvviz.runtime import cache as kv
    from kvviz.runtime.decode import forward_kwargs
    from kvviz.runtime.step import DecodeStep

    pair = mixed_tiny_pair
    step = DecodeStep(pair.receiver)
    if not step.supported:
        pytest.skip(step.reason)
    translator = random_translator(pair)
    with torch.no_grad():
        translator.weight_bias.fill_(-2.0)  # weights ~0.12: biases that change attention
    alignment = tr_align.align_context(pair.receiver.tokenizer, pair.sharer.tokenizer, CONTEXT)
    with torch.no_grad():
        prefix, _, _ = tr_prefix.translate(pair, translator, alignment)
        state = prefix.state
        prefill(pair.receiver, state, build_segments(pair.receiver.tokenizer, QUERY).query_ids)

        def twin(bias):
            return KVState(cache=kv.copy_cache(state.cache), next_position=state.next_position,
                           prefix_positions=state.prefix_positions, prefix_bias=bias)

        def model_forward(copy):
            ids = torch.tensor([[7]])
            return pair.receiver.model.model(input_ids=ids, **forward_kwargs(pair.receiver, copy, 1)).last_hidden_state[0, -1]

        theirs, unbiased = model_forward(twin(state.prefix_bias)), model_forward(twin({}))
        ours = step.step([twin(state.prefix_bias)], [7])[0]
    assert torch.allclose(ours, theirs, atol=1e-4)
    assert not torch.allclose(unbiased, theirs, atol=1e-3)  # the biases matter here


def test_the_card_says_what_the_translator_carried_from_its_measured_numbers():
    """The translation column's notes read measured.json: per held-out set the translator's right
    answers beside Skyline's and its control's, and its follow rate on a swapped fact beside
    Skyline's; a set measured without Skyline says nothing it cannot compare."""
    from kvviz.app.methods.translate import carried

    row = lambda hits: {"contains": hits, "n": 100, "ci95": [0.0, 1.0], "nll": 1.0}  # noqa: E731
    measured = {"sets": {
        "whereabouts": {"rows": {"receiver": row(2), "skyline": row(48), "translator": row(21), "control": row(3)},
                        "swap": {"records": 90, "rows": {"translator": {"followed": 9, "n": 90}, "skyline": {"followed": 30, "n": 90}}}},
        "recall": {"rows": {"translator": row(41), "control": row(1)}},
    }}
    lines = carried(measured)
    assert len(lines) == 1
    assert "right 21/100, Skyline 48/100, its control 3/100" in lines[0]
    assert "follows the swap 9/90 (Skyline 30/90)" in lines[0]
    del measured["sets"]["whereabouts"]["swap"]
    assert "swap" not in carried(measured)[0]
    assert carried({}) == []
