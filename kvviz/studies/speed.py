"""The speed report, with issue 42's targets met or missed.

``python -m kvviz bench --perf --speed-only [--json]``. Its parts, each measured in this one process (or
in the servers it starts):

* ``numeric_mode``: the numeric mode this process runs (``KVVIZ_NUMERICS``, ``kvviz.runtime.numerics``);
* ``modes``: per numeric mode (fp32, and the mode this CPU picks), each model's decode step beside the
  time to stream the weights the step reads (``kvviz.studies.model_speed``);
* ``full_run``: the warm run of the page's default handoffs on the locker preset, in this process,
  plain and recording what crossed as the page does, and one handoff after another
  (``kvviz.studies.run_speed``);
* ``page_run``: the same run through the served page's ``/run``, each round right after the same plain run
  in this process, and ``page_over_process_ratio``: the median of the rounds' ratios (``/run`` as served
  records nothing, as the plain run; ``page_over_plain_ratio`` is the same number) (``kvviz.studies.page_speed``);
* ``runs_at_once``: 1, 4 and 8 distinct runs at once, computed where ``python app.py`` computes them (in its
  worker processes, ``kvviz.engine.run_processes``, or in this process; ``computed`` says which);
* ``class_load``: 30 learners with 30 questions through the page (``scripts/load_test.py --class 30
  --distinct``);
* ``targets``: each of issue 42's targets that this report measured, met or missed;
* ``machine_load``: the load average at the start and at the end (on a shared machine the absolute
  times measure the others' jobs too; the ratios are measured side by side).

``--no-page`` leaves out what needs a served page (``page_run``, ``class_load``).
"""

from __future__ import annotations

import os

import torch

from kvviz.engine import run_processes
from kvviz.engine.stream import use_one_thread_per_handoff
from kvviz.runtime.numerics import MODES, describe, mode_for
from kvviz.studies import model_speed, page_speed, run_speed
from kvviz.studies.model_speed import BATCH_SIZES, PROMPT_TOKENS

# Issue 42's targets (on an idle machine)
PAGE_RUN_SECONDS = 3.0
PROCESS_RUN_SECONDS = 2.5
PAGE_OVER_PROCESS = 1.15
STEP_OVER_STREAM = 1.2
EIGHT_OVER_ONE = 3.0
CLASS_P95_SECONDS = 30.0


def modes_to_compare(pair) -> list[str]:
    """fp32 and the mode this CPU picks, for a pair on the CPU in fp32; else the pair's own."""
    if pair.receiver.device.type != "cpu" or pair.receiver.dtype != torch.float32:
        return [pair.receiver.numerics]
    chosen = mode_for("cpu", torch.float32, "auto")
    return [mode for mode in MODES if mode in ("fp32", chosen, pair.receiver.numerics)]


def runs_at_once_as_served(pair, repeats: int, progress) -> dict:
    """``run_speed.runs_at_once`` computed where the served page computes its runs: in as many worker
    processes as ``python app.py`` starts here (``run_processes.default_count``), or in this process."""
    count = run_processes.default_count()
    computed = f"in {count} worker processes, as python app.py computes them" if count else "in this process"
    progress(f"runs at once, {computed}")
    workers = run_processes.RunProcesses(count) if count else None
    try:
        found = run_speed.runs_at_once(pair, repeats=max(1, min(repeats, 2)), compute=workers and workers.run)
    finally:
        if workers is not None:
            workers.close()
    return {**found, "computed": computed}


def measure(pair, repeats: int, progress=None, page: bool = False, at_once: bool = True) -> dict:
    """The speed report (the module docstring); ``page``: also what needs the served page; ``at_once``:
    also the runs at once (the performance study leaves them to the speed report)."""
    progress = progress or (lambda message: None)
    report: dict = {"threads": torch.get_num_threads(), "numeric_mode": pair.receiver.numerics,
                    "numerics": describe(pair.receiver.numerics, pair.receiver.dtype),
                    "machine_load": {"start": list(os.getloadavg())}}
    by_mode = model_speed.speed_by_mode(pair, modes_to_compare(pair), repeats, progress)
    report["modes"] = {mode: {"models": entries} for mode, entries in by_mode.items()}
    report["models"] = by_mode[pair.receiver.numerics]  # this process's mode
    threads = torch.get_num_threads()
    use_one_thread_per_handoff()  # the in-process runs as the page serves them
    try:
        progress("warm run of the page's handoffs, in this process")
        report["full_run"] = run_speed.full_run(pair, repeats)
        if at_once:
            report["runs_at_once"] = runs_at_once_as_served(pair, repeats, progress)
    finally:
        torch.set_num_threads(threads)
    report["run_threads"] = "one torch thread per handoff, as the page serves (KVVIZ_THREADS overrides)"
    if page:
        progress("the same warm run through the page (python app.py), each round beside the run in this process")
        use_one_thread_per_handoff()
        try:
            report["page_run"] = page_speed.page_run(pair.name, repeats, beside=lambda: run_speed.plain_run(pair))
        finally:
            torch.set_num_threads(threads)
        progress("thirty learners, thirty questions (scripts/load_test.py --class 30 --distinct)")
        report["class_load"] = page_speed.class_load()
    report["machine_load"]["end"] = list(os.getloadavg())
    summarize(report)
    return report


def summarize(report: dict) -> None:
    """The report's headline fields, read from its parts, and its targets."""
    models = report["models"]
    report["decode_ms_per_token"] = {e["model"]: e["decode_ms_per_token"]["median"] for e in models}
    report["batched_decode_ms"] = {e["model"]: {c: v["median"] for c, v in e["batched_decode_ms"].items()} for e in models}
    report["stack_stream_ratio"] = {e["model"]: e["ratios"]["stack / stack stream"]["median"] for e in models}
    report["step_stream_ratio"] = {e["model"]: e["ratios"]["step / weights a step reads"]["median"] for e in models}
    run = report["full_run"]
    report["warm_full_run_seconds"] = run["warm_full_run_seconds"]["median"]
    report["warm_recorded_run_seconds"] = run["warm_recorded_run_seconds"]["median"]
    report["warm_serial_run_seconds"] = run["warm_serial_run_seconds"]["median"]
    page = report.get("page_run")
    report["warm_page_run_seconds"] = page["warm_page_run_seconds"]["median"] if page else None
    # /run as served records nothing (what crossed only with attention=True): the same work in process is the
    # plain run, run right before each /run call (page_speed.page_run), so the two ratios are one (both kept for
    # the reports that read them); None when the page was not measured
    report["page_over_process_ratio"] = (page or {}).get("page_over_process", {}).get("median")
    report["page_over_plain_ratio"] = report["page_over_process_ratio"]
    report["targets"] = targets(report)


def _verdict(value, limit) -> str:
    return "not measured" if value is None else ("met" if value <= limit else "missed")


def targets(report: dict) -> list[dict]:
    """Each of issue 42's targets this report measured: what, the number, met or missed."""
    rows = []

    def add(target, value, limit, shown):
        rows.append({"target": target, "measured": shown if value is not None else "not measured",
                     "verdict": _verdict(value, limit)})

    paged = report.get("warm_page_run_seconds")
    add(f"warm page run (/run as served: recording nothing) <= {PAGE_RUN_SECONDS} s", paged, PAGE_RUN_SECONDS, f"{paged or 0:.2f} s")
    process = report["warm_full_run_seconds"]
    add(f"warm run in process <= {PROCESS_RUN_SECONDS} s", process, PROCESS_RUN_SECONDS,
        f"{process:.2f} s (recording what crossed {report['warm_recorded_run_seconds']:.2f} s)")
    ratio = report.get("page_over_process_ratio")
    add(f"page <= {PAGE_OVER_PROCESS}x the in-process run (both recording nothing, /run as served)", ratio,
        PAGE_OVER_PROCESS, f"{ratio or 0:.2f}x")
    for name, value in report["step_stream_ratio"].items():
        add(f"{name}: decode step <= {STEP_OVER_STREAM}x the stream of the weights it reads ({report['numeric_mode']})",
            value, STEP_OVER_STREAM, f"{value:.2f}x (stack alone {report['stack_stream_ratio'][name]:.2f}x its stream)")
    eight = report.get("runs_at_once", {"counts": {}})["counts"].get("8", {})
    where = report.get("runs_at_once", {}).get("computed", "in this process")
    add(f"8 distinct runs at once <= {EIGHT_OVER_ONE}x one ({where})", eight.get("over_one_run"), EIGHT_OVER_ONE,
        f"{eight.get('over_one_run') or 0:.2f}x ({eight.get('answers_different_from_alone', 0)} answers differ from alone)")
    load = report.get("class_load")
    if load and "skipped" not in load:
        everyone = load["answered"] == load["class"] and load["differ_from_serial"] == 0
        rows.append({"target": f"{load['class']} learners, {load['class']} questions within 10 s: all answered, "
                               f"equal to a fresh server's, p95 <= {CLASS_P95_SECONDS:.0f} s",
                     "measured": f"{load['answered']}/{load['class']}, {load['differ_from_serial']} differ, p95 "
                                 f"{load['p95_s']:.1f} s ({load['p95_over_serial_all']:.2f}x one after another)",
                     "verdict": "met" if everyone and load["p95_s"] <= CLASS_P95_SECONDS else "missed"})
    elif load:
        rows.append({"target": "the class test", "measured": load["skipped"], "verdict": "not measured"})
    return rows


def _fmt(entry: dict, digits: int = 1) -> str:
    if not entry or entry.get("median") is None:
        return "n/a"
    return f"{entry['median']:.{digits}f} [{entry['min']:.{digits}f}, {entry['max']:.{digits}f}]"


def models_markdown(speed: dict) -> list[str]:
    clock = next((e["clock"] for part in speed["modes"].values() for e in part["models"] if "clock" in e), "")
    lines = [f"**Each model's decode step per numeric mode** ({clock}; a step = the decoder "
             f"stack on one new token + choosing the next token, after a {PROMPT_TOKENS}-token prompt; the streams "
             "read every byte of the weights once, in the same rounds)", "",
             "| model | mode | step ms | stack ms | head ms | stack stream ms | head scan stream ms | step / weights it reads "
             "| stack / stack stream | prefill ms/token | " + " | ".join(f"{c} seq" for c in BATCH_SIZES) + " |",
             "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(BATCH_SIZES)]
    for mode, part in speed["modes"].items():
        for e in part["models"]:
            if "skipped" in e:
                lines.append(f"| {e['model']} | {mode} | not measured: {e['skipped']} |" + " |" * (8 + len(BATCH_SIZES)))
                continue
            lines.append(
                f"| {e['model']} | {mode} | {_fmt(e['decode_ms_per_token'])} | {_fmt(e['decode_stack_ms'])} | "
                f"{_fmt(e['decode_head_ms'])} | {_fmt(e['limits']['stack_stream_ms'])} | {_fmt(e['limits']['head_scan_stream_ms'])} | "
                f"{_fmt(e['ratios']['step / weights a step reads'], 2)} | {_fmt(e['ratios']['stack / stack stream'], 2)} | "
                f"{_fmt(e['prefill_ms_per_token'], 2)} | "
                + " | ".join(_fmt(e["batched_decode_ms"].get(str(c), {})) for c in BATCH_SIZES) + " |")
    for e in speed["models"]:
        path = e["decode_path"]
        how = (f"batched step, {path['products']}, at least {path['rows_at_least']} rows a call" if path["batched"]
               else f"the model's own forward, one sequence at a time ({path['reason']})")
        lines.append(f"- {e['model']} ({e['numeric_mode']}): {how}")
    return lines


def markdown(speed: dict) -> str:
    load = speed["machine_load"]
    lines = [f"Numeric mode of this process: **{speed['numeric_mode']}** ({speed['numerics']}). Load average (1 min) "
             f"{load['start'][0]:.1f} at the start, {load['end'][0]:.1f} at the end on {os.cpu_count()} cores"
             + (" (**the machine was busy**: absolute times include the other jobs)" if max(load["start"][0], load["end"][0]) > 1.0
                else "") + ".", ""]
    lines += models_markdown(speed)
    run = speed["full_run"]
    per = ", ".join(f"{name} {_fmt(value, 2)} s" for name, value in run["handoff_seconds"].items())
    crossed = ", ".join(f"{part} {seconds:.2f}" for part, seconds in run["crossed_cpu_seconds_per_run"].items())
    lines += ["", f"**Warm run** of {', '.join(run['handoffs'])} on the locker preset ({run['max_new_tokens']} new tokens at "
              f"most), in this process: **{_fmt(run['warm_full_run_seconds'], 2)} s**; recording what crossed as the page does "
              f"{_fmt(run['warm_recorded_run_seconds'], 2)} s ({_fmt(run['recorded_over_plain'], 2)}x; CPU seconds a run spends "
              f"on it after the handoffs' answers: {crossed or 'n/a'}); one after another {_fmt(run['warm_serial_run_seconds'], 2)} s. "
              f"Each handoff's own total: {per}. First answer token streamed after "
              + ", ".join(f"{name} {_fmt(value, 2)} s" for name, value in run["first_token_wall_seconds"].items()) + "."]
    page = speed.get("page_run")
    if page is not None:
        lines.append(f"Through the page (python app.py, /run): **{_fmt(page['warm_page_run_seconds'], 2)} s**"
                     + (f" (not measured: {page['skipped']})" if "skipped" in page else
                        f", {speed['page_over_process_ratio']:.2f}x the same run in process (as served, /run records "
                        f"nothing without attention=True; each round beside the run in this process, "
                        f"{_fmt(page['in_process_seconds'], 2)} s, the ratio within each round)") + ".")
    together = speed.get("runs_at_once", {"counts": {}, "max_new_tokens": 0})
    lines += [] if not together["counts"] else ["", f"**Distinct runs at once**, {together.get('computed', 'in this process')} (each run its own locker code; "
              f"{together['max_new_tokens']} new tokens):", "", "| runs at once | wall s | over one run | over one after another | "
              "receiver's largest batch | answers != alone |", "|---|---|---|---|---|---|"]
    for count, entry in together["counts"].items():  # (none in the performance study)
        lines.append(f"| {count} | {_fmt(entry['wall_seconds'], 2)} | {entry['over_one_run'] or 0:.2f}x | "
                     f"{entry['over_one_after_another'] or 0:.2f}x | {entry['receiver_largest_batch']} | {entry['answers_different_from_alone']} |")
    lines += ["", "**Targets (issue 42)**", "", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {row['target']} | {row['measured']} | {row['verdict']} |" for row in speed["targets"]]
    return "\n".join(lines) + "\n"
