"""The app served on 127.0.0.1 (random free port) and driven with gradio_client, as a script would.

Fast tests use the precomputed results and need no model; the one slow test runs a preset live
on the real embedded pair (a few new tokens per handoff, to stay quick on a small CPU).
"""

from __future__ import annotations

import csv
import json
import os

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from kvviz import ui  # noqa: E402
from kvviz.handoffs import HANDOFFS  # noqa: E402
from kvviz.presets import PRESETS, load_precomputed  # noqa: E402
from tests.conftest import served_on_loopback  # noqa: E402

# Outputs of the run endpoint, in order (gr.State is not part of the API).
N_COLUMN_OUTPUTS = 3 * len(ui.COLUMNS)
PLOT_NAMES = ("kvcomm", "c2c", "latency", "bytes")


@pytest.fixture(scope="module")
def app_url():
    with served_on_loopback(ui.build_demo()) as url:
        yield url


@pytest.fixture(scope="module")
def client(app_url):
    from gradio_client import Client

    return Client(app_url, verbose=False)


def split_run_outputs(outputs) -> dict:
    """Name the run/load_preset outputs: status, per column (answer, stats, seen), plots, json."""
    assert len(outputs) == 1 + N_COLUMN_OUTPUTS + len(PLOT_NAMES) + 1
    columns = {}
    for index, name in enumerate(ui.COLUMNS):
        answer, stats, seen = outputs[1 + 3 * index : 4 + 3 * index]
        columns[name] = {"answer": answer, "stats": stats, "seen": seen}
    plots = {}
    for index, name in enumerate(PLOT_NAMES):
        value = outputs[1 + N_COLUMN_OUTPUTS + index]
        plots[name] = json.loads(value["plot"]) if isinstance(value, dict) else json.loads(value)
    return {"status": outputs[0], "columns": columns, "plots": plots, "json": outputs[-1]}


def bar_counts(figure: dict) -> dict:
    return {(t.get("meta") or {}).get("series", t.get("name")): len(t.get("y") or []) for t in figure["data"] if t["type"] == "bar"}


# --- fast: no models ----------------------------------------------------------------------------


def test_every_event_has_an_api_name(client):
    names = set(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    for expected in ("/run", "/sweep", "/load_preset", "/export", "/pair_facts", "/walkthrough_next", "/walkthrough_back"):
        assert expected in names, names


def test_model_runs_share_one_queue_and_every_public_event_is_named():
    demo = ui.build_demo(precomputed={}, sweep=None)
    functions = {fn.api_name: fn for fn in demo.fns.values() if fn.api_visibility != "private"}
    assert all(name and name != "unnamed" for name in functions)
    for name in ("run", "sweep"):
        assert functions[name].concurrency_id == ui.MODEL_QUEUE
        assert functions[name].concurrency_limit == 1
    assert functions["load_preset"].concurrency_id != ui.MODEL_QUEUE


def test_walkthrough_steps_forward_and_back(client):
    text, preset_key = client.predict(api_name="/walkthrough_next")
    assert "Step 2 of" in text
    text, preset_key = client.predict(api_name="/walkthrough_back")
    assert "Step 1 of" in text and preset_key == ui.WALKTHROUGH[0][1]


def test_preset_paints_precomputed_results_and_plots(client):
    if not load_precomputed():
        pytest.skip("assets/precomputed/presets.json is missing: run scripts/precompute_presets.py")
    key = PRESETS[0].key
    outputs = client.predict(key, api_name="/load_preset")
    query, context, rest = outputs[0], outputs[1], outputs[2:]
    assert query == PRESETS[0].query and context == (PRESETS[0].context or "")
    view = split_run_outputs(rest)
    assert "precomputed" in view["status"]
    assert view["json"]["precomputed"] is True
    assert {r["handoff"] for r in view["json"]["results"]} >= set(ui.COLUMNS)
    for name in ("receiver", "text", "kvcomm", "skyline"):
        assert view["columns"][name]["answer"], name
        assert "precomputed" in view["columns"][name]["stats"]
    kvcomm = next(r for r in view["json"]["results"] if r["handoff"] == "kvcomm")
    counts = bar_counts(view["plots"]["kvcomm"])
    assert counts == {"attention_norm": len(kvcomm["layers"]), "prior": len(kvcomm["layers"]), "score": len(kvcomm["layers"])}
    assert len(bar_counts(view["plots"]["latency"])) == 5  # one trace per stage


def test_export_writes_json_and_csv(client, tmp_path):
    files = client.predict(api_name="/export")
    paths = [f if isinstance(f, str) else f.get("path", f.get("name")) for f in files]
    json_path = next(p for p in paths if p.endswith(".json"))
    csv_path = next(p for p in paths if p.endswith(".csv"))
    data = json.loads(open(json_path, encoding="utf-8").read())
    rows = list(csv.DictReader(open(csv_path, encoding="utf-8")))
    assert [row["handoff"] for row in rows] == [r["handoff"] for r in data["results"]]
    assert set(ui.CSV_FIELDS) == set(rows[0]) if rows else True


def test_pair_facts_lists_the_models(client):
    text = client.predict("embedded", api_name="/pair_facts")
    assert "smollm2-135m" in text and "gemma3-270m" in text


def test_bad_input_gets_a_clear_error(client):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="query is empty"):
        client.predict("embedded", "   ", "", 4, api_name="/run")
    with pytest.raises(AppError, match="Explicit layers"):
        client.predict("embedded", "Hi?", "x", 4, False, 0.7, 0, 8, 0.5, "kvcomm", True, 0.8, 10.0, "a,b", api_name="/run")


def test_c2c_column_says_why_it_is_off_when_not_registered(monkeypatch):
    monkeypatch.delitem(HANDOFFS, "c2c", raising=False)
    assert not ui.c2c_registered()
    off = ui.c2c_off_result("embedded")
    assert off["applicable"] is False and "not registered" in off["reason"]
    stats = ui.stats_markdown(off)
    assert stats.startswith("**Not applicable:**") and "C2C is off" in stats


def test_user_text_is_escaped_in_markdown():
    escaped = ui._md('<img src=x onerror="alert(1)"> *bold* [link](http://x)')
    assert escaped.count("<") == escaped.count("\\<") == 1 and "\\*bold\\*" in escaped
    result = {"handoff": "kvcomm", "applicable": False, "reason": "<script>alert(1)</script>"}
    stats = ui.stats_markdown(result)
    assert stats.count("<") == stats.count("\\<")


def test_build_request_maps_the_form():
    request = ui.build_request("Q?", "  ", 8, False, 0.7, 3, 16, 0.25, "prior", None, 5.0, "")
    assert request.context is None and request.kvcomm.strategy == "prior" and request.generation.max_new_tokens == 8
    explicit = ui.build_request("Q?", "ctx", layers="7, 0,3")
    assert explicit.kvcomm.strategy == "explicit" and explicit.kvcomm.layers == (0, 3, 7)


# --- slow: a live run on the real embedded pair -------------------------------------------------


@pytest.mark.slow
def test_run_a_preset_live_gets_every_column_and_every_plot(client, embedded_pair):
    preset = PRESETS[0]  # private context: every handoff applies (C2C when a fuser ships)
    job = client.submit(
        "embedded", preset.query, preset.context, 4, False, 0.7, 0, 8, 0.5, "kvcomm", True, 0.8, 10.0, "",
        api_name="/run",
    )
    outputs = job.result(timeout=600)
    view = split_run_outputs(outputs)
    assert "finished" in view["status"]
    data = view["json"]
    assert data["precomputed"] is False and data["pair"] == "embedded"
    assert data["request"]["query"] == preset.query
    results = {r["handoff"]: r for r in data["results"]}
    assert set(results) == set(ui.COLUMNS)
    for name in ("receiver", "text", "kvcomm", "skyline"):
        assert results[name]["applicable"], results[name]["reason"]
        assert view["columns"][name]["answer"] == results[name]["answer"]
        assert results[name]["tokens"]["generated"] <= 4
        assert "total" in view["columns"][name]["stats"]
        assert view["columns"][name]["seen"]
    if not results["c2c"]["applicable"]:
        assert view["columns"]["c2c"]["stats"].startswith("**Not applicable:**")
    num_layers = embedded_pair.receiver.facts.num_layers
    assert bar_counts(view["plots"]["kvcomm"]) == {"attention_norm": num_layers, "prior": num_layers, "score": num_layers}
    latency = bar_counts(view["plots"]["latency"])
    applicable = sum(r["applicable"] for r in results.values())
    assert len(latency) == 5 and set(latency.values()) == {applicable}
    assert bar_counts(view["plots"]["bytes"])["bytes"] == sum(r["bytes_communicated"] > 0 for r in results.values() if r["applicable"])
    c2c_plot = view["plots"]["c2c"]
    if results["c2c"]["applicable"]:
        assert bar_counts(c2c_plot) == {"gate_k": num_layers, "gate_v": num_layers}
    else:
        assert c2c_plot["layout"]["annotations"]
    # intermediate updates streamed before the final one
    assert len(job.outputs()) > 2


def test_sweep_data_on_a_tiny_pair():
    from tests.conftest import tiny_pair

    items = [{"context": "The code is 4471.", "query": "What is the code?", "answers": ["4471"]}]
    calls = []
    data = ui.run_sweep_data(tiny_pair("llama"), ["kvcomm", "random"], 2, items=items, progress=lambda f, desc: calls.append(f))
    from kvviz.presets import SWEEP_RATIOS

    assert len(data["points"]) == 2 * len(SWEEP_RATIOS)
    assert set(data["baselines"]) == {"receiver", "skyline"}
    by_key = {(p["strategy"], p["ratio"]): p for p in data["points"]}
    assert by_key[("kvcomm", 0.0)]["layers"] == 0 and by_key[("random", 1.0)]["layers"] == by_key[("kvcomm", 1.0)]["layers"] > 0
    # ratios 0 and 1 run once and are shared; the progress bar reaches the end
    assert len(data["answers"]) == 2 + 2 + 2 * (len(SWEEP_RATIOS) - 2)
    assert calls and calls[-1] == pytest.approx(1.0)
