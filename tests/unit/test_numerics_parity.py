"""scripts/numerics_parity.py (issue 42, gate 2): its table pairs the two modes per sample, and its
verdict is "met" only at the n the gate needs; a short run says "not established", a real drop
"missed"."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def parity():
    spec = importlib.util.spec_from_file_location("numerics_parity", REPO_ROOT / "scripts" / "numerics_parity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_rows(folder: Path, correct: list[int], followed: list[int]) -> None:
    folder.mkdir(parents=True)
    with (folder / "rows.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, ["handoff", "sample_id", "applicable", "answer", "correct", "followed"])
        writer.writeheader()
        for index, (right, follows) in enumerate(zip(correct, followed)):
            writer.writerow({"handoff": "text", "sample_id": f"s{index}", "applicable": 1,
                             "answer": "yes" if right else "no", "correct": right, "followed": follows})
        writer.writerow({"handoff": "text", "sample_id": "skipped", "applicable": 0, "answer": "", "correct": "",
                         "followed": ""})


def verdict_of(parity, tmp_path: Path, fp32: tuple[list, list], mode: tuple[list, list], needed: int):
    write_rows(tmp_path / "fp32-recall", *fp32)
    write_rows(tmp_path / "bf16-recall", *mode)
    return parity.table(tmp_path, "bf16", {"recall": needed}, "cmd", needed={"recall": needed})


def test_the_same_answers_at_the_needed_n_meet_the_gate(parity, tmp_path):
    rates = ([1] * 10 + [0] * 30, [1] * 20 + [0] * 20)
    section, verdict = verdict_of(parity, tmp_path, rates, rates, needed=40)
    assert verdict == "met"
    assert "| text | accuracy | 40 | 0.25 " in section  # the inapplicable row is not counted
    assert "text 40/40" in section


def test_too_few_paired_samples_are_not_established_even_when_every_interval_holds_0(parity, tmp_path):
    rates = ([1] * 3 + [0] * 10, [1] * 5 + [0] * 8)
    section, verdict = verdict_of(parity, tmp_path, rates, rates, needed=100)
    assert verdict.startswith("not established") and "recall n = 13 of 100" in verdict
    assert "**met**" not in section


def test_a_real_drop_in_the_mode_misses_the_gate(parity, tmp_path):
    fp32 = ([1] * 40 + [0] * 10, [0] * 50)
    mode = ([1] * 10 + [0] * 40, [0] * 50)  # 30 samples only fp32 gets right, none the other way
    section, verdict = verdict_of(parity, tmp_path, fp32, mode, needed=50)
    assert verdict == "missed"
    assert "**outside**" in section and "30 / 0" in section


def test_the_paired_interval_holds_the_difference_and_narrows_with_agreement(parity):
    delta, low, high = parity.paired_difference_interval(both=20, only_first=5, only_second=1, neither=74)
    assert delta == pytest.approx(-0.04) and low < delta < high
    agreeing = parity.paired_difference_interval(both=24, only_first=1, only_second=1, neither=74)
    assert agreeing[2] - agreeing[1] < high - low
