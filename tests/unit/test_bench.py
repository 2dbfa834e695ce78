"""The benchmark (kvviz.studies.bench): running, rows on disk, scoring, summarising, the RESULTS.md writer.

These run the real bench loop on the tiny random models of ``tests/tiny_models.py`` (the
engine's ``load_pair`` is pointed at them) with small JSONL datasets written here: resume after an
interruption, the split over processes and the merged summary, the CSV columns, the confidence
intervals, the multiple-choice likelihood column. tests/integration/test_bench.py runs the embedded pair.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

from kvviz.cli import build_parser
from kvviz.data import MC_INSTRUCTION, choice_query, load_dataset, wilson_interval
from kvviz.engine import runner
from kvviz.handoffs import registry
from kvviz.handoffs.kvcomm.options import options_of
from kvviz.studies import bench, perf
from kvviz.studies.bench import report, run, scoring, summary
from kvviz.studies.bench import rows as bench_rows
from tests.conftest import REPO_ROOT

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


def bench_args(dataset: Path, out: Path, *extra: str):
    return build_parser().parse_args(
        ["bench", "--pair", "tiny", "--dataset", str(dataset), "--out", str(out), "--quiet", "--max-new-tokens", "4",
         "--message-tokens", "4", *extra]
    )


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_variants_come_from_the_registry_and_bad_values_are_refused():
    variants = run.expand_variants(["receiver", "text"])
    assert [(v.label, v.handoff, v.options) for v in variants] == [("receiver", "receiver", {}), ("text", "text", {})]
    with pytest.raises(ValueError, match="Unknown handoff"):
        run.expand_variants(["telepathy"])
    with pytest.raises(ValueError, match="not one of"):
        run.expand_variants(["kvcomm"], {"kvcomm": {"strategy": "best"}})
    with pytest.raises(ValueError, match="between 0 and 1"):
        run.expand_variants(["kvcomm"], {"kvcomm": {"ratio": "1.5"}})
    with pytest.raises(ValueError, match="listed twice"):
        run.expand_variants(["receiver", "receiver"])


def test_answer_scoring_open_and_choice():
    record = load_dataset_record(OPEN_RECORDS[0])
    scored = scoring.score_answer(record, "The United States.")
    assert scored["kind"] == "open" and scored["correct_f1"] == 1 and scored["correct_contains"] == 1
    scored = scoring.score_answer(record, "It is in the United States of America, I think")
    assert scored["correct_f1"] == 0 and scored["correct_contains"] == 1  # the two metrics disagree: both kept
    choice = load_dataset_record(CHOICE_RECORDS[1])  # answer B (Paris)
    scored = scoring.score_answer(choice, "B. Paris")
    assert scored["kind"] == "choice" and scored["correct_letter"] == 1 and scored["correct"] == 1
    assert scored["gold_letter"] == "B" and scored["gold"] == "B. Paris"
    assert scoring.score_answer(choice, "A")["correct_letter"] == 0
    query = choice_query(choice)  # the one multiple-choice prompt (eval-fuser asks the same)
    assert "A. pineapple\nB. Paris" in query and query.endswith(MC_INSTRUCTION)
    assert choice_query(record) == record.question


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
    table = summary.summarize(rows, order=["b", "a"])
    assert list(table["variant"]) == ["b", "a"]
    entries = summary.records(table)
    a = entries[1]
    assert a["acc_f1"] == pytest.approx(0.7) and a["n_f1"] == 10
    low, high = wilson_interval(7, 10)
    assert (a["acc_f1_low"], a["acc_f1_high"]) == pytest.approx((low, high))
    assert 0.39 < low < 0.40 and 0.89 < high < 0.90  # Wilson 7/10 by hand: [0.397, 0.892]
    assert a["acc_contains"] == pytest.approx(0.9)
    assert a["time_total_mean"] == pytest.approx(5.5) and a["time_total_median"] == pytest.approx(5.5)
    assert entries[0]["applicable"] == 0 and entries[0]["acc_f1"] is None
    text = summary.summary_markdown(table)
    assert "| a | 10 | 0.70 [0.40, 0.89] | 0.90 [0.60, 0.98] |" in text
    assert "b: no fuser" in text


def test_bench_writes_rows_summary_and_figures(tmp_path, tiny_engine):
    dataset = write_jsonl(tmp_path / "open.jsonl", OPEN_RECORDS)
    out = tmp_path / "run"
    args = bench_args(dataset, out, "--handoffs", "receiver,skyline,text,kvcomm", "--ratios", "0.3,1.0", "--limit", "3")
    assert bench.main(args) == 0
    rows = read_csv(out / "rows.csv")
    assert list(rows[0]) == bench_rows.COLUMNS
    assert len(rows) == 3 * 5
    assert {row["variant"] for row in rows} == {"receiver", "skyline", "text", "kvcomm@0.3", "kvcomm@1"}
    for row in rows:
        assert row["applicable"] == "1"
        for column in bench_rows.TIME_COLUMNS + ["bytes", "flops_total", "f1", "correct_f1", "correct_contains"]:
            assert row[column] != "", column
        assert float(row["time_total"]) > 0
    kv_rows = [row for row in rows if row["variant"].startswith("kvcomm")]
    assert all(row["selected_layers"] and int(row["bytes"]) > 0 for row in kv_rows)
    # KVComm with every layer equals Skyline (the engine's invariant, seen through the bench)
    by = {(row["sample_id"], row["variant"]): row for row in rows}
    for sample in {row["sample_id"] for row in rows}:
        assert by[(sample, "kvcomm@1")]["answer"] == by[(sample, "skyline")]["answer"]
    table = read_csv(out / "summary.csv")
    assert [entry["variant"] for entry in table] == ["receiver", "skyline", "text", "kvcomm@0.3", "kvcomm@1"]
    assert (out / "summary.md").read_text().count("\n| ") >= 5
    html = (out / "figures.html").read_text()
    assert "plotly" in html.lower() and "Wilson" in html
    assert json.loads((out / "config.json").read_text())["variants"][-1] == "kvcomm@1"


def test_kvcomm_calibrates_on_the_tasks_first_sample_which_is_not_scored(tmp_path, tiny_engine):
    dataset = write_jsonl(tmp_path / "open.jsonl", OPEN_RECORDS)
    out = tmp_path / "run"
    assert bench.main(bench_args(dataset, out, "--handoffs", "receiver,kvcomm", "--ratios", "0.5", "--limit", "3",
                                 "--no-shuffle")) == 0
    rows = read_csv(out / "rows.csv")
    assert {row["sample_id"] for row in rows} == {"q1", "q2", "q3"}  # q0 calibrates: not scored, 3 scored
    config = json.loads((out / "config.json").read_text())
    assert config["calibration_sample"] == "q0" and config["calibrated_handoffs"] == ["kvcomm"]
    assert "calibrated on the task's first sample, q0" in (out / "summary.md").read_text()
    # --calibration given: no sample is set aside
    other = tmp_path / "builtin"
    assert bench.main(bench_args(dataset, other, "--handoffs", "receiver,kvcomm", "--ratios", "0.5", "--limit", "3",
                                 "--no-shuffle", "--calibration", "builtin")) == 0
    assert {row["sample_id"] for row in read_csv(other / "rows.csv")} == {"q0", "q1", "q2"}
    assert "calibrated" not in (other / "summary.md").read_text()


def test_bench_request_carries_the_calibration_sample_to_kvcomm_only():
    records = load_dataset(str(write_jsonl(Path(os.environ.get("TMPDIR", "/tmp")) / "kvviz_cal.jsonl", OPEN_RECORDS)))
    args = bench_args(Path("unused.jsonl"), Path("unused"))
    kv = run.variant_request(records[1], run.Variant("kvcomm@0.5", "kvcomm", {"ratio": 0.5}), args, {}, records[0])
    assert options_of(kv).calibration == "sample" and options_of(kv).calibration_sample == (records[0].context, choice_query(records[0]))
    text = run.variant_request(records[1], run.Variant("text", "text"), args, {}, records[0])
    assert options_of(text).calibration == "builtin"


def test_interrupted_run_resumes_without_redoing_rows(tmp_path, tiny_engine, monkeypatch):
    pair, calls = tiny_engine
    dataset = write_jsonl(tmp_path / "open.jsonl", OPEN_RECORDS)
    out = tmp_path / "run"
    counting = runner.run_handoff

    def dies_after_five(*a, **k):
        if len(calls) >= 5:
            raise KeyboardInterrupt
        return counting(*a, **k)

    monkeypatch.setattr(runner, "run_handoff", dies_after_five)
    args = bench_args(dataset, out, "--handoffs", "receiver,skyline,kvcomm", "--ratios", "0.5", "--limit", "3")
    with pytest.raises(KeyboardInterrupt):
        bench.main(args)
    assert len(read_csv(out / "rows.csv")) == 5
    assert not (out / "summary.csv").exists()
    with (out / "rows.csv").open("ab") as handle:  # killed in the middle of writing a row
        handle.write(b"x,tiny,9,q9,receiver,rec")
    monkeypatch.setattr(runner, "run_handoff", counting)
    assert bench.main(args) == 0
    rows = read_csv(out / "rows.csv")
    # 3 scored samples (KVComm's calibration sample, the first, is not scored) x 3 variants
    assert len(rows) == 3 * 3 == len({(row["sample_id"], row["variant"]) for row in rows})
    assert len(calls) == 9  # 5 before the interruption + 4 after: nothing done twice
    assert bench.main(args) == 0 and len(calls) == 9  # a finished run does nothing
    # a larger --limit extends the same run
    assert bench.main(bench_args(dataset, out, "--handoffs", "receiver,skyline,kvcomm", "--ratios", "0.5", "--limit", "4")) == 0
    assert len(read_csv(out / "rows.csv")) == 12 and len(calls) == 12
    # --redo runs some variants again (e.g. C2C once its fuser has landed)
    assert bench.main(bench_args(dataset, out, "--handoffs", "receiver,skyline,kvcomm", "--ratios", "0.5", "--limit", "4",
                                 "--redo", "skyline")) == 0
    rows = read_csv(out / "rows.csv")
    assert len(rows) == 12 and len(calls) == 16 and calls[-1][0] == "skyline"
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
    table = read_csv(out / "summary.csv")
    assert [(s["variant"], s["samples"]) for s in table] == [("receiver", "5"), ("skyline", "5")]
    # --summarize rebuilds the same table from the part files
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    assert bench.main(bench_args(dataset, out, "--summarize")) == 0
    assert read_csv(out / "summary.csv") == table


def test_a_handoff_that_does_not_apply_gets_rows_that_say_why_without_running(tmp_path, tiny_engine, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("a handoff that does not apply must not run")

    # the tiny pair has no fuser: C2C does not apply
    monkeypatch.setitem(registry.HANDOFFS, "c2c", dataclasses.replace(registry.get("c2c"), run=must_not_run))
    dataset = write_jsonl(tmp_path / "open.jsonl", OPEN_RECORDS)
    out = tmp_path / "run"
    bench.main(bench_args(dataset, out, "--handoffs", "receiver,c2c", "--limit", "2"))
    rows = [r for r in read_csv(out / "rows.csv") if r["variant"] == "c2c"]
    assert len(rows) == 2 and all(r["applicable"] == "0" and "No trained C2C fuser" in r["reason"] for r in rows)
    assert "c2c: No trained C2C fuser" in (out / "summary.md").read_text()


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
    scored = {r["sample_id"] for r in rows}
    assert len(scored) == 2  # of 3: the first calibrates KVComm
    for sample in scored:  # every layer sent: KVComm's state is Skyline's
        assert by[(sample, "kvcomm@1")]["likelihood_letter"] == by[(sample, "skyline")]["likelihood_letter"]
    summary = read_csv(out / "summary.csv")
    assert "acc_letter" in summary[0] and "acc_likelihood" in summary[0]
    assert "acc (likelihood)" in (out / "summary.md").read_text()


def test_option_scores_equal_a_direct_forward(tiny_engine):
    from kvviz.core.prompts import build_segments, encode
    from kvviz.handoffs.common import read_prompt

    pair, _ = tiny_engine
    model = pair.receiver
    prompt = build_segments(model.tokenizer, "What is the secret code word?", "The secret code word is pineapple.").input_ids
    options = ["pineapple", "the lazy dog"]
    scores = scoring.option_scores(read_prompt(model, prompt), options)
    for option, score in zip(options, scores):
        ids = encode(model.tokenizer, " " + option)
        with torch.no_grad():
            logits = model.model(input_ids=torch.tensor([prompt + ids])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        expected = sum(float(logprobs[len(prompt) - 1 + i, token]) for i, token in enumerate(ids))
        assert score == pytest.approx(expected / len(option.encode()), abs=1e-4)


def test_every_handoff_either_rebuilds_its_receiver_or_says_why():
    for handoff in registry.all_handoffs():
        assert handoff.receiver_prompt is not None or handoff.no_receiver_prompt.startswith("not computed"), handoff.name


def test_results_markdown_from_runs_and_perf(tmp_path, tiny_engine):
    open_set = write_jsonl(tmp_path / "open.jsonl", OPEN_RECORDS)
    choice_set = write_jsonl(tmp_path / "mc.jsonl", CHOICE_RECORDS)
    bench.main(bench_args(open_set, tmp_path / "open", "--handoffs", "receiver,skyline,kvcomm", "--ratios", "0.3", "--limit", "2"))
    bench.main(bench_args(choice_set, tmp_path / "mc", "--handoffs", "receiver,kvcomm", "--ratios", "0.3", "--limit", "2"))
    pair, _ = tiny_engine
    (tmp_path / "perf").mkdir()
    (tmp_path / "perf" / "perf.json").write_text(json.dumps(perf.measure(pair, [80], repeats=1, message_tokens=4)))
    path = tmp_path / "RESULTS.md"
    report.write_results_markdown(str(path), [f"Open={tmp_path / 'open'}", f"Choice={tmp_path / 'mc'}"], str(tmp_path / "perf"), "make")
    text = path.read_text()
    assert "| handoff | Open (F1>0.5, n=2) | Open (contains, n=2) | Choice (letter, n=2) | Choice (likelihood, n=2) |" in text
    assert "| skyline |" in text and "not run" in text  # skyline was not run on the choice set
    assert "KVComm calibrated on the task's first sample, `" in text  # named, and left out of the score
    assert "git commit" in text and "cores" in text and "## Performance" in text
    assert "C2C latency <= 0.4x text | c2c not available" in text
    assert "at 1024 tokens" not in text.split("## Performance")[0]  # no 1024 row measured: no verdict invented


def test_regenerating_results_keeps_the_load_test_section(tmp_path):
    from kvviz.studies.bench.report import kept_sections

    path = tmp_path / "RESULTS.md"
    path.write_text("# old\n\nold numbers\n\n<!-- load-test:start -->\n## Load test\n| a | b |\n<!-- load-test:end -->\n")
    assert kept_sections(path) == "\n<!-- load-test:start -->\n## Load test\n| a | b |\n<!-- load-test:end -->\n"
    assert kept_sections(tmp_path / "missing.md") == ""


def test_regenerating_results_keeps_the_kvcomm_table_section(tmp_path):
    from kvviz.studies.bench.report import kept_sections

    path = tmp_path / "RESULTS.md"
    path.write_text("# old\n<!-- load-test:start -->\nL\n<!-- load-test:end -->\n"
                    "<!-- kvcomm-table:start -->\nK\n<!-- kvcomm-table:end -->\n")
    kept = kept_sections(path)
    assert "<!-- kvcomm-table:start -->\nK\n<!-- kvcomm-table:end -->" in kept and "L" in kept


def test_regenerating_results_keeps_the_latent_relay_and_steering_section(tmp_path):
    from kvviz.studies.bench.report import kept_sections

    path = tmp_path / "RESULTS.md"
    path.write_text("# old\n<!-- steer-table:start -->\nS\n<!-- steer-table:end -->\n")
    assert "<!-- steer-table:start -->\nS\n<!-- steer-table:end -->" in kept_sections(path)


def test_steer_results_section_pairs_samples_and_says_what_was_measured(tmp_path, monkeypatch):
    """research/steer_results.py on hand-made bench rows: only samples every variant answered
    count; N = 0 against Skyline answer for answer; McNemar per comparison; how often steering
    changed the receiver's answer and how often the changed answer was right."""
    import importlib.util

    monkeypatch.syspath_prepend(str(REPO_ROOT / "research"))
    spec = importlib.util.spec_from_file_location("steer_results", REPO_ROOT / "research" / "steer_results.py")
    steer_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(steer_results)
    right = {"receiver": [0] * 10, "skyline": [1] * 4 + [0] * 6, "latent_relay@0": [1] * 4 + [0] * 6,
             "latent_relay@2": [1] * 3 + [0] * 7, "kv_steering-answer_briefly@4": [0] * 9 + [1]}
    rows = []
    for variant, correct in right.items():
        for i in range(10):
            answer = f"{variant}-{i}" if variant.startswith("kv_steering") and i >= 7 else f"{'s' if correct[i] else 'r'}{i}"
            if variant == "latent_relay@0":
                answer = f"{'s' if right['skyline'][i] else 'r'}{i}"  # Skyline's answer, word for word
            rows.append({"sample_id": f"s{i}", "variant": variant, "applicable": "1", "correct": str(correct[i]),
                         "answer": answer, "correct_contains": str(correct[i]), "ttft": "1.0",
                         "time_sharer_decode": "0.4", "time_receiver_decode": "0.3",
                         "generated_tokens": "3"})
    rows.append({**rows[0], "sample_id": "s10"})  # answered by the receiver only: not paired, left out
    folder = tmp_path / "steer-countries"
    folder.mkdir()
    with (folder / "rows.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    text = steer_results.section([("Countries", folder)])
    assert "n = 10 samples" in text
    assert "| Skyline (`skyline`) | 4/10 | 0.40 | 0.17 to 0.69 | 0.40 | 1 |" in text and "control: no transfer (`latent_relay-no_transfer@2`) | not run" in text
    assert "| the latent relay at N = 0 equals Skyline answer for answer | 10/10 identical answers | met |" in text
    assert "| latent_relay@2 | skyline | 10 | 0.30 | 0.40 | -0.10 | 0 | 1 | 1 |" in text
    assert "| latent_relay@2 (contains) | skyline (contains) | 10 | 0.30 | 0.40 |" in text
    assert "| 2 | 0.200 | 0.100 | 2.00 | 1.00 |" in text  # 0.4 s for 2 steps; 0.3 s for 3 tokens
    assert "| `kv_steering-answer_briefly@4` | 3/10 | 1/3 | 0/3 | 0.10 (0.00) |" in text
    assert "So on this dataset" not in text  # the controls behind it were not run
    assert text.startswith(steer_results.START) and text.rstrip().endswith(steer_results.END)


def test_the_swap_arm_runs_each_sample_again_on_its_swapped_note(tmp_path, tiny_engine):
    """bench --swap on recall (made here, no file): every row has its swapped note's answer and
    outcome, the receiver (which never reads the note) answers the same on both, and the summary
    holds the content table, each variant paired against the receiver alone."""
    pair, calls = tiny_engine
    out = tmp_path / "swap"
    args = build_parser().parse_args(
        ["bench", "--pair", "tiny", "--dataset", "recall", "--dataset-option", "n=6", "--swap", "--limit", "3",
         "--handoffs", "receiver,skyline", "--out", str(out), "--quiet", "--max-new-tokens", "4"])
    assert bench.main(args) == 0
    rows = read_csv(out / "rows.csv")
    assert len(rows) == 3 * 2 and len(calls) == 3 * 2 * 2  # each sample and variant twice: the note and its swap
    assert all(row["swap_gold"] and row["swap_changed"] and row["swap_outcome"] in ("followed", "kept", "neither") for row in rows)
    receiver = [row for row in rows if row["variant"] == "receiver"]
    assert all(row["swap_answer"] == row["answer"] for row in receiver)  # the receiver never reads the note
    content = json.loads((out / "content.json").read_text())
    assert [entry["variant"] for entry in content] == ["receiver", "skyline"]
    skyline = content[1]
    assert skyline["follow"]["n"] == 3 and set(skyline["paired"]) == {"receiver"}
    assert "Content or prompt?" in (out / "summary.md").read_text()
    again = bench.main(args)  # resumed: nothing runs twice
    assert again == 0 and len(calls) == 12



def test_a_run_records_its_numeric_mode_and_refuses_to_resume_in_another(tmp_path, tiny_engine, monkeypatch):
    """config.json says the mode the rows were computed in (kvviz.runtime.numerics); resuming keeps it,
    and a process in another mode is refused before it writes a row."""
    pair, calls = tiny_engine
    dataset = write_jsonl(tmp_path / "open.jsonl", OPEN_RECORDS)
    out = tmp_path / "run"
    assert bench.main(bench_args(dataset, out, "--handoffs", "receiver", "--limit", "2")) == 0
    mode = pair.receiver.numerics
    assert json.loads((out / "config.json").read_text())["numerics"] == mode
    assert bench.main(bench_args(dataset, out, "--handoffs", "receiver", "--limit", "3")) == 0  # extended, same mode
    assert json.loads((out / "config.json").read_text())["numerics"] == mode and len(read_csv(out / "rows.csv")) == 3
    other = "bf16" if mode == "fp32" else "fp32"
    monkeypatch.setattr(pair.receiver, "numerics", other)
    done = len(calls)
    with pytest.raises(ValueError, match=f"computed in the {mode} numeric mode.*KVVIZ_NUMERICS={mode}"):
        bench.main(bench_args(dataset, out, "--handoffs", "receiver", "--limit", "4"))
    assert len(calls) == done and len(read_csv(out / "rows.csv")) == 3
