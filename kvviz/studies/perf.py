"""``python -m kvviz bench --perf [--json]``: the performance table, measured side by side.

Everything is measured in one process on the same inputs, interleaved per repeat (so slow
moments of a shared machine hit every handoff alike), and reported as the median over repeats
with the spread (min and max) of the per-repeat values.

1. **C2C against text and the receiver alone** on shared questions (no private context; the text
   handoff's sharer writes background of at most ``--message-tokens`` tokens, 64 by default).
   Latency = the handoff's total wall time. Rows say "c2c not available" when the pair has no
   fuser (``--fuser`` names one).
2. **KVComm against Skyline, time to first token**, on synthetic contexts of exactly 128 ... 2048
   receiver tokens (the context segment the sender prefills and Skyline reads; filler sentences
   written for this project with one fact sentence in the middle) and a short question. Two ways,
   labelled: *receiver side* = KV transfer + the receiver's prefill of the question + choosing the
   first token (the sender's prefill of the context is its own work, done once and reusable);
   *end to end* = the sender's prefill + receiver side. Skyline's TTFT is its prefill of context +
   question + choosing the first token. KVComm's one-off calibration is done before timing.
3. **The same for FLOPs** (``kvviz.runtime.measure`` estimates: each result's ``flops_to_first_token``).
4. **Bytes** KVComm sends at r = 0.3, 0.5, 1.0 (a run at each ratio) against the text handoff's
   message, per length (KV bytes depend on the dtype: float32 on CPU, bfloat16 on GPU).
6. **Speed** (``kvviz.studies.speed``): ms per decode step and per prefilled token for each model, tokens
   per second, the warm full run of the page's handoffs, and the machine's own limits measured in
   the same run (streaming the weights once, the full output-head product), each as a ratio.

5. **Peak memory** of each handoff at one context length: on GPU ``torch.cuda.max_memory_allocated``
   above what was allocated before; on CPU the growth of the process's resident set (sampled every
   millisecond from /proc) above its level before the handoff. The CPU number is a lower bound:
   memory the allocator kept from earlier runs is reused without showing as growth.

``targets`` turns the report and the bench summaries into the verdicts on the benchmark's goals
for docs/RESULTS.md. This module is the study of the C2C and KVComm papers' own claims (C2C against
the text handoff, KVComm against Skyline), so unlike the page, the plots and the benchmark, it
names the handoffs it measures and sets their options (``request_for``). Every number it reports
is read from the runs' results (times, FLOPs, bytes); none is derived from a handoff's internals.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from kvviz.core.results import HandoffRequest
from kvviz.engine import runner
from kvviz.engine.flags import option_arguments
from kvviz.handoffs import registry
from kvviz.handoffs.registry import build_request
from kvviz.runtime.measure import spread
from kvviz.studies import speed
from kvviz.studies.machine import PeakMemory, machine_facts
from kvviz.studies.perf_inputs import QUESTION, synthetic_context

# Shared questions for the C2C / text / receiver comparison (no private context).
SHARED_QUESTIONS = [
    "Why does ice float on water?",
    "What causes the seasons on Earth?",
]

TIMING_RATIOS = (0.3,)  # KVComm ratios timed against Skyline (receiver-side cost barely depends on r)
BYTES_RATIOS = (0.3, 0.5, 1.0)
ANSWER_TOKENS = 16


# --- measuring --------------------------------------------------------------------------------


# --- the measurement --------------------------------------------------------------------------


def request_for(query: str, context: str | None, max_new_tokens: int, message_tokens: int = 64,
                fuser: str | None = None, ratio: float = 0.5) -> HandoffRequest:
    """A greedy request with the study's handoff options: the text message bound, the C2C fuser
    (None: the pair's shipped one) and KVComm's ratio."""
    options = {"text": {"message_tokens": message_tokens}, "c2c": {"fuser": fuser or ""}, "kvcomm": {"ratio": ratio}}
    return build_request(query, context, max_new_tokens, options=options)


def shared_questions(pair, repeats: int, message_tokens: int, fuser: str | None, progress) -> dict:
    """1. C2C against text and the receiver alone on shared questions: total latency per question,
    the order of the handoffs rotated per repeat."""
    names = ["receiver", "text", "c2c"]
    requests = [request_for(q, None, ANSWER_TOKENS, message_tokens, fuser) for q in SHARED_QUESTIONS]
    unavailable = ""
    for name in names:  # warm-up, and find out whether c2c runs on this pair
        result = runner.run_handoff(name, pair, requests[0])
        if name == "c2c" and not result.applicable:
            unavailable = f"c2c not available: {result.reason}"
    if unavailable:
        names.remove("c2c")
    per_repeat: dict[str, list[float]] = {name: [] for name in names}
    message_lengths, answer_lengths = [], {name: [] for name in names}
    for repeat in range(repeats):
        progress(f"shared questions, repeat {repeat + 1}/{repeats}")
        totals = {name: 0.0 for name in names}
        for request in requests:
            for name in names[repeat % len(names):] + names[: repeat % len(names)]:  # rotate the order
                result = runner.run_handoff(name, pair, request)
                totals[name] += result.total_seconds
                answer_lengths[name].append(result.tokens.get("generated", 0))
                if name == "text":
                    message_lengths.append(result.tokens.get("message", 0))
        for name in names:
            per_repeat[name].append(totals[name] / len(requests))
    ratios = {"text / receiver": spread([t / r for t, r in zip(per_repeat["text"], per_repeat["receiver"])])}
    if not unavailable:
        ratios["c2c / text"] = spread([c / t for c, t in zip(per_repeat["c2c"], per_repeat["text"])])
        ratios["c2c / receiver"] = spread([c / r for c, r in zip(per_repeat["c2c"], per_repeat["receiver"])])
    return {
        "questions": SHARED_QUESTIONS,
        "message_tokens_bound": message_tokens,
        "answer_tokens_bound": ANSWER_TOKENS,
        "message_tokens_mean": statistics.fmean(message_lengths) if message_lengths else None,
        "answer_tokens_mean": {name: statistics.fmean(v) for name, v in answer_lengths.items() if v},
        "latency_s": {name: spread(values) for name, values in per_repeat.items()},
        "c2c_unavailable": unavailable,
        "ratios": ratios,
    }


def first_token_run(pair, name: str, context: str, ratio: float = 0.5):
    """One greedy one-token run on the synthetic question (KVComm at ``ratio``)."""
    result = runner.run_handoff(name, pair, request_for(QUESTION, context, 1, ratio=ratio))
    if not result.applicable:
        raise RuntimeError(f"{name} does not run on pair {pair.name}: {result.reason}")
    return result


def first_token_times(pair, contexts: dict, repeats: int, ratios, progress) -> tuple[dict, dict]:
    """2-3. Time to first token of Skyline and of KVComm at each ratio, per context length,
    interleaved per repeat (the order reversed every other repeat); (times, the first repeat's
    results, whose FLOPs the curve reads)."""
    labels = ["skyline"] + [f"kvcomm@{r:g}" for r in ratios]
    times: dict = {length: {label: {"receiver": [], "e2e": []} for label in labels} for length in contexts}
    first: dict = {length: {} for length in contexts}
    for repeat in range(repeats):
        for length, (context, _) in contexts.items():
            progress(f"context {length} tokens, repeat {repeat + 1}/{repeats}")
            for label in (labels[::-1] if repeat % 2 else labels):
                name, _, ratio = label.partition("@")
                result = first_token_run(pair, name, context, float(ratio) if ratio else 0.5)
                times[length][label]["receiver"].append(result.receiver_first_token_seconds)
                times[length][label]["e2e"].append(result.first_token_seconds)
                first[length].setdefault(label, result)
    return times, first


def curve_row(length: int, measured: int, times: dict, first: dict, ratios, sent: dict, text) -> dict:
    """One context length's row: TTFT and FLOPs ratios against Skyline, bytes KVComm and text sent
    (every number read from the runs' results)."""
    sky, sky_result = times["skyline"]["e2e"], first["skyline"]
    sky_flops = sum(sky_result.flops_to_first_token.values())
    row = {"context_tokens": measured, "target_tokens": length, "skyline_ttft_s": spread(sky),
           "skyline_flops": sky_flops, "query_tokens": sky_result.tokens["receiver_prompt"] - measured, "kvcomm": {}}
    for r in ratios:
        label = f"kvcomm@{r:g}"
        entry, result = times[label], first[label]
        receiver_flops = result.flops_to_first_token["receiver"]
        row["kvcomm"][label] = {
            "receiver_ttft_s": spread(entry["receiver"]),
            "e2e_ttft_s": spread(entry["e2e"]),
            "ttft_ratio_receiver": spread([k / s for k, s in zip(entry["receiver"], sky)]),
            "ttft_ratio_e2e": spread([k / s for k, s in zip(entry["e2e"], sky)]),
            "flops_ratio_receiver": receiver_flops / sky_flops,
            "flops_ratio_e2e": sum(result.flops_to_first_token.values()) / sky_flops,
        }
    row["kvcomm_bytes"] = sent
    row["text_bytes"] = text.bytes_communicated
    row["text_message_tokens"] = text.tokens.get("message", 0)
    return row


def context_curve(pair, lengths: list[int], repeats: int, ratios, message_tokens: int, progress) -> tuple[list, dict, dict]:
    """2-4. KVComm against Skyline over context lengths: (rows, the contexts, KVComm's calibration)."""
    contexts = {length: synthetic_context(pair.receiver.tokenizer, length) for length in lengths}
    # warm-up: kernels, and KVComm's one-off calibration (cached per pair)
    first_token_run(pair, "skyline", contexts[lengths[0]][0])
    calibration = first_token_run(pair, "kvcomm", contexts[lengths[0]][0]).details.get("calibration", {})
    times, first = first_token_times(pair, contexts, repeats, ratios, progress)
    rows = []
    for length, (context, measured) in contexts.items():
        progress(f"bytes sent at context {length}")
        # bytes: what each ratio's run sent, and the text message (deterministic: once per length)
        sent = {f"kvcomm@{r:g}": first_token_run(pair, "kvcomm", context, r).bytes_communicated for r in BYTES_RATIOS}
        text = runner.run_handoff("text", pair, request_for(QUESTION, context, 1, message_tokens))
        rows.append(curve_row(length, measured, times[length], first[length], ratios, sent, text))
    return rows, contexts, calibration


def peak_memory(pair, context: str, repeats: int, message_tokens: int, fuser: str | None, with_c2c: bool, progress) -> dict:
    """5. Peak memory of each handoff at one context length (``PeakMemory``)."""
    names = ["receiver", "skyline", "text"] + [f"kvcomm@{r:g}" for r in BYTES_RATIOS] + (["c2c"] if with_c2c else [])
    peaks: dict[str, list[float]] = {name: [] for name in names}
    device = pair.receiver.device
    for repeat in range(max(1, min(repeats, 2))):
        progress(f"peak memory, repeat {repeat + 1}")
        for label in names:
            name, _, ratio = label.partition("@")
            request = request_for(QUESTION, context, 8, message_tokens, fuser, float(ratio) if ratio else 0.5)
            with PeakMemory(device) as meter:
                runner.run_handoff(name, pair, request)
            peaks[label].append(meter.peak_bytes)
    return {"method": PeakMemory(device).method, "peak_bytes": {name: spread(values) for name, values in peaks.items()}}


def measure(pair, lengths: list[int], repeats: int, ratios=TIMING_RATIOS, message_tokens: int = 64,
            fuser: str | None = None, memory_length: int | None = None, progress=None) -> dict:
    """The whole study (the module docstring's six parts), as one report."""
    progress = progress or (lambda message: None)
    report: dict = {"machine": machine_facts(pair.receiver.device), "repeats": repeats, "pair": pair.name}
    report["shared_question"] = shared_questions(pair, repeats, message_tokens, fuser, progress)
    curve, contexts, calibration = context_curve(pair, lengths, repeats, ratios, message_tokens, progress)
    report["context_curve"] = curve
    report["calibration"] = {"seconds": calibration.get("seconds"), "note": "one-off per pair, excluded from TTFT"}
    memory_length = memory_length or (1024 if 1024 in lengths else lengths[-1])
    with_c2c = not report["shared_question"]["c2c_unavailable"]
    memory = peak_memory(pair, contexts[memory_length][0], repeats, message_tokens, fuser, with_c2c, progress)
    report["memory"] = {"context_tokens": contexts[memory_length][1], **memory}
    report["speed"] = speed.measure(pair, repeats, progress, at_once=False)
    report["decode_ms_per_token"] = report["speed"]["decode_ms_per_token"]
    report["warm_full_run_seconds"] = report["speed"]["warm_full_run_seconds"]
    return report


# --- output -----------------------------------------------------------------------------------


def _fmt_spread(entry: dict, digits: int = 3, unit: str = "") -> str:
    if not entry or entry.get("median") is None:
        return "n/a"
    return f"{entry['median']:.{digits}f}{unit} [{entry['min']:.{digits}f}, {entry['max']:.{digits}f}]"


def _mib(value) -> str:
    return "n/a" if value is None else f"{value / 2**20:.1f}"


def markdown(report: dict) -> str:
    lines = []
    machine = report["machine"]
    lines.append(
        f"Measured {machine['date']} on `{machine['uname']}` ({machine['cpu_cores']} cores, device {machine['device']}"
        + (f", {machine['gpu']}" if machine.get("gpu") else "")
        + f"), torch {machine['torch']}, commit {machine['git_commit']}; pair `{report['pair']}`; "
        f"median [min, max] over {report['repeats']} repeats."
    )
    shared = report["shared_question"]
    lines += ["", "**C2C, text and the receiver alone on shared questions** "
              f"(text message bound {shared['message_tokens_bound']} tokens, mean written "
              f"{shared['message_tokens_mean'] or 0:.0f}; answers up to {shared['answer_tokens_bound']} tokens; latency = total wall time per question)", "",
              "| ratio | value | target |", "|---|---|---|"]
    ratios = shared["ratios"]
    if shared["c2c_unavailable"]:
        lines.append(f"| C2C / text latency | {shared['c2c_unavailable']} | <= 0.4 |")
        lines.append(f"| C2C / receiver latency | {shared['c2c_unavailable']} | |")
    else:
        c2c_text = ratios["c2c / text"]
        met = "met" if c2c_text["median"] <= 0.4 else "missed"
        lines.append(f"| C2C / text latency | {_fmt_spread(c2c_text, 2)} | <= 0.4 ({met}) |")
        lines.append(f"| C2C / receiver latency | {_fmt_spread(ratios['c2c / receiver'], 2)} | |")
    lines.append(f"| text / receiver latency | {_fmt_spread(ratios['text / receiver'], 2)} | |")
    latency = ", ".join(f"{name} {_fmt_spread(value, 3)} s" for name, value in shared["latency_s"].items())
    lines += ["", f"Latencies: {latency}.", ""]

    curve = report["context_curve"]
    labels = list(curve[0]["kvcomm"])
    lines += ["**KVComm time to first token / Skyline's, by context length** (receiver side: KV transfer + the "
              "receiver's prefill of the question + first token; end to end: plus the sender's prefill of the "
              "context; target receiver side <= 0.3 at 1024 tokens)", ""]
    header = ["context tokens", "Skyline TTFT s"] + [f"{label} {way}" for label in labels for way in ("receiver-side", "end-to-end")]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in curve:
        cells = [str(row["context_tokens"]), _fmt_spread(row["skyline_ttft_s"], 3)]
        for label in labels:
            entry = row["kvcomm"][label]
            cells += [_fmt_spread(entry["ttft_ratio_receiver"], 3), _fmt_spread(entry["ttft_ratio_e2e"], 2)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "**FLOPs to the first token, KVComm / Skyline** (estimates from `kvviz.runtime.measure`)", ""]
    header = ["context tokens", "Skyline GFLOPs"] + [f"{label} {way}" for label in labels for way in ("receiver-side", "end-to-end")]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in curve:
        cells = [str(row["context_tokens"]), f"{row['skyline_flops'] / 1e9:.2f}"]
        for label in labels:
            entry = row["kvcomm"][label]
            cells += [f"{entry['flops_ratio_receiver']:.3f}", f"{entry['flops_ratio_e2e']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "**Bytes communicated** (KVComm: KV of the context in the sent layers plus the 1-token sink "
              "elsewhere; text: the UTF-8 message)", ""]
    byte_labels = list(curve[0]["kvcomm_bytes"])
    header = ["context tokens"] + [f"{label} bytes" for label in byte_labels] + ["text bytes (message tokens)"] + [f"{label} / text" for label in byte_labels]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in curve:
        text_bytes = row["text_bytes"]
        cells = [str(row["context_tokens"])] + [f"{row['kvcomm_bytes'][label]:,}" for label in byte_labels]
        cells.append(f"{text_bytes:,} ({row['text_message_tokens']})")
        cells += [f"{row['kvcomm_bytes'][label] / text_bytes:,.0f}x" if text_bytes else "n/a" for label in byte_labels]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "KVComm bytes: what a run at each ratio sent (the context's KV in the M = ceil(r L) sent layers, the "
              "1-token sink in the others)."]
    memory = report["memory"]
    lines += ["", f"**Peak memory per handoff** at {memory['context_tokens']} context tokens, MiB "
              f"({memory['method']})", "", "| handoff | peak MiB |", "|---|---|"]
    for name, entry in memory["peak_bytes"].items():
        lines.append(f"| {name} | {_mib(entry['median'])} [{_mib(entry['min'])}, {_mib(entry['max'])}] |")
    if report.get("calibration", {}).get("seconds") is not None:
        lines += ["", f"KVComm's one-off calibration took {report['calibration']['seconds']:.3f} s (excluded)."]
    if report.get("speed"):
        lines += ["", speed.markdown(report["speed"])]
    return "\n".join(lines) + "\n"


def main(args) -> int:
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    if not lengths or min(lengths) < 16:
        raise ValueError("--lengths needs context lengths of at least 16 tokens")
    if args.repeats < 1:
        raise ValueError("--repeats must be at least 1")
    pair = runner.load_pair(args.pair, args.device, args.dtype, progress=lambda message: print(message, file=sys.stderr))
    quiet = getattr(args, "quiet", False)
    progress = None if quiet else (lambda message: print(message, file=sys.stderr))
    if getattr(args, "speed_only", False):
        report = {"machine": machine_facts(pair.receiver.device), "repeats": args.repeats, "pair": pair.name,
                  "speed": speed.measure(pair, args.repeats, progress, page=not getattr(args, "no_page", False))}
        for key in ("numeric_mode", "batched_decode_ms", "stack_stream_ratio", "step_stream_ratio", "warm_full_run_seconds",
                    "warm_recorded_run_seconds", "warm_serial_run_seconds", "warm_page_run_seconds", "page_over_process_ratio",
                    "page_over_plain_ratio", "runs_at_once", "class_load", "targets"):
            report[key] = report["speed"].get(key)
        text = speed.markdown(report["speed"]) + "\n"
    else:
        given = option_arguments(args)
        message_tokens = registry.get("text").option("message_tokens").parse(given.get("text", {}).get("message_tokens"))
        report = measure(pair, lengths, args.repeats, message_tokens=message_tokens,
                         fuser=given.get("c2c", {}).get("fuser"), progress=progress)
        text = markdown(report)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "perf.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
        (out / "perf.md").write_text(text, encoding="utf-8")
    print(json.dumps(report, indent=2) if args.json else text)
    return 0


def targets(perf: dict | None, summaries: dict[str, list[dict]]) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for the benchmark's goals that the perf report and the
    bench summaries (dataset -> summary entries) measured; a goal not measured is left out."""
    rows = []
    if perf:
        shared = perf["shared_question"]
        if shared["c2c_unavailable"]:
            rows.append(("C2C latency <= 0.4x text", shared["c2c_unavailable"], "not measurable"))
        else:
            value = shared["ratios"]["c2c / text"]["median"]
            rows.append(("C2C latency <= 0.4x text", f"{value:.2f}x", "met" if value <= 0.4 else "missed"))
        row = next((r for r in perf["context_curve"] if r["target_tokens"] == 1024), None)
        if row:
            label = next(iter(row["kvcomm"]))
            value = row["kvcomm"][label]["ttft_ratio_receiver"]["median"]
            e2e = row["kvcomm"][label]["ttft_ratio_e2e"]["median"]
            rows.append(("KVComm receiver-side TTFT <= 0.3x Skyline at 1024 tokens",
                         f"{label}: {value:.3f}x (end to end {e2e:.2f}x)", "met" if value <= 0.3 else "missed"))
    by = {entry["variant"]: entry for entry in summaries.get("countries", [])}
    sky, kv3 = by.get("skyline"), by.get("kvcomm@0.3")
    if sky and kv3 and sky.get("acc_f1") and kv3.get("acc_f1") is not None:
        share = kv3["acc_f1"] / sky["acc_f1"]
        rows.append(("KVComm r=0.3 accuracy >= 80% of Skyline's on Countries",
                     f"{kv3['acc_f1']:.2f} vs {sky['acc_f1']:.2f} ({share:.0%})", "met" if share >= 0.8 else "missed"))
    return rows
