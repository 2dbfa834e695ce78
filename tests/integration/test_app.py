"""The app served on 127.0.0.1 (random free port) and driven with gradio_client, as a script would.

Most tests use the precomputed results and need no model; one runs a preset live on the real
embedded pair (a few new tokens per handoff, to stay quick on a small CPU).
"""

from __future__ import annotations

import csv
import json
import os

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from kvviz.app import plots, present, ui  # noqa: E402
from kvviz.app.presets import PRESETS  # noqa: E402
from kvviz.app.reading.reading import read  # noqa: E402
from kvviz.core.plotkit import bar_counts  # noqa: E402
from tests.conftest import served_on_loopback  # noqa: E402


@pytest.fixture(scope="module")
def app_url():
    with served_on_loopback(ui.build_demo()) as url:
        yield url


@pytest.fixture(scope="module")
def client(app_url):
    from gradio_client import Client

    return Client(app_url, verbose=False)


def split_run_outputs(outputs) -> dict:
    """Name the run/load_preset outputs (gr.State is not part of the API): status, per page column
    (answer, stats, seen), the figures, the results table, the JSON."""
    columns, plot_names = ui.column_names(), ui.plot_names()
    assert len(outputs) == 1 + 3 * len(columns) + len(plot_names) + 2
    named = {}
    for index, name in enumerate(columns):
        answer, stats, seen = outputs[1 + 3 * index : 4 + 3 * index]
        named[name] = {"answer": answer, "stats": stats, "seen": seen}
    plots = {}
    for index, name in enumerate(plot_names):
        value = outputs[1 + 3 * len(columns) + index]
        plots[name] = json.loads(value["plot"]) if isinstance(value, dict) else json.loads(value)
    return {"status": outputs[0], "columns": named, "plots": plots, "table": outputs[-2], "json": outputs[-1]}


@pytest.mark.integration
def test_every_event_has_an_api_name(client):
    names = set(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    for expected in ("/run", "/sweep", "/load_preset", "/export", "/pair_facts", "/stop"):
        assert expected in names, names
    assert "/run_on_page" not in names and "/show_handoffs" not in names  # the page's own events are private


@pytest.mark.integration
def test_a_preset_gives_its_question_and_precomputed_results(client):
    data = client.predict(PRESETS[0].key, api_name="/load_preset")
    assert data["query"] == PRESETS[0].query and data["context"] == (PRESETS[0].context or "")
    assert data["expected"] == list(PRESETS[0].answers) and data["lesson"] == PRESETS[0].lesson
    results = data["results"]
    assert results["precomputed"] is True and results["preset"] == PRESETS[0].key
    assert {r["handoff"] for r in results["results"]} >= set(ui.default_columns())


@pytest.mark.integration
def test_export_writes_json_and_csv(client, tmp_path):
    files = client.predict(api_name="/export")
    paths = [f if isinstance(f, str) else f.get("path", f.get("name")) for f in files]
    json_path = next(p for p in paths if p.endswith(".json"))
    csv_path = next(p for p in paths if p.endswith(".csv"))
    data = json.loads(open(json_path, encoding="utf-8").read())
    rows = list(csv.DictReader(open(csv_path, encoding="utf-8")))
    assert rows and [row["handoff"] for row in rows] == [r["handoff"] for r in data["results"]]
    assert list(rows[0]) == present.RESULT_COLUMNS


@pytest.mark.integration
def test_pair_facts_lists_the_models(client):
    text = client.predict("embedded", api_name="/pair_facts")
    assert "smollm2-135m" in text and "gemma3-270m" in text


def test_the_run_endpoint_streams_every_output_and_ends_with_the_results(client, monkeypatch):
    """``/run`` without a model (a scripted run through the page's ``stream_run``): each update
    before the last holds every output, the status and the answers so far, None where the run set
    nothing yet; the last holds every column's answer, stats and seen, every figure and the JSON."""
    from kvviz.app.page import run as page_run
    from kvviz.app.page import running
    from kvviz.engine.events import Done, Started, Token

    monkeypatch.setattr(page_run, "STREAM_INTERVAL", 0.0)
    fake = {"handoff": "receiver", "applicable": True, "answer": "4471", "timings": {"total": 0.5},
            "bytes_communicated": 0, "tokens": {"generated": 2}, "seen": {"receiver": "the prompt"}}
    script = [Started("receiver"), Token("receiver", "44"), Token("receiver", "4471"), Done("receiver", fake)]

    def scripted(live, workers, stop, batches=None):  # the shared runs' batches, replaced by the script
        return page_run.stream_run(live, workers, stop, batches=lambda *args, **kwargs: ([event] for event in script))

    monkeypatch.setattr(running, "stream_run", scripted)
    job = client.submit(pair="embedded", query="What is the code?", context="It is 4471.", handoffs=["receiver"],
                        api_name="/run")
    final = split_run_outputs(job.result(timeout=60))
    *streamed, _ = job.outputs()
    columns = ui.column_names()
    answers = [outputs[1 + 3 * columns.index("receiver")] for outputs in streamed]
    shown = [answer for answer in answers if answer]
    assert shown[0] == "44" and shown[-1] == "4471" and set(shown) == {"44", "4471"}  # the answer so far, kept
    for outputs in streamed:
        assert len(outputs) == 1 + 3 * len(columns) + len(ui.plot_names()) + 2 and outputs[0]
        assert outputs[1 + 3 * columns.index("kvcomm")] is None and outputs[-1] is None  # not set by this run
        assert outputs[1 + 3 * len(columns)] is None and outputs[-2]["data"] == []  # no figure, an empty table
    ran = final["json"]["results"][0]
    assert ran["timed"] == "alone"  # the only column of its run: its wall clock is its own cost
    column = read(final["json"], ()).column("receiver")
    # the page's card, rendered once: /run's stats are the card's line on the page
    assert final["columns"]["receiver"] == {"answer": "4471", "stats": present.card_stats(column),
                                            "seen": present.seen_text(column.result)}
    assert "500 ms alone on embedded" in final["columns"]["receiver"]["stats"]
    assert [r["handoff"] for r in final["json"]["results"]] == ["receiver"] and "finished" in final["status"]
    assert set(final["plots"]) == set(ui.plot_names())


@pytest.mark.integration
def test_the_run_endpoints_json_holds_the_attention_arrays_only_when_asked(client, monkeypatch):
    """The per-token attention (about 2 MB a run) leaves ``/run``'s JSON unless ``attention=True``:
    by default each result says its arrays' shape and where they are."""
    from kvviz.app.page import run as page_run
    from kvviz.app.page import running
    from kvviz.engine.events import Done, Started

    attention = {"attention": [[[[0.5, 0.25]]]], "other": [[[0.25]]], "layers": 1, "heads": 1,
                 "sent_tokens": ["44", "71"], "answer_tokens": ["4471"]}
    fake = {"handoff": "receiver", "applicable": True, "answer": "4471", "timings": {"total": 0.5},
            "bytes_communicated": 0, "tokens": {"generated": 1}, "seen": {"receiver": "the prompt"},
            "token_attention": attention}

    def scripted(live, workers, stop, batches=None):  # the shared runs' batches, replaced by the script
        return page_run.stream_run(live, workers, stop,
                                   batches=lambda *args, **kwargs: iter([[Started("receiver"), Done("receiver", fake)]]))

    monkeypatch.setattr(running, "stream_run", scripted)
    asked = dict(pair="embedded", query="What is the code?", context="It is 4471.", handoffs=["receiver"], api_name="/run")
    plain = client.predict(**asked)[-1]
    assert plain["request"]["inspect"] is None  # without attention the run records nothing (issue 42)
    small = plain["results"][0]["token_attention"]  # (this scripted result holds it anyway: shortened)
    assert "1 answer tokens x 1 layers x 1 heads x 2 sent tokens" in small["attention"]
    assert small["sent_tokens"] == ["44", "71"]  # what the arrays are about stays
    asked_whole = client.predict(**asked, attention=True)[-1]
    assert asked_whole["request"]["inspect"] == {"gold": None}  # every part
    whole = asked_whole["results"][0]["token_attention"]
    assert whole["attention"] == attention["attention"] and whole["other"] == attention["other"]


@pytest.mark.integration
def test_bad_input_gets_a_clear_error(client):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="query is empty"):
        client.predict("embedded", "   ", "", 4, api_name="/run")
    with pytest.raises(AppError, match="Explicit layers"):
        client.predict("embedded", "Hi?", "x", 4, False, 0.7, 0, 8, 0.5, "kvcomm", True, 0.8, 10.0, "a,b", api_name="/run")


@pytest.mark.integration
@pytest.mark.real_model
def test_run_a_preset_live_gets_every_column_and_every_plot(client, embedded_pair):
    preset = PRESETS[0]  # private context: every handoff applies (C2C when a fuser ships)
    job = client.submit(
        pair="embedded", query=preset.query, context=preset.context, max_new_tokens=4, message_tokens=8, api_name="/run",
    )
    outputs = job.result(timeout=600)
    view = split_run_outputs(outputs)
    assert "finished" in view["status"]
    data = view["json"]
    assert data["precomputed"] is False and data["pair"] == "embedded"
    assert data["request"]["query"] == preset.query
    results = {r["handoff"]: r for r in data["results"]}
    assert set(results) == set(ui.default_columns())
    for name in ("receiver", "text", "kvcomm", "skyline"):
        assert results[name]["applicable"], results[name]["reason"]
        assert view["columns"][name]["answer"] == results[name]["answer"]
        assert results[name]["tokens"]["generated"] <= 4
        assert "in this shared run" in view["columns"][name]["stats"]  # its columns shared the CPU
        assert view["columns"][name]["seen"]
    if not results["c2c"]["applicable"]:
        assert view["columns"]["c2c"]["stats"] == present.md(results["c2c"]["reason"])
    num_layers = embedded_pair.receiver.facts.num_layers
    kvcomm_counts = bar_counts(view["plots"]["kvcomm"])
    assert set(kvcomm_counts) == {"calibration", "query"}  # alpha 1.0: the score is the calibration importance
    assert set(kvcomm_counts.values()) == {num_layers}
    latency = bar_counts(view["plots"]["latency"])
    applicable = sum(r["applicable"] for r in results.values())
    assert len(latency) == 5 and set(latency.values()) == {applicable}
    assert bar_counts(view["plots"]["bytes"])["bytes"] == sum(r["bytes_communicated"] > 0 for r in results.values() if r["applicable"])
    c2c_plot = view["plots"]["c2c"]
    if results["c2c"]["applicable"]:
        assert bar_counts(c2c_plot) == {"gate_k": num_layers, "gate_v": num_layers}
    else:
        assert c2c_plot["layout"]["annotations"]
    # each handoff's own figure, drawn as it finished, is the one its final result draws
    for name in plots.layer_figure_handoffs(results):
        assert view["plots"][name] == json.loads(plots.own_figure(name, results[name]).to_json()), name
    # intermediate updates streamed before the final one
    assert len(job.outputs()) > 2


@pytest.mark.integration
def test_the_page_preloads_the_plot_script_it_will_need(app_url):
    """The head links Gradio's plotly chunk for early fetching; the link must resolve on the server."""
    import re
    import urllib.request

    config = json.loads(urllib.request.urlopen(f"{app_url}/config", timeout=30).read().decode("utf-8"))
    links = re.findall(r'<link rel="modulepreload" href="(assets/PlotlyPlot-[^"]+\.js)">', config.get("head") or "")
    assert links, "the page head should preload the plot chunk"
    with urllib.request.urlopen(f"{app_url}/{links[0]}", timeout=30) as response:
        assert response.status == 200 and "javascript" in response.headers.get("Content-Type", "")
