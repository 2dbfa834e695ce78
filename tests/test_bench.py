"""The benchmark CLI (kvviz.bench) and the performance table (kvviz.perf).

Unit tests run the real bench loop on the tiny random models of ``tests/tiny_models.py`` (the
engine's ``load_pair`` is pointed at them) with small JSONL datasets written here: resume after an
interruption, the split over processes and the merged summary, the CSV columns, the confidence
intervals, the multiple-choice likelihood column. The ``slow`` tests run the real embedded pair.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvviz import bench, engine, perf
from kvviz.cli import build_parser
from kvviz.data import load_dataset, wilson_interval
from kvviz.results import HandoffRequest, KVCommOptions
from tests.conftest import tiny_pair

REPO = Path(__file__).resolve().parents[1]

OPEN_RECORDS = [
    {"id": f"q{i}", "context": f"Uma is at the Mahaffie House number {i}.", "question": "Which country is Uma located in?",
     "answers": ["United States"]}
    for i in range(5)
]
CHOICE_RECORDS = [
    {"id": f"m{i}", "context": "The secret code word is pineapple.", "question": "What is the secret code word?",
     "choices": ["pineapple", "Paris", "the lazy dog", "bicycle"], "answer": i % 4}
    for i in range(3)
]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture()
def tiny_engine(monkeypatch):
    """Point the bench at the tiny gemma pair and count handoff calls."""
    pair = tiny_pair("gemma")
    monkeypatch.setattr(engine, "load_pair", lambda *a, **k: pair)
    calls = []
    real = engine.run_handoff

    def counting(name, loaded, request, on_token=None):
        calls.append((name, request.query, request.kvcomm.ratio, request.kvcomm.strategy))
        return real(name, loaded, request, on_token)

    monkeypatch.setattr(engine, "run_handoff", counting)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only add overhead, badly so on a busy machine
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "ACCELERATE_PROCESS_INDEX", "ACCELERATE_NUM_PROCESSES"):
        monkeypatch.delenv(name, raising=False)
    yield pair, calls
    torch.set_num_threads(threads)


def bench_args(dataset: Path, out: Path, *extra: str):
    return build_parser().parse_args(
        ["bench", "--pair", "tiny", "--dataset", str(dataset), "--out", str(out), "--quiet", "--max-new-tokens", "4",
         "--message-tokens", "4", *extra]
    )


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


# --- variants, scoring, summary ---------------------------------------------------------------


def test_kvcomm_becomes_one_variant_per_strategy_and_ratio():
    variants = bench.expand_variants(["receiver", "kvcomm", "text"], [0.3, 0.5], ["kvcomm", "random"])
    assert [v.label for v in variants] == [
        "receiver", "kvcomm@0.3", "kvcomm@0.5", "kvcomm-random@0.3", "kvcomm-random@0.5", "text"
    ]
    assert variants[1].handoff == "kvcomm" and variants[1].ratio == 0.3 and variants[1].strategy == "kvcomm"
    with pytest.raises(ValueError, match="Unknown handoff"):
        bench.expand_variants(["telepathy"], [0.5], ["kvcomm"])
    with pytest.raises(ValueError, match="strategy"):
        bench.expand_variants(["kvcomm"], [0.5], ["best"])
    with pytest.raises(ValueError, match="between 0 and 1"):
        bench.expand_variants(["kvcomm"], [1.5], ["kvcomm"])


def test_answer_scoring_open_and_choice():
    record = load_dataset_record(OPEN_RECORDS[0])
    scored = bench.score_answer(record, "The United States.")
    assert scored["kind"] == "open" and scored["correct_f1"] == 1 and scored["correct_contains"] == 1
    scored = bench.score_answer(record, "It is in the United States of America, I think")
    assert scored["correct_f1"] == 0 and scored["correct_contains"] == 1  # the two metrics disagree: both kept
    choice = load_dataset_record(CHOICE_RECORDS[1])  # answer B (Paris)
    scored = bench.score_answer(choice, "B. Paris")
    assert scored["kind"] == "choice" and scored["correct_letter"] == 1 and scored["correct"] == 1
    assert scored["gold_letter"] == "B" and scored["gold"] == "B. Paris"
    assert bench.score_answer(choice, "A")["correct_letter"] == 0
    query = bench.record_query(choice)
    assert "A. pineapple\nB. Paris" in query and query.endswith(bench.MC_INSTRUCTION)


def load_dataset_record(obj: dict):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = write_jsonl(Path(folder) / "one.jsonl", [obj])
        return load_dataset(str(path))[0]


def test_summary_accuracy_intervals_and_latency_statistics():
    rows = []
    for i in range(10):
        rows.append({"variant": "a", "handoff": "a", "kind": "open", "applicable": "1", "reason": "",
                     "correct_f1": str(int(i < 7)), "correct_contains": str(int(i < 9)),
                     "time_total": str(i + 1), "time_receiver_prefill": "0.5", "ttft": "0.1", "bytes": "100",
                     "flops_total": "1e9"})
    rows.append({"variant": "b", "handoff": "b", "kind": "open", "applicable": "0", "reason": "no fuser"})
    summary = bench.summarize(rows, order=["b", "a"])
    assert [entry["variant"] for entry in summary] == ["b", "a"]
    a = summary[1]
    assert a["acc_f1"] == pytest.approx(0.7) and a["n_f1"] == 10
    low, high = wilson_interval(7, 10)
    assert (a["acc_f1_low"], a["acc_f1_high"]) == pytest.approx((low, high))
    assert 0.39 < low < 0.40 and 0.89 < high < 0.90  # Wilson 7/10 by hand: [0.397, 0.892]
    assert a["acc_contains"] == pytest.approx(0.9)
    assert a["time_total_mean"] == pytest.approx(5.5) and a["time_total_median"] == pytest.approx(5.5)
    assert summary[0]["applicable"] == 0 and summary[0]["acc_f1"] is None
    text = bench.summary_markdown(summary)
    assert "| a | 10 | 0.70 [0.40, 0.89] | 0.90 [0.60, 0.98] |" in text
    assert "b: no fuser" in text


# --- the run: CSV, resume, same seed, split over processes ------------------------------------


def test_bench_writes_rows_summary_and_figures(tmp_path, tiny_engine):
    dataset = write_jsonl(tmp_path / "open.jsonl", OPEN_RECORDS)
    out = tmp_path / "run"
    args = bench_args(dataset, out, "--handoffs", "receiver,skyline,text,kvcomm", "--ratios", "0.3,1.0", "--limit", "3")
    assert bench.main(args) == 0
    rows = read_csv(out / "rows.csv")
    assert list(rows[0]) == bench.COLUMNS
    assert len(rows) == 3 * 5
    assert {row["variant"] for row in rows} == {"receiver", "skyline", "text", "kvcomm@0.3", "kvcomm@1"}
    for row in rows:
        assert row["applicable"] == "1"
        for column in bench.TIME_COLUMNS + ["bytes", "flops_total", "f1", "correct_f1", "correct_contains"]:
            assert row[column] != "", column
        assert float(row["time_total"]) > 0
    kv_rows = [row for row in rows if row["variant"].startswith("kvcomm")]
    assert all(row["selected_layers"] and int(row["bytes"]) > 0 for row in kv_rows)
    # KVComm with every layer equals Skyline (the engine's invariant, seen through the bench)
    by = {(row["sample_id"], row["variant"]): row for row in rows}
    for sample in {row["sample_id"] for row in rows}:
        assert by[(sample, "kvcomm@1")]["answer"] == by[(sample, "skyline")]["answer"]
    summary = read_csv(out / "summary.csv")
    assert [entry["variant"] for entry in summary] == ["receiver", "skyline", "text", "kvcomm@0.3", "kvcomm@1"]
    assert (out / "summary.md").read_text().count("\n| ") >= 5
    html = (out / "figures.html").read_text()
    assert "plotly" in html.lower() and "Wilson" in html
    assert json.loads((out / "config.json").read_text())["variants"][-1] == "kvcomm@1"


def test_interrupted_run_resumes_without_redoing_rows(tmp_path, tiny_engine, monkeypatch):
    pair, calls = tiny_engine
    dataset = write_jsonl(tmp_path / "open.jsonl", OPEN_RECORDS)
    out = tmp_path / "run"
    counting = engine.run_handoff

    def dies_after_five(*a, **k):
        if len(calls) >= 5:
            raise KeyboardInterrupt
        return counting(*a, **k)

    monkeypatch.setattr(engine, "run_handoff", dies_after_five)
    args = bench_args(dataset, out, "--handoffs", "receiver,skyline,kvcomm", "--ratios", "0.5", "--limit", "4")
    with pytest.raises(KeyboardInterrupt):
        bench.main(args)
    assert len(read_csv(out / "rows.csv")) == 5
    assert not (out / "summary.csv").exists()
    with (out / "rows.csv").open("ab") as handle:  # killed in the middle of writing a row
        handle.write(b"x,tiny,9,q9,receiver,rec")
    monkeypatch.setattr(engine, "run_handoff", counting)
    assert bench.main(args) == 0
    rows = read_csv(out / "rows.csv")
    assert len(rows) == 4 * 3 == len({(row["sample_id"], row["variant"]) for row in rows})
    assert len(calls) == 12  # 5 before the interruption + 7 after: nothing done twice
    assert bench.main(args) == 0 and len(calls) == 12  # a finished run does nothing
    # a larger --limit extends the same run
    assert bench.main(bench_args(dataset, out, "--handoffs", "receiver,skyline,kvcomm", "--ratios", "0.5", "--limit", "5")) == 0
    assert len(read_csv(out / "rows.csv")) == 15 and len(calls) == 15
    # --redo runs some variants again (e.g. C2C once its fuser has landed)
    assert bench.main(bench_args(dataset, out, "--handoffs", "receiver,skyline,kvcomm", "--ratios", "0.5", "--limit", "5",
                                 "--redo", "skyline")) == 0
    rows = read_csv(out / "rows.csv")
    assert len(rows) == 15 and len(calls) == 20 and calls[-1][0] == "skyline"
    # other settings in the same folder are refused, --fresh starts over
    with pytest.raises(ValueError, match="other settings"):
        bench.main(bench_args(dataset, out, "--handoffs", "receiver", "--seed", "3"))
    assert bench.main(bench_args(dataset, out, "--handoffs", "receiver", "--seed", "3", "--fresh", "--limit", "2")) == 0
    assert len(read_csv(out / "rows.csv")) == 2


def test_same_seed_gives_the_same_table(tmp_path, tiny_engine):
    dataset = write_jsonl(tmp_path / "open.jsonl", OPEN_RECORDS)
    tables = []
    for name, seed in (("a", "7"), ("b", "7"), ("c", "8")):
        out = tmp_path / name
        bench.main(bench_args(dataset, out, "--handoffs", "receiver,kvcomm", "--strategies", "random", "--ratios", "0.5",
                              "--limit", "3", "--seed", seed))
        rows = read_csv(out / "rows.csv")
        tables.append([(r["sample_id"], r["variant"], r["answer"], r["selected_layers"], r["correct_f1"]) for r in rows])
    assert tables[0] == tables[1]
    assert [t[0] for t in tables[0]] != [t[0] for t in tables[2]]  # another seed picks another order


def test_split_over_two_processes_merges_into_one_summary(tmp_path, tiny_engine, monkeypatch):
    dataset = write_jsonl(tmp_path / "open.jsonl", OPEN_RECORDS)
    out = tmp_path / "run"
    args = ["--handoffs", "receiver,skyline", "--limit", "5", "--no-shuffle"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert bench.main(bench_args(dataset, out, *args)) == 0
    assert not (out / "summary.csv").exists()  # rank 0 has not finished yet
    monkeypatch.setenv("RANK", "0")
    assert bench.main(bench_args(dataset, out, *args)) == 0
    part0, part1 = read_csv(out / "rows.part-0-of-2.csv"), read_csv(out / "rows.part-1-of-2.csv")
    assert {r["sample_index"] for r in part0} == {"0", "2", "4"} and {r["sample_index"] for r in part1} == {"1", "3"}
    summary = read_csv(out / "summary.csv")
    assert [(s["variant"], s["samples"]) for s in summary] == [("receiver", "5"), ("skyline", "5")]
    # --summarize rebuilds the same table from the part files
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    assert bench.main(bench_args(dataset, out, "--summarize")) == 0
    assert read_csv(out / "summary.csv") == summary


def test_unavailable_handoff_gets_rows_that_say_why(tmp_path, tiny_engine, monkeypatch):
    from kvviz.handoffs import HANDOFFS

    monkeypatch.setitem(bench.PENDING_HANDOFFS, "telepathy", "telepathy not available in this version of kvviz")
    monkeypatch.delitem(HANDOFFS, "telepathy", raising=False)
    dataset = write_jsonl(tmp_path / "open.jsonl", OPEN_RECORDS)
    out = tmp_path / "run"
    bench.main(bench_args(dataset, out, "--handoffs", "receiver,telepathy", "--limit", "2"))
    rows = [r for r in read_csv(out / "rows.csv") if r["variant"] == "telepathy"]
    assert len(rows) == 2 and all(r["applicable"] == "0" and "not available" in r["reason"] for r in rows)
    assert "telepathy: telepathy not available" in (out / "summary.md").read_text()


# --- multiple choice: the letter and the likelihood column -----------------------------------


def test_multiple_choice_rows_have_letter_and_likelihood(tmp_path, tiny_engine):
    dataset = write_jsonl(tmp_path / "mc.jsonl", CHOICE_RECORDS)
    out = tmp_path / "run"
    bench.main(bench_args(dataset, out, "--handoffs", "receiver,skyline,text,kvcomm", "--ratios", "1.0", "--limit", "3"))
    rows = read_csv(out / "rows.csv")
    assert {r["kind"] for r in rows} == {"choice"}
    for row in rows:
        assert row["gold_letter"] in "ABCD" and row["correct_letter"] in ("0", "1")
        assert row["likelihood_letter"] in "ABCD" and row["correct_likelihood"] in ("0", "1"), row["variant"]
    by = {(r["sample_id"], r["variant"]): r for r in rows}
    for sample in ("m0", "m1", "m2"):  # every layer sent: KVComm's state is Skyline's
        assert by[(sample, "kvcomm@1")]["likelihood_letter"] == by[(sample, "skyline")]["likelihood_letter"]
    summary = read_csv(out / "summary.csv")
    assert "acc_letter" in summary[0] and "acc_likelihood" in summary[0]
    assert "acc (likelihood)" in (out / "summary.md").read_text()


def test_option_scores_equal_a_direct_forward(tiny_engine):
    from kvviz import cache as kv
    from kvviz.prompts import build_segments, encode

    pair, _ = tiny_engine
    model = pair.receiver
    prompt = build_segments(model.tokenizer, "What is the secret code word?", "The secret code word is pineapple.").input_ids
    options = ["pineapple", "the lazy dog"]
    scores = bench.option_scores(model, kv.KVState(), prompt, options)
    for option, score in zip(options, scores):
        ids = encode(model.tokenizer, " " + option)
        with torch.no_grad():
            logits = model.model(input_ids=torch.tensor([prompt + ids])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        expected = sum(float(logprobs[len(prompt) - 1 + i, token]) for i, token in enumerate(ids))
        assert score == pytest.approx(expected / len(option.encode()), abs=1e-4)


def test_likelihood_state_of_kvcomm_with_every_layer_equals_skyline(tiny_engine):
    pair, _ = tiny_engine
    request = HandoffRequest(query="What is the secret code word?", context="The secret code word is pineapple.",
                             kvcomm=KVCommOptions(ratio=1.0))
    result = engine.run_handoff("kvcomm", pair, request)
    options = ["pineapple", "Paris", "the lazy dog"]
    scores = {}
    for name in ("skyline", "kvcomm"):
        (model, state, ids), note = bench._receiver_prompt_state(pair, bench.Variant(name, name), request, result)
        assert note == ""
        scores[name] = bench.option_scores(model, state, ids, options)
    assert scores["kvcomm"] == pytest.approx(scores["skyline"], abs=1e-4)
    built, note = bench._receiver_prompt_state(pair, bench.Variant("c2c", "c2c"), request, result)
    assert built is None and note.startswith("not computed")


# --- perf ------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [80, 121, 200])
def test_synthetic_context_has_the_exact_token_length(tiny_engine, length):
    from kvviz.prompts import build_segments

    pair, _ = tiny_engine
    text, measured = perf.synthetic_context(pair.receiver.tokenizer, length)
    assert measured == length == len(build_segments(pair.receiver.tokenizer, perf.QUESTION, text).context_ids)
    assert perf.FACT in text
    middle = (text.index(perf.FACT) + len(perf.FACT) / 2) / len(text)
    assert 0.35 < middle < 0.65


def test_peak_memory_sees_a_large_allocation():
    with perf.PeakMemory(torch.device("cpu")) as meter:
        block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        float(block.sum())
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
    table, measured = curve[1]["kvcomm_bytes"], curve[1]["kvcomm_bytes_measured"]
    assert table["kvcomm@0.3"] < table["kvcomm@0.5"] < table["kvcomm@1"]
    assert set(measured) == {"kvcomm@0.3", "kvcomm@0.5", "kvcomm@1"}  # real runs at the memory length
    assert all(measured[label] == table[label] for label in measured)  # the bytes formula is exact
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
    assert "decode ms/token" in text and "Warm full run" in text
    json.dumps(report)  # plain data


# --- slow: the real embedded pair ------------------------------------------------------------


def _cli_env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    return env


@pytest.mark.slow
def test_embedded_countries_bench_and_two_process_split(tmp_path, shared_data):
    """Two CPU processes (RANK / WORLD_SIZE as accelerate launch sets them) split a tiny real run."""
    out = tmp_path / "split"
    command = [sys.executable, "-m", "kvviz", "bench", "--pair", "embedded", "--dataset", "countries", "--handoffs",
               "receiver,kvcomm", "--ratios", "0.5", "--limit", "2", "--max-new-tokens", "8", "--quiet", "--out", str(out)]
    processes = []
    for rank in range(2):
        env = dict(_cli_env(), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
        processes.append(subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for process in processes:
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, output
    summary = read_csv(out / "summary.csv")
    assert [(s["variant"], s["samples"]) for s in summary] == [("receiver", "2"), ("kvcomm@0.5", "2")]
    rows = read_csv(out / "rows.part-0-of-2.csv") + read_csv(out / "rows.part-1-of-2.csv")
    assert sorted(r["sample_index"] for r in rows) == ["0", "0", "1", "1"]
    assert all(r["applicable"] == "1" and float(r["time_total"]) > 0 for r in rows)


def test_results_markdown_from_runs_and_perf(tmp_path, tiny_engine):
    open_set = write_jsonl(tmp_path / "open.jsonl", OPEN_RECORDS)
    choice_set = write_jsonl(tmp_path / "mc.jsonl", CHOICE_RECORDS)
    bench.main(bench_args(open_set, tmp_path / "open", "--handoffs", "receiver,skyline,kvcomm", "--ratios", "0.3", "--limit", "2"))
    bench.main(bench_args(choice_set, tmp_path / "mc", "--handoffs", "receiver,kvcomm", "--ratios", "0.3", "--limit", "2"))
    pair, _ = tiny_engine
    (tmp_path / "perf").mkdir()
    (tmp_path / "perf" / "perf.json").write_text(json.dumps(perf.measure(pair, [80], repeats=1, message_tokens=4)))
    path = tmp_path / "RESULTS.md"
    bench.write_results_markdown(str(path), [f"Open={tmp_path / 'open'}", f"Choice={tmp_path / 'mc'}"], str(tmp_path / "perf"), "make")
    text = path.read_text()
    assert "| handoff | Open (F1>0.5, n=2) | Open (contains, n=2) | Choice (letter, n=2) | Choice (likelihood, n=2) |" in text
    assert "| skyline |" in text and "not run" in text  # skyline was not run on the choice set
    assert "git commit" in text and "cores" in text and "## Performance" in text
    assert "C2C latency <= 0.4x text | c2c not available" in text
    assert "at 1024 tokens" not in text.split("## Performance")[0]  # no 1024 row measured: no verdict invented
