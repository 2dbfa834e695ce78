"""The latent relay and KV steering section of docs/RESULTS.md (issue 23), from bench runs.

    python research/steer_results.py --table Countries=runs/steer-countries --table HotpotQA=runs/steer-hotpotqa
    python research/steer_results.py ... --write docs/RESULTS.md   # replace the section in the file

The runs are ``bash research/steer_tables.sh``'s: ``python -m kvviz bench`` with KVComm in the run,
so the task's first sample calibrates KVComm and is left out and the same 100 samples are scored
as in the KVComm table (research/kvcomm_table.py). Per dataset: accuracy with 95% Wilson intervals
on the samples every variant answered (paired); the latent relay at N = 0 against Skyline answer
for answer; at N = 2, 4, 8 against Skyline and each of its three controls (McNemar's exact test);
what a latent step costs, beside a decode step of the receiver in the same rows; KV steering: how
often it changes the receiver's answer and how often the changed answer is right.

The section sits between ``<!-- steer-table:start -->`` and ``<!-- steer-table:end -->``; the
RESULTS.md writer (kvviz.studies.bench.report, KEPT) keeps it when the rest is regenerated.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvviz.data import format_p, paired_mcnemar, wilson_interval  # noqa: E402
from kvviz.studies.bench.report import section_command, section_marks  # noqa: E402

START, END = section_marks("steer-table")
STEPS = (2, 4, 8)
CONTROLS = ("no_transfer", "identity_map", "random_map")
STEERING = ("kv_steering-answer_briefly@4", "kv_steering-use_the_context@4", "kv_steering-answer_briefly@8",
            "kv_steering-use_the_context@8")
ORDER = ("receiver", "skyline", "kvcomm@1", "latent_relay@0", *(f"latent_relay@{n}" for n in STEPS),
         *(f"latent_relay-{c}@{n}" for c in CONTROLS for n in STEPS), *STEERING)
CONTROL_NAMES = {"no_transfer": "no transfer", "identity_map": "identity map", "random_map": "random map, same spectrum"}
COMMAND = "bash research/steer_tables.sh"


def name_of(variant: str) -> str:
    if variant == "receiver":
        return "receiver alone"
    if variant == "skyline":
        return "Skyline"
    if variant == "kvcomm@1":
        return "KVComm, every layer"
    if variant.startswith("latent_relay"):
        label, steps = variant.rsplit("@", 1)
        control = label.split("-", 1)[1] if "-" in label else None
        return f"latent relay, N = {steps}" + (f", control: {CONTROL_NAMES[control]}" if control else "")
    pairs, c_v = variant.split("-", 1)[1].rsplit("@", 1)
    return f"KV steering, {pairs.replace('_', ' ')} pairs, c_v = {c_v}"


def read_rows(folder: Path) -> dict[str, dict[str, dict]]:
    """variant -> sample id -> row, from the applicable rows of every rows*.csv in FOLDER."""
    table: dict[str, dict[str, dict]] = {}
    for path in sorted(folder.glob("rows*.csv")):
        with path.open(newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if str(row.get("applicable", "1")) in ("1", "True"):
                    table.setdefault(row["variant"], {})[row["sample_id"]] = row
    return table


def same_answers(table: dict, first: str, second: str) -> tuple[int, int]:
    both = [s for s in table.get(first, {}) if s in table.get(second, {})]
    return sum(table[first][s]["answer"] == table[second][s]["answer"] for s in both), len(both)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def dataset_section(name: str, folder: Path) -> str:
    table = read_rows(folder)
    present = [v for v in ORDER if v in table]
    samples = [s for s in table.get("receiver", {}) if all(s in table[v] for v in present)]
    n = len(samples)
    correct = {v: {s: int(float(table[v][s]["correct"] or 0)) for s in samples} for v in present}
    lines = [f"### {name}", "",
             f"n = {n} samples that every variant below answered (greedy, 24 new tokens; correct = token F1 > 0.5 with a "
             "gold answer; the task's first sample calibrates KVComm and is not scored, as in the KVComm table above). "
             "F1 rewards short answers; whether the answer contains a gold answer does not, so the two columns "
             "together tell a change of format from a change of content.",
             "", f"`{COMMAND}` (folder `{folder}`), then `python research/steer_results.py`", "",
             "| variant | correct | accuracy | 95% Wilson interval | answer contains a gold answer | median words |",
             "|---|---|---|---|---|---|"]
    for variant in ORDER:
        if variant not in correct:
            lines.append(f"| {name_of(variant)} (`{variant}`) | not run | | | | |")
            continue
        right = sum(correct[variant].values())
        low, high = wilson_interval(right, n)
        contains = sum(int(float(table[variant][s]["correct_contains"] or 0)) for s in samples)
        words = median([len(table[variant][s]["answer"].split()) for s in samples])
        lines.append(f"| {name_of(variant)} (`{variant}`) | {right}/{n} | {right / n:.2f} | {low:.2f} to {high:.2f} | "
                     f"{contains / n:.2f} | {words:g} |")

    lines += ["", "| A | B | n | acc A | acc B | A - B | only A right | only B right | McNemar exact p |",
              "|---|---|---|---|---|---|---|---|---|"]
    comparisons = [(f"latent_relay@{steps}", other) for steps in STEPS
                   for other in ("skyline", *(f"latent_relay-{c}@{steps}" for c in CONTROLS))]
    comparisons += [(variant, "receiver") for variant in STEERING]
    contains = {v: {s: int(float(table[v][s]["correct_contains"] or 0)) for s in samples} for v in present}
    # the same comparisons of the latent steps against Skyline when "right" means "contains a gold answer"
    by_content = [(f"latent_relay@{steps}", "skyline") for steps in STEPS]
    for first, second, scores, metric in ([(a, b, correct, "") for a, b in comparisons]
                                          + [(a, b, contains, " (contains)") for a, b in by_content]):
        if first in scores and second in scores:
            r = paired_mcnemar(scores, first, second)
            lines.append(f"| {first}{metric} | {second}{metric} | {r['n']} | {r['acc_first']:.2f} | {r['acc_second']:.2f} | "
                         f"{r['acc_first'] - r['acc_second']:+.2f} | {r['only_first']} | {r['only_second']} | {format_p(r['p'])} |")

    facts = []
    for first, second, what in (("latent_relay@0", "skyline", "the latent relay with no latent step"),
                                ("kvcomm@1", "skyline", "KVComm with every layer"),
                                *((f"latent_relay@{n_}", "skyline", f"the latent relay at N = {n_}") for n_ in STEPS),
                                *((f"latent_relay-no_transfer@{n_}", "receiver", f"no transfer at N = {n_}") for n_ in STEPS),
                                *((f"latent_relay-identity_map@{n_}", f"latent_relay@{n_}", f"the identity map at N = {n_}")
                                  for n_ in STEPS)):
        same, total = same_answers(table, first, second)
        if total:
            whose = {"skyline": "Skyline's", "receiver": "the receiver alone's"}.get(second, "the method's")
            facts.append(f"{what} gave {whose} answer, word for word, on {same} of {total} samples")
    if facts:
        lines += ["", "Answer for answer: " + "; ".join(facts) + "."]

    lines += ["", "What a latent step costs (medians over the samples; the sender's `sharer_decode` stage is its N "
              "latent steps; a receiver decode step = its decode stage / tokens written, same rows; wall-clock on a "
              "shared CPU, so compare the ratios):", "",
              "| N | s per latent step | s per receiver decode step | ratio | time to first token / Skyline's |",
              "|---|---|---|---|---|"]
    skyline_ttft = {s: float(table["skyline"][s]["ttft"]) for s in samples} if "skyline" in table else {}
    for steps in STEPS:
        variant = f"latent_relay@{steps}"
        if variant not in table:
            continue
        rows = [table[variant][s] for s in samples]
        per_step = median([float(r["time_sharer_decode"]) / steps for r in rows])
        per_token = median([float(r["time_receiver_decode"]) / int(r["generated_tokens"]) for r in rows
                            if int(r["generated_tokens"] or 0) > 0])
        ttft = median([float(table[variant][s]["ttft"]) / skyline_ttft[s] for s in samples if skyline_ttft.get(s)])
        ratio = f"{per_step / per_token:.2f}" if per_step and per_token else ""
        lines.append(f"| {steps} | {per_step:.3f} | {per_token:.3f} | {ratio} | {ttft:.2f} |")

    lines += targets(table, correct, samples)
    lines += reading(table, correct)
    lines += ["", "KV steering, against the receiver alone on the same samples (no sharer runs):", "",
              "| variant | answer changed | changed and right | changed, was right before | accuracy (receiver alone) |",
              "|---|---|---|---|---|"]
    for variant in STEERING:
        if variant not in table or "receiver" not in table:
            continue
        changed = [s for s in samples if table[variant][s]["answer"] != table["receiver"][s]["answer"]]
        right = sum(correct[variant][s] for s in changed)
        was_right = sum(correct["receiver"][s] for s in changed)
        lines.append(f"| `{variant}` | {len(changed)}/{n} | {right}/{len(changed)} | {was_right}/{len(changed)} | "
                     f"{sum(correct[variant].values()) / n:.2f} ({sum(correct['receiver'].values()) / n:.2f}) |")
    return "\n".join(lines) + "\n"


def targets(table: dict, correct: dict, samples: list[str]) -> list[str]:
    """Issue 23's targets on this dataset, each met or missed (or not measured), with why."""
    lines = ["", "Targets (issue 23):", "", "| target | measured | verdict |", "|---|---|---|"]
    same, total = same_answers(table, "latent_relay@0", "skyline")
    if total:
        lines.append(f"| the latent relay at N = 0 equals Skyline answer for answer | {same}/{total} identical answers | "
                     f"{'met' if same == total else 'missed'} |")
    else:
        lines.append("| the latent relay at N = 0 equals Skyline answer for answer | not measured | not measured |")
    compared = [(f"latent_relay@{n}", other) for n in STEPS for other in ("skyline", *(f"latent_relay-{c}@{n}" for c in CONTROLS))]
    done = [pair for pair in compared if pair[0] in correct and pair[1] in correct]
    if done:
        significant = [f"{a} vs {b} (p = {format_p(paired_mcnemar(correct, a, b)['p'])})" for a, b in done
                       if paired_mcnemar(correct, a, b)["p"] < 0.05]
        lines.append(f"| N = 2, 4, 8 against Skyline and each of its three controls, McNemar p-values | {len(done)} of "
                     f"{len(compared)} comparisons (table above); significant at 0.05: "
                     f"{', '.join(significant) if significant else 'none'} | {'done' if len(done) == len(compared) else 'partly done'} |")
    lines.append(f"| the latency each latent step costs | the latency table above | "
                 f"{'done' if any(f'latent_relay@{n}' in table for n in STEPS) else 'not measured'} |")
    steering = [v for v in STEERING if v in correct]
    lines.append(f"| KV steering: how often it changes the receiver's answer, how often the changed answer is right | "
                 f"{len(steering)} variants (table below) | {'done' if steering else 'not measured'} |")
    return lines


def reading(table: dict, correct: dict) -> list[str]:
    """What the controls say about the latent steps, in words, only where every comparison behind
    a sentence was measured."""
    said = []
    steps_vs = {other: [(f"latent_relay@{n}", other.format(n=n)) for n in STEPS]
                for other in ("skyline", "latent_relay-no_transfer@{n}", "latent_relay-random_map@{n}")}
    measured = {other: all(a in correct and b in correct for a, b in pairs) for other, pairs in steps_vs.items()}
    if measured["skyline"] and all(paired_mcnemar(correct, a, b)["p"] >= 0.05 for a, b in steps_vs["skyline"]):
        said.append("no number of latent steps scores significantly differently from Skyline, which is the relay "
                    "with no latent step")
    if measured["latent_relay-random_map@{n}"] and all(
            paired_mcnemar(correct, a, b)["p"] >= 0.05 for a, b in steps_vs["latent_relay-random_map@{n}"]):
        said.append("a random map with the same spectrum scores as the computed one at every N")
    no_transfer_is_alone = all(same == total > 0 for same, total in
                               (same_answers(table, f"latent_relay-no_transfer@{n}", "receiver") for n in STEPS))
    if measured["latent_relay-no_transfer@{n}"] and no_transfer_is_alone and "latent_relay@0" in correct:
        gain0 = paired_mcnemar(correct, "latent_relay@0", "receiver")
        said.append(f"the relay's whole gain over no transfer (the receiver alone, answer for answer) is there with no "
                    f"latent step (N = 0: {gain0['acc_first']:.2f} against {gain0['acc_second']:.2f}, McNemar p = "
                    f"{format_p(gain0['p'])})")
    if not said:
        return []
    sentence = "So on this dataset " + "; ".join(said)
    if len(said) == 3:
        sentence += (": the accuracy comes from the sender's KV of the context, and the latent steps add none that "
                     "these samples can detect (they change answers, not how many are right)")
    return ["", sentence + "."]


def section(tables: list[tuple[str, Path]]) -> str:
    parts = [START, "## Latent relay and KV steering (issue 23)", "",
             "The embedded pair. The latent relay (LatentMAS-style): a second Gemma-3-270M reads the context, thinks N "
             "latent steps (its final hidden state through LatentMAS's alignment map, fed back as its next input), "
             "and its KV of context + latent steps is the receiver's prefix in every layer. Gemma-3-270M ties its "
             "input and output embeddings, so the computed map is a scaled identity (5.6e-6 from one, "
             "`details.alignment.distance_from_identity`): the identity control is the method up to rounding here. "
             "KV steering: the receiver reads the question alone and its cache is edited once with vectors from "
             "contrastive pairs; no sharer runs. Every variant answers the same samples, compared pair by pair "
             "(McNemar's exact test). The section is kept when the rest of this file is regenerated.", ""]
    for name, folder in tables:
        parts.append(dataset_section(name, folder))
    parts.append(END)
    return "\n".join(parts) + "\n"


def main() -> int:
    return section_command(__doc__, section, "steer-table", "latent relay and KV steering",
                           table_help="a dataset's bench folder from research/steer_tables.sh")


if __name__ == "__main__":
    raise SystemExit(main())
