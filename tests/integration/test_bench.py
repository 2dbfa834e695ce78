"""The benchmark in other processes on the embedded pair: a Countries run split over two processes and
merged, and the KVComm section of docs/RESULTS.md from real rows (tests/unit/test_bench.py runs the
bench loop on tiny models).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT
from tests.unit.test_bench import read_csv


def _cli_env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    return env


@pytest.mark.integration
@pytest.mark.real_model
def test_embedded_countries_bench_and_two_process_split(tmp_path, shared_data):
    """Two CPU processes (RANK / WORLD_SIZE as accelerate launch sets them) split a tiny real run."""
    out = tmp_path / "split"
    command = [sys.executable, "-m", "kvviz", "bench", "--pair", "embedded", "--dataset", "countries", "--handoffs",
               "receiver,kvcomm", "--ratios", "0.5", "--limit", "2", "--max-new-tokens", "8", "--quiet", "--out", str(out)]
    processes = []
    for rank in range(2):
        env = dict(_cli_env(), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
        processes.append(subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for process in processes:
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, output
    summary = read_csv(out / "summary.csv")
    assert [(s["variant"], s["samples"]) for s in summary] == [("receiver", "2"), ("kvcomm@0.5", "2")]
    rows = read_csv(out / "rows.part-0-of-2.csv") + read_csv(out / "rows.part-1-of-2.csv")
    # KVComm in the run: the task's first sample (index 0) calibrates it and is left out of the score
    assert sorted(r["sample_index"] for r in rows) == ["1", "1", "2", "2"]
    assert all(r["applicable"] == "1" and float(r["time_total"]) > 0 for r in rows)
    config = json.loads((out / "config.json").read_text())
    assert config["calibration_sample"] and config["calibration_sample"] not in {r["sample_id"] for r in rows}


@pytest.mark.integration
def test_kvcomm_results_section_pairs_samples_and_says_met_or_missed(tmp_path):
    """research/kvcomm_results.py on hand-made rows: only samples every variant answered count, the
    verdicts follow the numbers, and the section replaces its old self in the file."""
    folder = tmp_path / "table"
    folder.mkdir()
    (folder / "calibration.txt").write_text("calibration sample: c0\ncontext: C\nquestion: Where is Q?\n")
    right = {  # variant -> correct on samples s0..s9
        "receiver": [0] * 10, "skyline": [1] * 5 + [0] * 5, "text": [1] * 3 + [0] * 7,
        "kvcomm@0.3": [1] * 4 + [0] * 6, "kvcomm@0.5": [1] * 4 + [0] * 6, "kvcomm@0.7": [1] * 5 + [0] * 5,
        "kvcomm-random@0.3": [1] * 1 + [0] * 9, "kvcomm-contiguous@0.3": [1] * 4 + [0] * 6,
    }
    rows = [{"sample_id": f"s{i}", "variant": v, "applicable": "1", "correct": str(c[i]), "answer": str(c[i]),
             "importance_spearman": "0.9"} for v, c in right.items() for i in range(10)]
    rows.append({"sample_id": "s10", "variant": "skyline", "applicable": "1", "correct": "1", "answer": "x",
                 "importance_spearman": ""})  # answered by one variant only: not paired, left out
    with (folder / "rows.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    results = tmp_path / "RESULTS.md"
    results.write_text("# top\n\n<!-- kvcomm-table:start -->\nold\n<!-- kvcomm-table:end -->\n\ntail\n")
    command = [sys.executable, str(REPO_ROOT / "research" / "kvcomm_results.py"), "--table", f"Countries={folder}",
               "--write", str(results)]
    subprocess.run(command, check=True, capture_output=True, cwd=REPO_ROOT)
    text = results.read_text()
    assert "\nold\n" not in text and text.startswith("# top") and text.rstrip().endswith("tail")
    assert "`c0`" in text and "n = 10 scored samples" in text
    assert "| Skyline (`skyline`) | 5/10 | 0.50 |" in text
    assert "| KVComm r = 0.3 >= 80% of Skyline | 4/5 = 80% | met |" in text
    assert "| KVComm r = 0.5 >= 95% of Skyline | 4/5 = 80% | missed |" in text
    assert "beats random layers, r = 0.3 by >= 10 points | +30 points | met |" in text
    assert "beats contiguous layers, r = 0.3 by >= 10 points | +0 points | missed |" in text
