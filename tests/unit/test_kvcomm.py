"""The KVComm descriptor's parts that the page and the benchmark read: its layer figure, its
options as the page and the CLI set them, its bench variants, and the receiver state it rebuilds
for the likelihood column. (The handoff's invariants run in test_engine.py.)"""

from __future__ import annotations

import pytest

from kvviz.app.methods import kvcomm as kvcomm_page
from kvviz.app.methods import registry as methods
from kvviz.core.plotkit import SELECTED_OUTLINE, bar_counts
from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.engine.runner import run_handoff
from kvviz.handoffs import registry
from kvviz.handoffs.kvcomm import handoff as kvcomm
from kvviz.handoffs.kvcomm.options import KVCommOptions, options_of
from kvviz.studies.bench.run import expand_variants
from kvviz.studies.bench.scoring import option_scores
from tests.conftest import tiny_pair
from tests.unit.test_plots import NUM_LAYERS, SELECTED, kvcomm_result

pytestmark = pytest.mark.usefixtures("one_thread")


def bar_traces(figure) -> list[dict]:
    return [t for t in figure.to_dict()["data"] if t["type"] == "bar"]


def test_kvcomm_figure_has_one_bar_per_layer_per_series_and_highlights_selected():
    figure = kvcomm_page.layers_figure(kvcomm_result())
    bars = bar_traces(figure)
    assert [t["meta"]["series"] for t in bars] == ["calibration", "query", "prior", "score"]
    names = {t["meta"]["series"]: t["name"] for t in bars}
    assert "calibration sample" in names["calibration"] and "this query" in names["query"]
    assert "0.80 x importance + 0.20 x prior" in names["score"]
    for trace in bars:
        assert list(trace["x"]) == list(range(NUM_LAYERS))
        assert len(trace["y"]) == NUM_LAYERS
        outlined = {layer for layer, color in zip(trace["x"], trace["marker"]["line"]["color"]) if color == SELECTED_OUTLINE}
        assert outlined == SELECTED
        opaque = {layer for layer, opacity in zip(trace["x"], trace["marker"]["opacity"]) if opacity == 1.0}
        assert opaque == SELECTED
    markers = {t["meta"]["series"]: t for t in figure.to_dict()["data"] if t["type"] == "scatter"}
    assert list(markers["forced"]["x"]) == [0] and "forced" in markers["forced"]["name"]
    assert sorted(markers["sent"]["x"]) == sorted(SELECTED - {0})
    assert sorted(markers["sink"]["x"]) == sorted(set(range(NUM_LAYERS)) - SELECTED)
    assert markers["sent"]["marker"]["color"] == kvcomm.COLOR
    assert markers["sent"]["marker"]["symbol"] != markers["sink"]["marker"]["symbol"] != markers["forced"]["marker"]["symbol"]
    assert bar_counts(figure) == {"calibration": NUM_LAYERS, "query": NUM_LAYERS, "prior": NUM_LAYERS, "score": NUM_LAYERS}
    assert "3 of 6 layers sent (layer 0 by rule)" in figure.layout.title.text
    assert "Spearman +0.60" in figure.layout.title.text


def _tiny_run(**options):
    return run_handoff("kvcomm", tiny_pair("llama"), HandoffRequest(
        query="What is the secret code word?", context="The secret code word is pineapple.",
        options={"kvcomm": KVCommOptions(**options).to_dict()}))


@pytest.mark.parametrize("strategy", ["prior", "random"])
def test_kvcomm_figure_draws_no_calibration_attention_where_none_was_measured(strategy):
    result = _tiny_run(strategy=strategy, ratio=0.5)
    series = {t["meta"]["series"] for t in bar_traces(kvcomm_page.layers_figure(result))}
    assert "calibration" not in series  # nothing measured on a calibration sample
    assert "score" not in series  # no mixed score: prior alone (alpha = 0) or none (random)
    assert "query" in series  # this query's importance is always measured, and labelled as such
    assert ("prior" in series) == (strategy == "prior")
    assert all(r["calibration_attention"] is None for r in result.layers)
    assert "Spearman" not in kvcomm_page.layers_figure(result).layout.title.text


def test_kvcomm_figure_at_reference_alpha_draws_importance_as_the_score_and_no_prior():
    result = _tiny_run(ratio=0.5)  # alpha 1.0: the score is the calibration importance
    bars = {t["meta"]["series"]: t for t in bar_traces(kvcomm_page.layers_figure(result))}
    assert set(bars) == {"calibration", "query"}
    assert bars["calibration"]["name"].endswith("= score") and "built-in sample" in bars["calibration"]["name"]
    rho = result.details["importance_spearman"]
    assert rho is not None and f"Spearman {rho:+.2f}" in kvcomm_page.layers_figure(result).layout.title.text


def test_kvcomm_figure_with_query_calibration_draws_one_importance_that_chose_the_layers():
    result = _tiny_run(ratio=0.5, calibration="query")
    bars = {t["meta"]["series"]: t for t in bar_traces(kvcomm_page.layers_figure(result))}
    assert set(bars) == {"query"} and "chose the layers" in bars["query"]["name"]


def test_kvcomm_figure_for_not_applicable_result_says_why():
    result = HandoffResult.not_applicable("kvcomm", "hand", "KVComm needs a private context.").to_dict()
    figure = kvcomm_page.layers_figure(result)
    assert not bar_traces(figure)
    assert "needs a private context" in figure.layout.annotations[0].text
    assert "Run a preset" in kvcomm_page.layers_figure(None).layout.annotations[0].text


def test_options_set_the_request_and_explicit_layers_override_the_strategy():
    handoff = registry.get("kvcomm")
    base = HandoffRequest(query="Q?", context="C")
    request = handoff.with_options(base, {"ratio": "0.25", "strategy": "prior", "sigma": 4})
    assert options_of(request).ratio == 0.25 and options_of(request).strategy == "prior" and options_of(request).sigma == 4.0
    assert options_of(request).alpha is None  # "auto": the reference code's 1.0
    explicit = handoff.with_options(base, {"layers": "7, 0,3"})
    assert options_of(explicit).strategy == "explicit" and options_of(explicit).layers == (0, 3, 7)
    with pytest.raises(ValueError, match="Explicit layers"):
        handoff.with_options(base, {"layers": "a,b"})
    with pytest.raises(ValueError, match="between 0 and 1"):
        handoff.with_options(base, {"ratio": 1.5})
    with pytest.raises(ValueError, match="not one of"):
        handoff.with_options(base, {"strategy": "best"})


def test_one_bench_variant_per_strategy_and_ratio():
    variants = expand_variants(["receiver", "kvcomm", "text"], {"kvcomm": {"ratio": "0.3,0.5", "strategy": "kvcomm,random"}})
    assert [v.label for v in variants] == [
        "receiver", "kvcomm@0.3", "kvcomm@0.5", "kvcomm-random@0.3", "kvcomm-random@0.5", "text"
    ]
    assert variants[1].handoff == "kvcomm" and variants[1].options == {"ratio": 0.3, "strategy": "kvcomm"}
    default = expand_variants(["kvcomm"])
    assert [v.label for v in default] == ["kvcomm@0.3", "kvcomm@0.5", "kvcomm@0.7"]


def test_likelihood_state_with_every_layer_equals_skylines():
    pair = tiny_pair("gemma")
    request = HandoffRequest(query="What is the secret code word?", context="The secret code word is pineapple.",
                             options={"kvcomm": KVCommOptions(ratio=1.0).to_dict()})
    result = run_handoff("kvcomm", pair, request)
    options = ["pineapple", "Paris", "the lazy dog"]
    scores = {name: option_scores(registry.get(name).receiver_prompt(pair, request, result), options)
              for name in ("skyline", "kvcomm")}
    assert scores["kvcomm"] == pytest.approx(scores["skyline"], abs=1e-4)


def test_not_applicable_at_once_without_a_context_or_across_architectures(mixed_tiny_pair):
    handoff = registry.get("kvcomm")
    assert "private context" in handoff.applicable(tiny_pair("llama"), HandoffRequest(query="Q?"))
    assert "architecture" in handoff.applicable(mixed_tiny_pair, HandoffRequest(query="Q?", context="C"))
    assert handoff.applicable(tiny_pair("llama"), HandoffRequest(query="Q?", context="C")) is None
    assert isinstance(handoff.not_applicable("p", "why"), HandoffResult)


def test_page_words_say_what_was_measured_and_no_more():
    from kvviz.app import presets, ui
    handoff, page = registry.get("kvcomm"), methods.page_of("kvcomm")
    words = " ".join([page.explanation, page.walkthrough, handoff.summary])
    assert "the sharer reads" not in words.lower() and "sender" in words
    for fact in ("sink", "layer 0", "calibration", "1 - alpha", "in memory"):
        assert fact in words, fact
    diagram = page.diagram()
    assert "other layers: nothing" not in diagram and "sink" in diagram and "selected layers" in diagram
    skyline = methods.page_of("skyline")
    assert "no handoff can do better" not in skyline.explanation.lower() and "not a bound" in skyline.explanation
    assert "no handoff beats it" not in skyline.diagram()
    notes = " ".join(p.lesson for p in presets.PRESETS)
    assert "Compare which layers KVComm sends" not in notes and "best case" not in notes
    import inspect

    assert "Every column runs on the same pair" not in inspect.getsource(ui)
    assert handoff.option("calibration").choices == ("builtin", "query")


def test_notes_name_the_calibration_sample_and_the_forced_layer():
    lines = kvcomm_page.notes(kvcomm_result())
    assert lines[0] == "layers sent: 0 (always), 2, 3"
    assert "Peggy is at the Gevangenpoort." in lines[1] and "Spearman +0.60" in lines[2]
