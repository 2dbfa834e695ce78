"""KVComm's layer selection on tiny random models: exactly M layers, one record per layer, the
strategies, the score (attention importance and the Gaussian prior, alpha), the calibration (cached,
on this query or a given sample) and what each layer's record says (kvviz.handoffs.kvcomm.layers).

The splice's invariants (every layer = Skyline, no layer = the sink alone) are in test_engine.py.
"""

from __future__ import annotations

import math

import pytest

from kvviz.engine.runner import run_handoff
from kvviz.handoffs.kvcomm import handoff as kvcomm
from kvviz.handoffs.kvcomm.layers import CALIBRATION_CONTEXT, CALIBRATION_QUERY, STRATEGIES, layer_budget, select_layers
from kvviz.handoffs.kvcomm.options import STRATEGY_NAMES, KVCommOptions
from tests.unit.test_engine import QUERY, request


@pytest.mark.parametrize("ratio", [0.0, 0.3, 0.5, 0.7, 1.0])
@pytest.mark.parametrize("strategy", ["kvcomm", "attention", "prior", "contiguous", "random"])
def test_exactly_m_layers_selected_with_one_record_per_layer(tiny, ratio, strategy):
    result = run_handoff("kvcomm", tiny, request(ratio=ratio, strategy=strategy))
    num_layers = tiny.receiver.facts.num_layers
    assert [record["layer"] for record in result.layers] == list(range(num_layers))
    selected = [record["layer"] for record in result.layers if record["selected"]]
    assert len(selected) == math.ceil(ratio * num_layers - 1e-9)
    assert selected == result.details["selected_layers"]
    if selected:
        assert 0 in selected  # layer 0 is always one of the M layers (the default)
    if strategy == "contiguous" and len(selected) > 2:
        rest = selected[1:]
        assert rest == list(range(rest[0], rest[0] + len(rest)))


def test_selection_rules():
    scores = [0.0, 0.9, 0.1, 0.8, 0.2, 0.7, 0.3, 0.6, 0.4, 0.5]
    top = select_layers(scores, KVCommOptions(ratio=0.4), 10)
    assert top == [0, 1, 3, 5]  # layer 0 forced, then the best three: non-contiguous
    block = select_layers(scores, KVCommOptions(ratio=0.4, strategy="contiguous"), 10)
    assert block[0] == 0 and block[1:] == [1, 2, 3]
    free = select_layers(scores, KVCommOptions(ratio=0.4, always_send_layer0=False), 10)
    assert free == [1, 3, 5, 7]
    assert layer_budget(0.3, 30) == 9 and layer_budget(0.3, 18) == 6
    with pytest.raises(ValueError, match="between 0 and 1"):
        layer_budget(1.5, 10)
    with pytest.raises(ValueError, match="do not exist"):
        select_layers(scores, KVCommOptions(strategy="explicit", layers=(0, 12)), 10)


def test_random_selection_depends_only_on_the_seed():
    scores = [0.5] * 30
    first = select_layers(scores, KVCommOptions(ratio=0.5, strategy="random", seed=7), 30)
    again = select_layers(scores, KVCommOptions(ratio=0.5, strategy="random", seed=7), 30)
    other = select_layers(scores, KVCommOptions(ratio=0.5, strategy="random", seed=8), 30)
    assert first == again
    assert first != other


def test_scores_prior_and_alpha():
    raw = [0.1, 0.5, 0.3, 0.9, 0.2]
    attention_only = kvcomm.layer_scores(raw, 1.0, KVCommOptions(), len(raw))
    assert attention_only["score"] == attention_only["attention_norm"] and attention_only["prior"] is not None
    assert min(attention_only["attention_norm"]) == 0.0 and max(attention_only["attention_norm"]) == 1.0
    prior_only = kvcomm.layer_scores(None, 0.0, KVCommOptions(sigma=1.0), len(raw))
    assert prior_only["attention_norm"] is None and prior_only["score"].index(1.0) == 2  # the middle layer
    mixed = kvcomm.layer_scores(raw, 0.8, KVCommOptions(), len(raw))
    assert mixed["score"] == pytest.approx([0.8 * a + 0.2 * p for a, p in zip(mixed["attention_norm"], mixed["prior"])])
    assert kvcomm.layer_scores(None, None, KVCommOptions(strategy="random"), len(raw)) == {
        "attention_norm": None, "prior": None, "score": None
    }


def test_alpha_is_the_reference_default_unless_set():
    resolve = kvcomm.resolve_alpha
    assert resolve(KVCommOptions(), "gemma3_text") == (1.0, "reference default")
    assert resolve(KVCommOptions(alpha=0.6), "llama") == (0.6, "set")
    assert resolve(KVCommOptions(alpha="paper"), "qwen3") == (0.8, "paper (qwen3)")
    assert resolve(KVCommOptions(alpha="paper"), "llama") == (1.0, "paper (llama)")
    alpha, source = resolve(KVCommOptions(alpha="paper"), "gemma3_text")
    assert alpha == 1.0 and "no alpha for gemma3_text" in source
    assert resolve(KVCommOptions(strategy="prior", alpha=0.7), "llama")[0] == 0.0
    assert resolve(KVCommOptions(strategy="random"), "llama")[0] is None
    with pytest.raises(ValueError, match="paper"):
        KVCommOptions(alpha="best")
    with pytest.raises(ValueError, match="between 0 and 1"):
        KVCommOptions(alpha=1.5)


def test_calibration_options_are_checked():
    with pytest.raises(ValueError, match="needs calibration_sample"):
        KVCommOptions(calibration="sample")
    with pytest.raises(ValueError, match="needs calibration_sample"):
        KVCommOptions(calibration_sample=("a context", "a question"))
    with pytest.raises(ValueError, match="Unknown KVComm calibration"):
        KVCommOptions(calibration="task")
    with pytest.raises(ValueError, match="two non-empty texts"):
        KVCommOptions(calibration="sample", calibration_sample=("a context", " "))


def test_spearman_rank_correlation():
    assert kvcomm.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kvcomm.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert kvcomm.spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)  # 1 - 6*4/(5*24)
    assert kvcomm.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254)  # tied ranks averaged
    assert kvcomm.spearman([1, 1, 1], [1, 2, 3]) is None


def test_kvcomm_bytes_scale_with_selected_layers(tiny):
    num_layers = tiny.receiver.facts.num_layers
    sizes = {}
    for count in (1, 2, num_layers):
        result = run_handoff("kvcomm", tiny, request(strategy="explicit", layers=tuple(range(count))))
        sizes[count] = result.bytes_communicated
    per_layer = sizes[2] - sizes[1]
    assert per_layer > 0
    assert sizes[num_layers] - sizes[1] == per_layer * (num_layers - 1)


def test_kvcomm_calibration_is_cached_and_recorded(tiny):
    first = run_handoff("kvcomm", tiny, request())
    second = run_handoff("kvcomm", tiny, request(ratio=0.3))
    calibration = second.details["calibration"]
    assert calibration["cached"] is True and calibration["source"] == "builtin"
    assert first.details["calibration"]["query"] == CALIBRATION_QUERY
    assert first.details["calibration"]["context"] == CALIBRATION_CONTEXT
    assert calibration["alpha"] == second.details["alpha"] == 1.0
    raw = [record["calibration_attention"] for record in second.layers]
    assert all(0.0 <= value <= 1.0 for value in raw) and max(raw) > 0


def test_every_kvcomm_run_measures_this_querys_importance(tiny):
    result = run_handoff("kvcomm", tiny, request())
    live = [record["query_attention"] for record in result.layers]
    calibration = [record["calibration_attention"] for record in result.layers]
    assert all(0.0 <= value <= 1.0 for value in live) and max(live) > 0
    assert live != calibration  # another sample, other attention
    assert result.details["importance_spearman"] == pytest.approx(kvcomm.spearman(calibration, live))
    measured = result.details["query_importance"]
    assert measured["instrumentation"] is True and measured["seconds"] > 0
    # instrumentation stays out of the handoff's time: the total spans the stages only
    stages = sum(value for key, value in result.timings.items() if key != "total")
    assert result.timings["total"] < stages + measured["seconds"]


def test_kvcomm_calibration_on_this_query_or_a_given_sample(tiny):
    own = run_handoff("kvcomm", tiny, request(calibration="query"))
    assert own.details["calibration"]["source"] == "query" and own.details["calibration"]["query"] == QUERY
    assert own.details["importance_spearman"] == pytest.approx(1.0)
    assert own.details["query_importance"]["instrumentation"] is False  # it chose the layers
    assert [r["calibration_attention"] for r in own.layers] == [r["query_attention"] for r in own.layers]
    assert own.bytes_communicated == run_handoff("kvcomm", tiny, request(ratio=1.0)).bytes_communicated
    sample = ("Carol is at the Arlington House.", "Which country is Carol located in?")
    given = run_handoff("kvcomm", tiny, request(calibration="sample", calibration_sample=sample))
    assert (given.details["calibration"]["context"], given.details["calibration"]["query"]) == sample
    assert given.details["calibration"]["source"] == "sample"


@pytest.mark.parametrize("strategy", ["prior", "random", "explicit"])
def test_strategies_without_attention_carry_no_attention_values(tiny, strategy):
    options = {"strategy": strategy, "ratio": 0.5}
    if strategy == "explicit":
        options["layers"] = (1, 2)
    result = run_handoff("kvcomm", tiny, request(**options))
    assert result.details["calibration"] is None and result.details["importance_spearman"] is None
    for record in result.layers:
        assert record["calibration_attention"] is None and record["calibration_attention_norm"] is None
        assert record["query_attention"] is not None  # this query's attention is always measured
        if strategy == "prior":
            assert record["prior"] == record["score"] is not None
        else:
            assert record["prior"] is None and record["score"] is None
    assert result.details["alpha"] == (0.0 if strategy == "prior" else None)


def test_layer_records_say_what_each_layer_got(tiny):
    num_layers = tiny.receiver.facts.num_layers
    result = run_handoff("kvcomm", tiny, request(ratio=0.5))
    by_layer = {record["layer"]: record for record in result.layers}
    assert by_layer[0]["sent"] == "context" and by_layer[0]["forced"] is True
    assert result.details["forced_layers"] == [0]
    assert not any(record["forced"] for record in result.layers[1:])
    assert [r["layer"] for r in result.layers if r["sent"] == "sink"] == result.details["sink_layers"]
    assert len(result.details["sink_layers"]) + len(result.details["selected_layers"]) == num_layers
    assert all(record["selected"] == (record["sent"] == "context") for record in result.layers)
    free = run_handoff("kvcomm", tiny, request(ratio=0.5, always_send_layer0=False))
    explicit = run_handoff("kvcomm", tiny, request(strategy="explicit", layers=(0, 1)))
    assert free.details["forced_layers"] == explicit.details["forced_layers"] == []


def test_every_strategy_is_named_once_in_the_options():
    """The options validate a strategy by name (kvviz.handoffs.kvcomm.options), the layers choose by it."""
    assert tuple(STRATEGIES) == STRATEGY_NAMES
    with pytest.raises(ValueError, match="Unknown KVComm strategy"):
        KVCommOptions(strategy="loudest")
