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
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from kvviz.core import paths
from kvviz.core.prompts import build_segments, encode
from kvviz.core.results import HandoffRequest
from kvviz.engine import runner
from kvviz.engine.flags import option_arguments
from kvviz.handoffs import registry
from kvviz.handoffs.registry import build_request
from kvviz.runtime.measure import spread, synchronize
from kvviz.studies import speed

# Written for this project: neutral filler that says nothing about the fact.
FILLER_SENTENCES = [
    "The morning train left the station a few minutes after the bakery opened its doors.",
    "Several visitors stopped to read the notice about the new opening hours of the museum.",
    "A light rain fell over the hills while the farmers checked the fences along the road.",
    "The committee agreed to meet again next month to review the budget for the school year.",
    "Children played near the fountain as the street musicians tuned their old guitars.",
    "The library added a shelf of travel guides and a quiet corner for reading newspapers.",
    "Engineers inspected the bridge and reported that the repairs would take two more weeks.",
    "In the evening the harbour lights came on one by one along the curved stone pier.",
]
FACT = "The key to the blue storage room is kept in the drawer of the kitchen table."
QUESTION = "Where is the key to the blue storage room kept?"

# Shared questions for the C2C / text / receiver comparison (no private context).
SHARED_QUESTIONS = [
    "Why does ice float on water?",
    "What causes the seasons on Earth?",
]

TIMING_RATIOS = (0.3,)  # KVComm ratios timed against Skyline (receiver-side cost barely depends on r)
BYTES_RATIOS = (0.3, 0.5, 1.0)
ANSWER_TOKENS = 16


# --- inputs -----------------------------------------------------------------------------------


def synthetic_context(tokenizer, length: int, question: str = QUESTION) -> tuple[str, int]:
    """A context whose prompt segment (what the sender prefills, Skyline's prefix) has ``length`` tokens.

    Filler sentences around one fact sentence in the middle. The left filler is half the token
    budget; the right filler is cut character by character (binary search) until the receiver's
    context segment measures exactly ``length`` tokens. Returns (text, measured length): the
    measured length differs only when no cut reaches ``length`` exactly (then the closest).
    """
    filler_text = " ".join(FILLER_SENTENCES * (length // 100 + 2))
    filler_ids = encode(tokenizer, filler_text)

    def measure(text: str) -> int:
        return len(build_segments(tokenizer, question, text).context_ids)

    base = measure(FACT)
    left_tokens = max(0, (length - base) // 2)
    left = tokenizer.decode(filler_ids[:left_tokens]).strip() if left_tokens else ""
    head = f"{left} {FACT}".strip()

    def build(chars: int) -> tuple[str, int]:
        text = f"{head} {filler_text[:chars]}".strip() if chars else head
        return text, measure(text)

    low, high = 0, len(filler_text)
    while low < high:  # smallest cut whose count reaches the target
        middle = (low + high) // 2
        if build(middle)[1] >= length:
            high = middle
        else:
            low = middle + 1
    best = None
    for chars in [low] + [low + d for d in (-1, 1, -2, 2, -3, 3, 4, 5, 6)]:
        if 0 <= chars <= len(filler_text):
            text, measured = build(chars)
            if measured == length:
                return text, measured
            if best is None or abs(measured - length) < abs(best[1] - length):
                best = (text, measured)
    return best


# --- measuring --------------------------------------------------------------------------------


class PeakMemory:
    """Peak memory growth during a block: CUDA allocator on GPU, sampled resident set on CPU."""

    def __init__(self, device):
        self.device = device
        self.cuda = str(device).startswith("cuda")
        self.peak_bytes = 0
        self.method = (
            "torch.cuda.max_memory_allocated above the allocation before"
            if self.cuda
            else "CPU: resident-set growth above the level after gc + malloc_trim, sampled every 1 ms from "
            "/proc/self/statm; a lower bound (memory the allocator still holds is reused unseen)"
        )

    @staticmethod
    def _trim() -> None:
        """Hand freed heap memory back to the OS so that growth during the block shows in the RSS."""
        import ctypes
        import gc

        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass

    @staticmethod
    def _rss() -> int:
        try:
            with open("/proc/self/statm", encoding="ascii") as handle:
                return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def __enter__(self):
        if self.cuda:
            synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)
            self._before = torch.cuda.memory_allocated(self.device)
        else:
            self._trim()
            self._before = self._rss()
            self._max = self._before
            self._stop = threading.Event()

            def sample():
                while not self._stop.is_set():
                    self._max = max(self._max, self._rss())
                    time.sleep(0.001)

            self._thread = threading.Thread(target=sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self._before
        else:
            self._stop.set()
            self._thread.join()
            self._max = max(self._max, self._rss())
            self.peak_bytes = self._max - self._before
        return False


def machine_facts(device) -> dict:
    facts = {
        "uname": " ".join(platform.uname()),
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    try:
        import transformers

        facts["transformers"] = transformers.__version__
    except ImportError:
        pass
    if str(device).startswith("cuda"):
        facts["gpu"] = torch.cuda.get_device_name(device)
    facts["git_commit"] = (paths.git("rev-parse", "--short", "HEAD") or "unknown").strip()
    return facts


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
    report["speed"] = speed.measure(pair, repeats, progress)
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
        for key in ("batched_decode_ms", "stack_stream_ratio", "warm_full_run_seconds", "warm_serial_run_seconds",
                    "warm_page_run_seconds", "page_over_process_ratio"):
            report[key] = report["speed"][key]
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
