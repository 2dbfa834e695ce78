"""Two runs side by side (kvviz.app.compare, issue 22): the session's history, the sides the shortcuts
pick, the diff of the answers and of what they read, and the page's Compare two tab wired to it."""

from __future__ import annotations

import pytest

from kvviz.app import compare, ui
from kvviz.app.presets import DEFAULT_PRESET, load_precomputed
from kvviz.app.reading.reading import read, typed

PRECOMPUTED = load_precomputed()


def result(name: str, answer: list[str], mass: list[float] | None = None, lens: list[float] | None = None) -> dict:
    """A result whose one recorded answer token put ``mass`` on the sent tokens in each of 2 layers x 1 head."""
    sent = ["<bos>", " code", " 4471"]
    data = {"answer_tokens": answer, "sent_tokens": sent, "attention": [], "nothing_sent": None}
    if mass is not None:
        data["attention"] = [[[mass], [mass]]]
        data["other"] = [[[0.1], [0.1]]]
    out = {"handoff": name, "applicable": True, "answer": "".join(answer).strip(), "token_attention": data}
    if lens is not None:
        out["logit_lens"] = {"layers": list(range(len(lens))), "answer_probability": lens, "answer_token": answer[0]}
    return out


def payload(stamp: str, results: list[dict], ratio: float = 0.5):
    """A run's reading, as the page keeps it beside its results."""
    return read({"pair": "embedded", "preset": None, "precomputed": False, "stamp": stamp, "results": results,
                 "request": {"query": "What is the code?", "context": "The code is 4471.",
                             "generation": {"max_new_tokens": 8}, "options": {"kvcomm": {"ratio": ratio}}}}, ())


def test_the_history_keeps_the_last_runs_once_each_and_drops_the_arrays_it_does_not_read():
    history = []
    for number in range(compare.HISTORY_SIZE + 2):
        history = compare.remember(history, payload(f"run:{number}", [result("kvcomm", [" 1"], [0.1, 0.2, 0.3])]))
    history = compare.remember(history, payload(f"run:{compare.HISTORY_SIZE + 1}", [result("kvcomm", [" 1"])]))
    assert len(history) == compare.HISTORY_SIZE
    assert [entry["number"] for entry in history] == list(range(3, compare.HISTORY_SIZE + 3))
    assert history[-1]["reading"].result("kvcomm").token_attention["other"] == []
    assert compare.remember(history, read({"results": []}, ())) == history


def test_the_shortcuts_pick_the_control_in_the_same_run_and_the_column_in_the_run_before():
    history = compare.remember([], payload("run:1", [result("kvcomm", [" 1"])], ratio=0.3))
    history = compare.remember(history, payload("run:2", [result("kvcomm", [" 4471"]), result("kvcomm_control", [" 12"])]))
    assert compare.control_side(history, "2:kvcomm") == "2:kvcomm_control"
    assert compare.control_side(history, "1:kvcomm") is None  # its control did not run there
    assert compare.previous_side(history, "2:kvcomm") == "1:kvcomm"
    assert compare.default_sides(history) == ("2:kvcomm", "2:kvcomm_control")
    assert [key for _, key in compare.choices(history)] == ["2:kvcomm", "2:kvcomm_control", "1:kvcomm"]


def test_b_can_be_a_with_the_swapped_note_token_by_token():
    swapped = dict(result("kvcomm", [" 44", "71"], [0.5, 0.1, 0.6]),
                   swap={"context": "The code is 3902.", "answers": ["3902"], "changed": "4471 -> 3902", "answer": "3902",
                         "answer_ids": [5, 6], "answer_tokens": [" 39", "02"], "applicable": True, "outcome": "followed"})
    history = compare.remember([], payload("run:1", [swapped, result("receiver", [" 12"])]))
    assert compare.swapped_side(history, "1:kvcomm") == "1:kvcomm:swapped"
    assert compare.swapped_side(history, "1:receiver") is None  # no swapped note ran for it
    assert "1:kvcomm:swapped" in [key for _, key in compare.choices(history)]
    html = compare.compare_html(history, "1:kvcomm", "1:kvcomm:swapped")
    assert "B on the swapped note (4471 -&gt; 3902)" in html and "one fact of the note changed" in html
    assert html.count("kv-cmp-a") == 2 and html.count("kv-cmp-b") == 2  # both tokens differ, shown as tokens
    assert "B: no attention onto sent tokens recorded" in html  # what the swapped answer read is not kept
    compare.compare_figure(history, "1:kvcomm", "1:kvcomm:swapped")  # draws A alone without failing


def test_the_diff_marks_the_tokens_that_differ_and_says_what_differs_between_the_runs():
    history = compare.remember([], payload("run:1", [result("kvcomm", [" 44", "71"], [0.5, 0.1, 0.6])], ratio=0.3))
    history = compare.remember(history, payload("run:2", [result("kvcomm", [" 44", "12"], [0.5, 0.3, 0.1])], ratio=0.5))
    html = compare.compare_html(history, "1:kvcomm", "2:kvcomm")
    assert "ratio: 0.3 vs 0.5" in html
    assert html.count("kv-cmp-a") == 1 and html.count("kv-cmp-b") == 1  # " 44" is the same on both sides
    # the sink (first sent token) is left out; A read " 4471" more, B " code"
    assert "A - B +1.000" in html and "A - B -0.400" in html and "&lt;bos&gt;" not in html.split("Sent tokens")[1]


def test_sent_mass_and_layer_mass_are_the_recorded_sums():
    one = typed(result("kvcomm", [" 4471"], [0.2, 0.3, 0.4]))
    tokens, mass = compare.sent_mass(one)
    assert tokens == [" code", " 4471"] and mass == pytest.approx([0.6, 0.8])  # two layers, one head, one token
    assert compare.layer_mass(one) == pytest.approx([0.7, 0.7])


def test_the_figure_draws_both_sides_attention_and_lens_labelled():
    history = compare.remember([], payload("run:1", [result("kvcomm", [" 1"], [0.1, 0.2, 0.3], lens=[0.1, 0.9]),
                                                      result("kvcomm_control", [" 2"], [0.1, 0.0, 0.0], lens=[0.1, 0.2])]))
    fig = compare.compare_figure(history, "1:kvcomm", "1:kvcomm_control")
    assert [(t.meta["side"], t.meta["series"]) for t in fig.data] == [("A", "attention"), ("A", "lens"), ("B", "attention"),
                                                                      ("B", "lens")]
    assert "logit lens" in fig.data[1].name and "attention" in fig.layout.annotations[0].text


def test_the_page_remembers_the_opening_preset_and_a_new_result_set_shows_it_beside_its_control():
    demo = ui.build_demo(precomputed=PRECOMPUTED, sweep=None)
    page = demo.kvviz_page
    history = page["history"].value
    assert len(history) == 1 and history[0]["reading"].preset == DEFAULT_PRESET
    remember = next(fn for fn in demo.fns.values() if fn.api_name == "remember_run").fn
    new = payload("run:9", [result("c2c", [" 4471"]), result("c2c_control", [" 12"])])
    out = remember(new, history, None, None)
    assert len(out[page["history"]]) == 2
    assert out[page["compare_a"]]["value"] == "2:c2c" and out[page["compare_b"]]["value"] == "2:c2c_control"
    assert "two columns of the same run" in out[page["compare_html"]].lower()
    shortcut = next(fn for fn in demo.fns.values() if fn.api_name == "compare_with_previous").fn
    said = shortcut(out[page["history"]], "2:c2c", "2:c2c_control")
    assert "did not run in an earlier run" in said[page["compare_html"]] or said[page["compare_b"]]["value"].startswith("1:")


def test_a_column_with_its_own_control_comes_first_and_is_shown_scored_against_it():
    c2c = result("c2c", [" 4471"])
    c2c["token_change"] = {"control": "c2c_control", "control_title": "C2C control", "tokens": [" 4471"], "ids": [1],
                           "logprob": [-0.1], "control_logprob": [-3.1], "change": [3.0], "measured_on": "teacher-forced"}
    history = compare.remember([], payload("run:1", [result("receiver", [" 12"]), result("text", [" 4471"]), c2c,
                                                      result("c2c_control", [" 12"])]))
    assert compare.default_sides(history) == ("1:c2c", "1:c2c_control")
    html = compare.compare_html(history, "1:c2c", "1:c2c_control")
    assert "C2C's answer scored against its control" in html and 'data-change="3.0000"' in html
    assert "scored against" not in compare.compare_html(history, "1:text", "1:receiver")  # text holds no change here
