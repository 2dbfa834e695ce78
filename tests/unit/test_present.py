"""kvviz.app.present: a run's reading as text and tables for people (no models, no Gradio)."""

from __future__ import annotations

import json

import pandas as pd

from kvviz.app import present
from kvviz.app.methods import registry as methods
from kvviz.app.reading.reading import Column, read
from kvviz.core.results import STAGES, HandoffResult
from kvviz.handoffs import registry


def kvcomm_result() -> dict:
    timings = {stage: 0.01 for stage in STAGES} | {"total": 0.05}
    return HandoffResult(handoff="kvcomm", pair="hand", answer="4471", timings=timings, bytes_communicated=2048,
                         communication="kv", tokens={"context": 9, "generated": 2}, first_token_seconds=0.02,
                         seen={"sharer": "the note", "receiver": "the question"},
                         details={"selected_layers": [0, 3]}).to_dict()


def reading_of(*results, answers=("4471",), pair="hand"):
    return read(present.payload(pair, {"query": "Q"}, list(results), False), answers)


def column(result: dict, answers=("4471",)) -> Column:
    return reading_of(result, answers=answers).column(result["handoff"])


def test_user_text_is_escaped_in_markdown():
    escaped = present.md('<img src=x onerror="alert(1)"> *bold* [link](http://x)')
    assert escaped.count("<") == escaped.count("\\<") == 1 and "\\*bold\\*" in escaped
    result = {"handoff": "kvcomm", "applicable": False, "reason": "<script>alert(1)</script>"}
    stats = present.stats_markdown(column(result))
    assert stats.startswith("**Not applicable:**") and stats.count("<") == stats.count("\\<")


def test_stats_show_time_bytes_and_the_handoffs_own_notes():
    stats = present.stats_markdown(column(kvcomm_result()))
    assert "**50 ms in this shared run on hand**" in stats and "first token 20 ms" in stats
    assert "**2.0 KB** sent as kv" in stats and "2 tokens answered" in stats
    assert "layers sent: 0, 3" in stats  # the KVComm descriptor's note
    assert "KVComm: right, but its control did not run: unchecked" in stats  # what it is evidence of
    assert present.stats_markdown(Column("kvcomm", "running", None, "running")) == "*running ...*"
    assert "precomputed" in present.stats_markdown(column(dict(kvcomm_result(), precomputed=True)))


def test_a_time_says_whether_it_was_taken_alone_or_in_a_shared_run():
    shared = kvcomm_result()  # a live run's result: its wall clock while other columns ran
    timing = lambda result: column(result).timing  # noqa: E731
    assert present.time_text(timing(shared)) == "50 ms in this shared run on hand"  # each card names the pair
    assert present.time_text(timing(dict(shared, precomputed=True))) == "50 ms alone on hand"  # one handoff at a time
    assert present.time_text(timing(dict(shared, timed="alone"))) == "50 ms alone on hand"
    beside = present.time_text(timing(dict(shared, alone_total=0.012)))
    assert beside == "12 ms alone (precomputed) · 50 ms in this shared run on hand"
    assert present.card_stats(column(dict(shared, timed="alone"))).startswith("50 ms alone on hand · first token 20 ms")
    long_pair = reading_of(shared, pair="HuggingFaceTB/SmolLM2-135M-Instruct+google/gemma-3-270m").column("kvcomm")
    assert present.time_text(long_pair.timing).endswith("in this shared run on HuggingFaceTB/SmolLM2-135M-…")


def test_a_card_says_what_it_did_with_the_swapped_note_and_what_that_means():
    swap = {"context": "The code is 3902.", "answers": ["3902"], "changed": "4471 -> 3902", "answer": "<b>3902</b>",
            "applicable": True, "outcome": "followed"}
    result = dict(kvcomm_result(), swap=swap)
    row = present.swap_row_html(column(result))
    assert 'data-swap="followed"' in row and "&lt;b&gt;3902&lt;/b&gt;" in row and "<b>3902" not in row
    assert "KVComm followed the swap: what it answers is the note&#x27;s content" in row  # on hover
    assert present.swap_meaning(column(result)) == "KVComm followed the swap: what it answers is the note's content"
    kept = dict(result, swap=dict(swap, outcome="kept"))
    assert 'data-swap="kept"' in present.swap_row_html(column(kept))
    assert "did not come from this fact" in present.swap_meaning(column(kept))
    assert 'data-swap="none"' in present.swap_row_html(column(kvcomm_result()))  # no swapped note ran
    both = read(dict(present.payload("hand", {"query": "Q"}, [result, dict(kept, handoff="receiver")], False), swap=swap),
                ["4471"])
    status = present.swap_status(both, ["kvcomm", "receiver"])
    assert present.md("4471 -> 3902") in status and "so the note now answers “3902”" in status and "*hand*" in status
    assert "Followed the swap (what they answer is the note's content): **KVComm**" in status
    assert "kept their answer (it did not come from this fact): **Receiver**" in status


def test_seen_text_lists_what_each_model_read_in_order():
    text = present.seen_text(column(dict(kvcomm_result(), seen={"receiver": "Q", "sharer": "C", "extra": "E"})).result)
    assert text.index("What the sharer read") < text.index("What the receiver read") < text.index("--- extra ---")
    assert present.seen_text(None) == ""


def test_results_frame_has_one_row_per_result_and_a_fixed_layout():
    off = HandoffResult.not_applicable("skyline", "hand", "needs a context").to_dict()
    frame = present.results_frame(reading_of(kvcomm_result(), off))
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == present.RESULT_COLUMNS
    assert list(frame["handoff"]) == ["kvcomm", "skyline"]
    assert frame.loc[0, "title"] == registry.get("kvcomm").title and frame.loc[0, "notes"] == "layers sent: 0, 3"
    assert not frame.loc[1, "applicable"] and frame.loc[1, "reason"] == "needs a context"
    assert present.results_frame(read({}, ())).empty


def test_the_pages_table_rounds_seconds_to_the_millisecond_and_the_csv_keeps_them_whole(tmp_path):
    result = {**kvcomm_result(), "timings": {"total": 2.192389952000667}, "first_token_seconds": 0.123456789}
    reading = reading_of(result)
    shown = present.reading_frame(reading)
    assert shown.loc[0, "total_s"] == 2.192 and shown.loc[0, "first_token_s"] == 0.123
    assert list(shown.columns) == present.RESULT_COLUMNS and shown.loc[0, "answer"] == result["answer"]
    assert present.results_frame(reading).loc[0, "total_s"] == 2.192389952000667  # the export's table


def test_exports_write_the_payload_and_its_table(tmp_path):
    data = present.payload("hand", {"query": "Q"}, [kvcomm_result()], False)
    json_path, csv_path = present.write_exports(data, read(data, ()), tmp_path)
    assert json.loads(open(json_path, encoding="utf-8").read()) == data
    table = pd.read_csv(csv_path)
    assert list(table.columns) == present.RESULT_COLUMNS and table.loc[0, "answer"] == 4471


def test_the_page_export_keeps_the_per_token_attention_in_a_file_of_its_own(tmp_path, monkeypatch):
    """The page's Export: the answers and per-layer numbers in a small JSON, the per-token attention
    (thousands of numbers per column) apart, whole."""
    import tempfile

    from kvviz.app import ui

    attention = {"attention": [[[[0.25, 0.75]]]], "other": [[[0.0]]], "layers": 1, "heads": 1, "sent_tokens": ["a", "b"]}
    data = present.payload("hand", {"query": "Q"}, [{**kvcomm_result(), "token_attention": attention}], False)
    monkeypatch.setattr(tempfile, "mkdtemp", lambda prefix="": str(tmp_path))
    demo = ui.build_demo(precomputed={}, sweep=None)
    export = next(fn for fn in demo.fns.values() if fn.api_name == "export")
    small, table, large = export.fn(data, None)  # no session's reading: the export reads what it is given
    assert json.loads(open(large, encoding="utf-8").read()) == {"kvcomm": attention}
    kept = json.loads(open(small, encoding="utf-8").read())["results"][0]
    assert "in the attention export" in kept["token_attention"]["attention"] and kept["answer"] == data["results"][0]["answer"]
    assert table.endswith(".csv")


def test_column_head_and_how_it_works_come_from_the_descriptor_and_the_page_entry():
    handoff = registry.get("skyline")
    head = present.card_head_html("skyline", "right")
    assert handoff.color in head and handoff.title in head and handoff.summary in head
    assert handoff.label in head and 'data-verdict="right"' in head
    text = present.how_it_works_markdown("skyline")
    assert text.startswith(methods.page_of("skyline").explanation) and "*Needs:* a private context." in text
    assert "<svg" in present.diagram_html("skyline")


def test_every_handoff_has_a_diagram_from_one_template_and_its_text_reads_at_4_5_to_1():
    import re

    from kvviz.core.plotkit import contrast_ratio

    for name in methods.column_names():
        drawn = present.diagram_html(name)
        assert 'role="img"' in drawn and "aria-label=" in drawn and "Receiver" in drawn, name
        fills = dict(re.findall(r'<rect x="(\d+)"[^>]*fill="(#[0-9a-fA-F]{6})"', drawn))
        for x, color in re.findall(r'<text x="(\d+)"[^>]*fill="(#[0-9a-fA-F]{6})"', drawn):
            box = next((fill for left, fill in fills.items() if int(left) <= int(x) <= int(left) + 138), "#ffffff")
            assert contrast_ratio(color, box) >= 4.5, (name, color, box)


def test_pair_facts_need_no_weights():
    text = present.pair_facts_markdown("embedded")
    assert "| sharer | smollm2-135m |" in text and "same-shape sender" in text and "| hidden |" in text
    assert present.pair_facts_markdown("nope").startswith("**Unknown pair")
