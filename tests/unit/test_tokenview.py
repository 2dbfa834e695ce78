"""What crossed, drawn (kvviz.app.tokenview) and on the page's What crossed and Depth tabs, without a
browser: the token view carries the stored attention, says "nothing was sent" where nothing was,
and the logit lens draws every column on one figure with hovers that say what was measured."""

from __future__ import annotations

import html
import json
import re

import pytest

from kvviz.app import tokenview
from kvviz.app.page import spec, tabs
from kvviz.app.reading.reading import read
from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine.runner import run_handoff
from tests.conftest import tiny_pair

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    pair = tiny_pair("llama")
    request = HandoffRequest(query="What is the secret code word?", context="The secret code word is pineapple.",
                             generation=GenerationSettings(max_new_tokens=6), inspect={"gold": "pineapple"})
    return {name: run_handoff(name, pair, request).to_dict() for name in ("receiver", "kvcomm", "skyline")}


def test_the_token_view_holds_the_stored_attention_and_one_chip_per_token(results):
    result = results["kvcomm"]
    data = result["token_attention"]
    page = tokenview.token_view_html(result)
    stored = json.loads(html.unescape(re.search(r'data-attention="([^"]*)"', page).group(1)))
    assert stored["attention"] == data["attention"]
    assert stored["sent_layers"] == data["sent_layers"]
    assert page.count('class="kv-tv-ans') == len(data["answer_tokens"])
    assert page.count('class="kv-tv-sent-tok"') == len(data["sent_tokens"])
    assert page.count('class="kv-tv-cell on"') == data["layers"] * data["heads"]
    assert "\u25b2" in page and "only the sink" in page  # KVComm's sent layers are marked
    assert "this query" in page  # the hover says what was measured on which input


def test_a_column_that_sent_nothing_says_so(results):
    page = tokenview.token_view_html(results["receiver"])
    assert "Nothing was sent" in page and "data-attention" not in page


def test_a_result_without_the_fields_asks_for_a_live_run():
    page = tokenview.token_view_html({"handoff": "kvcomm", "applicable": True})
    assert "Run live" in page


def test_the_lens_draws_every_column_on_one_figure_labelled_logit_lens(results):
    figure = tokenview.lens_figure(list(results.values()))
    traces = figure.to_dict()["data"]
    assert {t["meta"]["handoff"] for t in traces} == set(results)
    assert {t["meta"]["series"] for t in traces} == {"answer_probability", "gold_probability"}
    assert "logit lens" in figure.layout.title.text.lower()
    assert all("this query" in text and "probability" in text for t in traces for text in t["hovertext"])


def test_the_tab_shows_kvcomm_first_then_the_chosen_column(results):
    reading = read({"results": list(results.values()), "stamp": "run:1"}, ())
    names = ["receiver", "kvcomm", "skyline"]
    updates, view = tabs.token_view_updates(reading, names, {"drawn": {}})
    assert updates["tokens_column"]["value"] == "kvcomm" and view["tokens_column"] == "kvcomm"
    assert [value for _, value in updates["tokens_column"]["choices"]] == names
    again, view = tabs.token_view_updates(reading, names, view)
    assert again == {}  # nothing changed: nothing is sent again
    chosen, view = tabs.token_view_updates(reading, names, view, chosen="skyline")
    assert 'data-handoff="skyline"' in chosen["tokens"]
    assert spec.tab_figures("lens", names) == [spec.LENS_PLOT]


def test_a_live_run_puts_each_lens_that_arrives_after_the_handoffs_on_its_result():
    import threading

    from kvviz.app.page.run import LiveRun, stream_run
    from kvviz.engine.events import Done, Lens

    lens = {"layers": [0, 1], "answer_probability": [0.1, 0.9]}

    def batches(pair, request, names, workers, stop=None, idle=None):
        yield [Done("receiver", {"handoff": "receiver", "applicable": True, "answer": "x", "logit_lens": {}})]
        yield [Lens("receiver", lens)]

    run = LiveRun("embedded", HandoffRequest(query="q"), ["receiver"], [], "The answer")
    last = list(stream_run(run, 1, threading.Event(), batches=batches))[-1]
    assert last["results"]["results"][0]["logit_lens"] == lens


def test_depth_follows_the_golds_first_content_token_not_a_leading_space():
    """Gemma's tokenizer reads " 4471" as " ", "4", "4", "7", "1": the lens's gold token is "4" (the
    first that is not whitespace alone), with or without the leading space."""
    from kvviz.runtime.crossed import gold_candidates

    class Digits:  # a tokenizer that, as Gemma's, gives a leading space a token of its own
        vocabulary = [" ", "4", "7", "1", " Canberra", "Can", "berra"]

        def __call__(self, text, add_special_tokens=False):
            pieces = [" Canberra"] if text == " Canberra" else (["Can", "berra"] if text == "Canberra" else list(text))
            return {"input_ids": [self.vocabulary.index(piece) for piece in pieces]}

        def decode(self, ids, skip_special_tokens=False):
            return "".join(self.vocabulary[i] for i in ids)

    tokenizer = Digits()
    assert [tokenizer.decode([t]) for t in gold_candidates(tokenizer, "4471")] == ["4"]
    assert [tokenizer.decode([t]) for t in gold_candidates(tokenizer, " Canberra")] == ["Can", " Canberra"]
