"""The performance study (kvviz.studies.perf) on the tiny pair: exact synthetic context lengths, peak
memory, the report and its markdown, the issue-6 targets."""

from __future__ import annotations

import json
import time

import pytest
import torch

from kvviz.engine import runner
from kvviz.studies import perf
from kvviz.studies.perf_inputs import FACT


@pytest.mark.parametrize("length", [80, 121, 200])
def test_synthetic_context_has_the_exact_token_length(tiny_engine, length):
    from kvviz.core.prompts import build_segments

    pair, _ = tiny_engine
    text, measured = perf.synthetic_context(pair.receiver.tokenizer, length)
    assert measured == length == len(build_segments(pair.receiver.tokenizer, perf.QUESTION, text).context_ids)
    assert FACT in text
    middle = (text.index(FACT) + len(FACT) / 2) / len(text)
    assert 0.35 < middle < 0.65


def test_peak_memory_sees_a_large_allocation():
    with perf.PeakMemory(torch.device("cpu")) as meter:
        block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        float(block.sum())
        time.sleep(0.2)  # held long enough for the 1 ms sampler to run even on a busy machine
        del block
    assert meter.peak_bytes >= 32 * 2**20  # sampled every ms: most of it is seen


def test_perf_report_on_the_tiny_pair(tiny_engine):
    pair, _ = tiny_engine
    report = perf.measure(pair, [80, 120], repeats=2, message_tokens=4)
    curve = report["context_curve"]
    assert [row["context_tokens"] for row in curve] == [80, 120]
    entry = curve[1]["kvcomm"]["kvcomm@0.3"]
    assert entry["ttft_ratio_receiver"]["n"] == 2 and entry["ttft_ratio_receiver"]["median"] > 0
    assert entry["flops_ratio_receiver"] < entry["flops_ratio_e2e"]
    sent = curve[1]["kvcomm_bytes"]  # read from a run at each ratio
    assert set(sent) == {"kvcomm@0.3", "kvcomm@0.5", "kvcomm@1"} and sent["kvcomm@0.3"] < sent["kvcomm@0.5"] < sent["kvcomm@1"]
    context, _ = perf.synthetic_context(pair.receiver.tokenizer, 120)
    every_layer = runner.run_handoff("kvcomm", pair, perf.request_for(perf.QUESTION, context, 1, ratio=1.0))
    assert sent["kvcomm@1"] == every_layer.bytes_communicated  # the same run's result, not a formula
    assert report["shared_question"]["c2c_unavailable"].startswith("c2c not available")
    assert set(report["memory"]["peak_bytes"]) >= {"receiver", "skyline", "text", "kvcomm@0.3"}
    text = perf.markdown(report)
    assert "C2C / text latency | c2c not available" in text and "receiver-side" in text and "end-to-end" in text
    # the speed table: every model's decode speed beside the machine's limits, and the full run
    assert set(report["decode_ms_per_token"]) == {pair.receiver.name}
    assert report["decode_ms_per_token"][pair.receiver.name] > 0
    assert report["warm_full_run_seconds"] > 0
    model = report["speed"]["models"][0]
    assert model["limits"]["stream_weights_ms"]["median"] > 0 and model["limits"]["head_product_ms"]["median"] > 0
    assert model["ratios"]["decode / stream weights"]["n"] == 2
    assert "step ms" in text and "Warm run" in text
    # decode steps shared by 1, 2, 4 and 6 sequences, the stack against its own weight-stream time
    assert set(report["speed"]["batched_decode_ms"][pair.receiver.name]) == {"1", "2", "4", "6"}
    assert model["ratios"]["stack / stack stream"]["median"] > 0 and model["decode_path"]["batched"]
    assert report["speed"]["warm_serial_run_seconds"] > 0 and report["speed"]["warm_page_run_seconds"] is None
    # the numeric modes: this process's, and each mode's models (a model built in memory has no other mode)
    assert report["speed"]["numeric_mode"] == "fp32" and report["speed"]["modes"]["fp32"]["models"][0]["model"] == pair.receiver.name
    assert "runs_at_once" not in report["speed"]  # the speed report's (below)
    # the run recording what crossed, and what it spent on it
    assert report["speed"]["warm_recorded_run_seconds"] > 0
    assert set(report["speed"]["full_run"]["crossed_cpu_seconds_per_run"]) >= {"attention_and_lens", "scoring"}
    verdicts = {row["target"]: row["verdict"] for row in report["speed"]["targets"]}
    assert verdicts[next(t for t in verdicts if t.startswith("warm page run"))] == "not measured"  # no page here
    assert all(v in ("met", "missed", "not measured") for v in verdicts.values())
    json.dumps(report)  # plain data


def test_targets_give_a_verdict_only_for_what_was_measured():
    assert perf.targets(None, {}) == []
    summaries = {"countries": [{"variant": "skyline", "acc_f1": 0.2}, {"variant": "kvcomm@0.3", "acc_f1": 0.1}]}
    (target, measured, verdict), = perf.targets(None, summaries)
    assert "Countries" in target and measured == "0.10 vs 0.20 (50%)" and verdict == "missed"


def test_speed_only_prints_the_speed_table_and_nothing_else(tiny_engine, capsys, tmp_path):
    from kvviz.cli import main

    assert main(["bench", "--perf", "--speed-only", "--no-page", "--pair", "tiny", "--repeats", "1", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "step ms" in printed and "Warm run" in printed and "Distinct runs at once" in printed and "Targets (issue 42)" in printed
    assert "KVComm / Skyline" not in printed  # the context curve was not measured
    report = json.loads((tmp_path / "perf.json").read_text())
    assert set(report) == {"machine", "repeats", "pair", "speed", "numeric_mode", "batched_decode_ms", "stack_stream_ratio",
                           "step_stream_ratio", "warm_full_run_seconds", "warm_recorded_run_seconds",
                           "warm_serial_run_seconds", "warm_page_run_seconds", "page_over_process_ratio",
                           "page_over_plain_ratio", "runs_at_once", "class_load", "targets"}
    # runs at once: 1, 4 and 8 distinct runs, every answer as alone
    counts = report["runs_at_once"]["counts"]
    assert report["runs_at_once"]["computed"] == "in this process"  # KVVIZ_RUN_PROCESSES=0 (tiny_engine)
    assert set(counts) == {"1", "4", "8"} and all(c["answers_different_from_alone"] == 0 for c in counts.values())
    assert counts["1"]["over_one_run"] == pytest.approx(1.0)
    assert report["warm_page_run_seconds"] is None and report["page_over_process_ratio"] is None  # --no-page


def test_the_page_run_is_paired_round_by_round_with_the_run_in_process(monkeypatch):
    """Each round runs the request in this process right before its /run call, and the page's cost is
    the median of the rounds' own ratios: a drift of the machine between rounds cancels out."""
    import sys
    import types

    from kvviz.studies import page_speed, speed

    order, clock = [], {"now": 0.0}
    slowdown = iter([1.0, 1.0, 2.0, 2.0])  # the machine halves its speed after the second timed round

    class Client:
        def __init__(self, url, verbose):
            pass

        def predict(self, **kwargs):
            order.append("page")
            clock["now"] += 1.2 * current["factor"]

    current = {"factor": 1.0}

    def beside() -> float:
        current["factor"] = next(slowdown)
        order.append("in process")
        return 1.0 * current["factor"]

    monkeypatch.setattr(page_speed, "serve_page", lambda name: (None, "http://127.0.0.1:1/"))
    monkeypatch.setattr(page_speed, "stop_page", lambda server: None)
    monkeypatch.setattr(page_speed.time, "perf_counter", lambda: clock["now"])
    monkeypatch.setitem(sys.modules, "gradio_client", types.SimpleNamespace(Client=Client))
    page = page_speed.page_run("embedded", 3, beside=beside)
    assert order == ["in process", "page"] * 4  # a warm-up round, then three
    assert page["in_process_seconds"]["median"] == 2.0 and page["warm_page_run_seconds"]["median"] == pytest.approx(2.4)
    assert page["page_over_process"]["median"] == pytest.approx(1.2)  # every round 1.2x, whatever the drift
    # the report's ratio is the rounds', not the page's median over the full run's, measured minutes apart
    full = {f"warm_{way}_run_seconds": {"median": 5.0} for way in ("full", "recorded", "serial")}
    report = {"models": [], "full_run": full, "page_run": page, "numeric_mode": "fp32"}
    speed.summarize(report)
    assert report["page_over_process_ratio"] == pytest.approx(1.2) == report["page_over_plain_ratio"]
    verdict = next(row for row in report["targets"] if row["target"].startswith("page <="))
    assert verdict["measured"] == "1.20x" and verdict["verdict"] == "missed"  # the target is 1.15x
