"""Performance of the app (a benchmark, not a test).

    python scripts/bench_app.py [--pair embedded] [--max-new-tokens 32] [--loads 3] [--out FILE]
    python scripts/bench_app.py --page-only --loads 3      # page loads only: no model is loaded or run

Measures, with the app served on 127.0.0.1 (random free port) in this process:
1. the time from page load (navigation start) to the first answer painted (the receiver's answer
   text in its card, from the precomputed opening preset) and to the first plot painted, in
   Debian's Chromium driven by Playwright (skipped with a note when /usr/bin/chromium is missing);
   and the same for two control pages served the same way: one Gradio ``gr.Textbox`` holding a
   word (the floor for any Gradio page's first text) and one ``gr.Plot`` with a three-bar figure
   (the floor for a first plot). On a shared machine only the ratios to the controls mean much;
2. unless ``--page-only``, a warm run of the page's default handoffs through the app's ``run``
   endpoint (gradio_client), with ``--max-new-tokens`` per answer: one run first loads and warms the
   models, the next ones are timed (wall clock of the whole endpoint call, and each handoff's own
   measured total). ``/run`` as scripts call it records nothing of what crossed (``--crossed off``, the
   default); ``--crossed on`` calls it with ``attention=True``, which records every part
   (``kvviz.runtime.crossed``) and returns the attention arrays; with ``--crossed both`` the timed runs
   alternate between the two, after a warm-up run each way, and the report gives the ratio of their
   median wall times (the capture's cost).
   Each timed run also says where this process's CPU went (``cpu``): the threads alive before and
   after it by name (the server's event loop, Gradio's worker threads, the client's) and the rest,
   the run's own model threads (issue 20: what the page costs beside the models). ``--stacks N``
   samples every thread's stack during the timed runs and prints the N busiest; ``--update-costs``
   times one streamed update in the server's event loop, with no model running.

    python scripts/bench_app.py --no-page-loads --runs 2 --stacks 15 --update-costs   # where the page's time goes

    python scripts/bench_app.py --no-page-loads --crossed both --runs 3   # the capture's cost

    python scripts/bench_app.py --no-page-loads --runs 3 --browser-runs 3   # and the page's own run, in Chromium

``--in-process`` (issue 42, the page's own cost): every round also runs the same request in this process
through the page's engine (``kvviz.engine.stream.run``, on the models the served page uses), recording
nothing and recording every part of what crossed, between the ``/run`` calls; the report then breaks
a run down: what recording what crossed costs in process (and its CPU per part: the lens, the attention
table, the scores against the controls, ``details["crossed_seconds"]``), and what the page adds over
the same work in process (events, Gradio's updates, JSON): ``/run`` as served (recording nothing) over
the plain run, and ``/run`` with ``attention=True`` over the run recording every part:

    python scripts/bench_app.py --no-page-loads --crossed both --in-process --runs 3 --update-costs
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from tests.page_checks import CHROMIUM, CHROMIUM_FLAGS  # noqa: E402  (the browser tests launch the same)

# Records (relative to navigation start) when the first answer's text and the first plot's SVG are
# on the page: checked at every animation frame (a textarea's value is not seen by a MutationObserver).
PAINT_JS = """
(() => {
  const check = () => {
    const now = performance.now();
    const answer = document.querySelector('#kv-answer-receiver textarea, #kv-control textarea');
    if (window.__kvFirstAnswer === undefined && answer && answer.value.trim()) window.__kvFirstAnswer = now;
    if (window.__kvFirstPlot === undefined && document.querySelector('.js-plotly-plot .main-svg')) window.__kvFirstPlot = now;
    if (window.__kvFirstAnswer === undefined || window.__kvFirstPlot === undefined) requestAnimationFrame(check);
  };
  requestAnimationFrame(check);
})();
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) of each thread of this process alive now, by thread name (Linux
    ``/proc/self/task``; empty elsewhere). The server's event loop is the thread uvicorn runs in."""
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[str, float] = {}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for task in tasks:
        try:
            fields = Path(f"/proc/self/task/{task}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(task), f"native {task}")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_during(before: dict[str, float], after: dict[str, float], process_seconds: float) -> dict:
    """Where the process's CPU went during a run: the threads alive at both ends (by name, the
    busiest first) and the rest (threads that came and went: the run's model threads)."""
    threads = {name: after[name] - before[name] for name in after if name in before and after[name] - before[name] >= 0.01}
    threads = dict(sorted(threads.items(), key=lambda item: -item[1]))
    return {"process_seconds": process_seconds, "threads": threads,
            "threads_that_came_and_went_seconds": max(0.0, process_seconds - sum(threads.values()))}


class StackSampler:
    """Samples every thread's Python stack (``sys._current_frames``) every ``interval`` seconds
    while on (``with sampler:``): per thread name, how often it was busy (not waiting on a lock, a
    queue, a socket or a sleep) and its busiest stacks, each cut to this project's and Gradio's
    frames (``--stacks``). A thread waiting for the interpreter lock counts as busy where it waits."""

    IDLE = ("wait", "select", "_worker", "get", "acquire", "sleep", "poll", "_wait_for_tstate_lock", "read", "recv",
            "run_forever", "accept", "readinto")

    def __init__(self, interval: float = 0.005):
        import collections

        self.interval, self.busy, self.seen = interval, collections.Counter(), collections.Counter()
        self.stacks = collections.Counter()
        self.on = threading.Event()
        threading.Thread(target=self._sample, name="bench-sampler", daemon=True).start()

    def __enter__(self):
        self.on.set()

    def __exit__(self, *exc):
        self.on.clear()

    def _sample(self):
        me = threading.get_ident()
        while True:
            self.on.wait()
            names = {thread.ident: thread.name for thread in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = names.get(ident, "?").rstrip("0123456789-_")
                self.seen[name] += 1
                if frame.f_code.co_name in self.IDLE:
                    continue
                self.busy[name] += 1
                ours = []
                while frame is not None:
                    where = "/".join(frame.f_code.co_filename.split("/")[-2:])
                    if "kvviz" in where or "gradio" in where or "page/" in where or "scripts/" in where:
                        ours.append(f"{where}:{frame.f_code.co_name}")
                    frame = frame.f_back
                self.stacks[(name, " < ".join(ours[:8]))] += 1
            time.sleep(self.interval)

    def report(self, top: int) -> dict:
        return {"busy_samples_by_thread": {name: [self.busy[name], self.seen[name]] for name in self.seen},
                "top_stacks": [{"thread": name, "samples": count, "stack": stack}
                               for (name, stack), count in self.stacks.most_common(top)]}


def update_costs(demo, repeats: int = 20) -> dict:
    """Milliseconds one streamed update costs, no model, this process idle otherwise. ``/run`` and the
    page's run are wired ``SENT_AS_IS`` (``kvviz.app.page.lab``): their values are serialized in the
    run's worker thread (``as_sent``), then Gradio's ``Blocks.postprocess_data`` in the event loop only
    stores them; both are timed, each update with every output given a value. For comparison, the same
    update as Gradio's own postprocess takes it (one thread hop per output, in the event loop), and ``/run``
    with 2 of its outputs set and the rest left as they were (Gradio's skip: a fresh component each).
    Also the page's tabs drawn after a run, one output set."""
    import asyncio

    from gradio.state_holder import SessionState

    from kvviz.app.page.lab import as_sent

    fns = {fn.name: fn for fn in (demo.fns.values() if isinstance(demo.fns, dict) else demo.fns)}
    api, page, drawn = fns["run"], fns["run_on_page"], fns["show_finished_run"]
    state = SessionState(demo)

    async def timed(fn, update, postprocess=None) -> float:
        """ms per update; ``postprocess``: the event's wiring for this measure (None: as the page wires it)."""
        wired = fn.postprocess
        fn.postprocess = wired if postprocess is None else postprocess
        try:
            started = time.perf_counter()
            for index in range(repeats):
                await demo.postprocess_data(fn, update(index), state)
            return (time.perf_counter() - started) / repeats * 1000
        finally:
            fn.postprocess = wired

    def every_output(fn):
        def values(index):
            given = [None if type(output).__name__ not in ("Textbox", "Markdown", "HTML") else "" for output in fn.outputs]
            given[0] = f"status {index}"
            return given
        return values

    def serialized_ms(fn) -> float:
        started = time.perf_counter()
        for index in range(repeats):
            as_sent(fn.outputs, every_output(fn)(index))
        return (time.perf_counter() - started) / repeats * 1000

    def sent(fn):
        return lambda index: as_sent(fn.outputs, every_output(fn)(index))

    async def measure():
        return {
            "run_outputs": len(api.outputs), "page_run_outputs": len(page.outputs),
            "run_wired_as_is": not api.postprocess, "page_run_wired_as_is": not page.postprocess,
            "run_serialized_in_worker_ms": serialized_ms(api),
            "run_event_loop_ms": await timed(api, sent(api)),
            "page_run_serialized_in_worker_ms": serialized_ms(page),
            "page_run_event_loop_ms": await timed(page, sent(page)),
            "run_gradio_postprocess_ms": await timed(api, every_output(api), postprocess=True),
            "page_run_gradio_postprocess_ms": await timed(page, every_output(page), postprocess=True),
            "run_two_set_rest_skipped_ms": await timed(api, lambda i: {api.outputs[0]: f"s{i}", api.outputs[1]: "a" * i},
                                                       postprocess=True),
            # what the page's run cost per update before it gave every output a value (its tabs now draw once, after)
            "page_tabs_one_set_rest_skipped_ms": await timed(drawn, lambda i: {drawn.outputs[0]: f"s{i}"}),
        }

    return asyncio.run(measure())


def timed_run(client, pair: str, preset, max_new_tokens: int, attention: bool = False) -> dict:
    """One ``/run`` call: as scripts call it (recording nothing), or with ``attention`` (every part)."""
    started, cpu_started, threads_before = time.perf_counter(), time.process_time(), thread_cpu_seconds()
    outputs = client.predict(  # every other setting at the page's defaults
        pair=pair, query=preset.query, context=preset.context or "", max_new_tokens=max_new_tokens,
        attention=attention, api_name="/run"
    )
    wall = time.perf_counter() - started
    cpu = cpu_during(threads_before, thread_cpu_seconds(), time.process_time() - cpu_started)
    data = outputs[-1]
    return {
        "wall_seconds": wall,
        "cpu": cpu,
        "handoffs": {
            r["handoff"]: {
                "applicable": r["applicable"],
                "total_seconds": r["timings"].get("total", 0.0) if r["applicable"] else None,
                "generated_tokens": r["tokens"].get("generated") if r["applicable"] else None,
                "reason": r.get("reason", ""),
            }
            for r in data["results"]
        },
    }


def paint_times(urls: dict[str, str], loads: int, what: str) -> dict[str, list[float]] | str:
    """Seconds from navigation to the first ``what`` ("answer" or "plot") painted, per load, at
    1280x800, for each page; loads alternate between the pages so that a busy machine slows them alike."""
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} missing: page-load timing skipped"
    from playwright.sync_api import sync_playwright

    marker = {"answer": "__kvFirstAnswer", "plot": "__kvFirstPlot"}[what]
    times: dict[str, list[float]] = {name: [] for name in urls}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        for _ in range(loads):
            for name, url in urls.items():
                context = browser.new_context(viewport={"width": 1280, "height": 800})
                page = context.new_page()
                page.add_init_script(PAINT_JS)
                page.goto(url)
                page.wait_for_function(f"window.{marker} !== undefined", timeout=120_000)
                times[name].append(page.evaluate(f"window.{marker}") / 1000)
                context.close()
        browser.close()
    return times


def control_page(what: str):
    """The floor for ``what``: a Gradio page holding one textbox with a word ("answer") or one small
    plotly figure ("plot"), and nothing else, served and themed as the lab is (call ``.close()``)."""
    import gradio as gr
    import plotly.graph_objects as go

    from kvviz.app.ui import launch_kwargs

    with gr.Blocks() as control:
        if what == "answer":
            gr.Textbox("4471", elem_id="kv-control")
        else:
            gr.Plot(go.Figure(go.Bar(x=["a", "b", "c"], y=[3, 1, 2])))
    control.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True, **launch_kwargs())
    return control


def page_load_times(url: str, loads: int) -> dict:
    """First answer and first plot painted on the lab page and on its control pages, alternating."""
    report = {}
    for what in ("answer", "plot"):
        control = control_page(what)
        try:
            measured = paint_times({"lab": url, "control": control.local_url}, loads, what)
        finally:
            control.close()
        missing = isinstance(measured, str)
        report[f"first_{what}_seconds"] = measured if missing else measured["lab"]
        report[f"control_first_{what}_seconds"] = measured if missing else measured["control"]
    return report


def median_line(label: str, times, control, control_label: str) -> str:
    if isinstance(times, str):
        return times
    line = (f"page load to {label}: median {statistics.median(times):.2f} s (loads: " + ", ".join(f"{t:.2f}" for t in times)
            + ")")
    if not isinstance(control, str):
        line += (f"; {control_label}: median {statistics.median(control):.2f} s; the lab page takes "
                 f"{statistics.median(times) / statistics.median(control):.2f}x that floor")
    return line


FINISHED = "Live run finished"  # the status line at a live run's end


def press_run(page) -> tuple[float, float]:
    """Press Run on an open page; seconds to the status line's "Live run finished" (the stream's
    end: every answer shown) and to the Run button's return (the tab in view drawn from the results)."""
    started = time.perf_counter()
    page.locator("#kv-run").click()
    page.wait_for_function(f"() => !document.querySelector('#kv-status').innerText.includes({FINISHED!r})",
                           timeout=600_000, polling=20)  # the run before said so too
    page.wait_for_function(f"() => document.querySelector('#kv-status').innerText.includes({FINISHED!r})",
                           timeout=600_000, polling=20)
    streamed = time.perf_counter() - started
    page.wait_for_function("() => document.querySelector('#kv-run').innerText.trim() === 'Run live'",
                           timeout=600_000, polling=20)
    return streamed, time.perf_counter() - started


def browser_runs(url: str, runs: int) -> list[dict]:
    """The page's own live run in Chromium (1280x800), as a visitor runs it: ``press_run`` on the
    opening preset, one run first to warm the page, then ``runs`` timed."""
    from playwright.sync_api import sync_playwright

    timed = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(url)
        page.locator("#kv-answer-receiver textarea").first.wait_for(timeout=120_000)
        for run in range(runs + 1):
            streamed, done = press_run(page)
            if run:
                timed.append({"stream_seconds": streamed, "done_seconds": done})
            page.wait_for_timeout(500)
        browser.close()
    return timed


def live_screenshot(url: str, path: str, preset_label: str | None = None) -> float:
    """Open the page, (optionally) click a preset, run it live, save a full-page screenshot."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(url)
        page.locator("#kv-answer-receiver textarea").first.wait_for(timeout=120_000)
        if preset_label:
            page.locator("#kv-presets input").click()
            page.get_by_role("option", name=preset_label, exact=True).click()
            time.sleep(1.0)
        started = time.perf_counter()
        page.locator("#kv-run").click()
        page.get_by_text("Live run finished").wait_for(timeout=600_000)
        seconds = time.perf_counter() - started
        time.sleep(1.5)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=path, full_page=True)
        browser.close()
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=2, help="timed warm runs (after one warm-up run)")
    parser.add_argument("--loads", type=int, default=3, help="page loads to time")
    parser.add_argument("--out", default=None, help="write the numbers as JSON here")
    parser.add_argument("--screenshot", default=None, help="after the benchmark, run the page live and save a screenshot here")
    parser.add_argument("--browser-runs", type=int, default=0, metavar="N",
                        help="also time N warm live runs of the page itself, pressing Run in Chromium")
    parser.add_argument("--page-only", action="store_true", help="time page loads only (no model is loaded or run)")
    parser.add_argument("--no-page-loads", action="store_true", help="skip the page-load timings (runs only)")
    parser.add_argument("--stacks", type=int, default=0, metavar="N",
                        help="sample every thread's stack during the timed runs; print the N busiest stacks")
    parser.add_argument("--update-costs", action="store_true",
                        help="time one streamed update in the server's event loop (no model), before the runs")
    parser.add_argument("--in-process", action="store_true",
                        help="also run the same request through the engine in this process, plain and recording, each round")
    parser.add_argument("--crossed", choices=("on", "off", "both"), default="off",
                        help="/run as scripts call it, recording nothing (off, the default), with attention=True, "
                             "recording every part (on), or alternate both ways")
    args = parser.parse_args(argv)

    from gradio_client import Client

    from kvviz.app.presets import PRESETS
    from kvviz.app.ui import build_demo, launch_kwargs
    from kvviz.engine.runner import load_pair
    from kvviz.engine.stream import use_one_thread_per_handoff

    use_one_thread_per_handoff()  # as app.py serves it
    os.environ["KVVIZ_RUN_CACHE_MB"] = "0"  # every timed run is computed, none served from the finished runs
    started = time.perf_counter()
    if not args.page_only:
        load_pair(args.pair, progress=lambda message: print(message, file=sys.stderr))
    load_seconds = time.perf_counter() - started
    demo = build_demo(default_pair=args.pair)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True, **launch_kwargs())
    url = demo.local_url
    report: dict = {"pair": args.pair, "max_new_tokens": args.max_new_tokens, "model_load_seconds": load_seconds}
    try:
        # page loads first, while the server is idle (as a visitor would find it)
        if not args.no_page_loads:
            report.update(page_load_times(url, args.loads))
        if args.page_only:
            return finish(report, args)
        if args.update_costs:
            report["update_costs"] = update_costs(demo)
        client = Client(url, verbose=False)
        preset = PRESETS[0]  # private context: every handoff applies
        ways = ["off", "on"] if args.crossed == "both" else [args.crossed]
        for way in ways:  # a warm-up run each way
            timed_run(client, args.pair, preset, args.max_new_tokens, attention=way == "on")
        runs = {way: [] for way in ways}
        engine = {"plain": [], "recorded": [], "crossed_seconds": []}
        if args.in_process:
            engine_round(load_pair(args.pair), preset, args.max_new_tokens, {way: [] for way in engine})  # warm-up
        sampler = StackSampler() if args.stacks else None
        for _ in range(args.runs):  # interleaved, so that the machine's load falls on both alike
            for way in ways:
                if sampler is not None:
                    sampler.on.set()
                runs[way].append(timed_run(client, args.pair, preset, args.max_new_tokens, attention=way == "on"))
                if sampler is not None:
                    sampler.on.clear()
            if args.in_process:
                engine_round(load_pair(args.pair), preset, args.max_new_tokens, engine)
        if args.in_process:
            report["in_process"] = page_breakdown(engine, runs)
        if sampler is not None:
            report["stacks"] = sampler.report(args.stacks)
        report["warm_runs"] = runs[ways[0]]
        if args.crossed == "both":
            report["crossed_on_runs"] = runs["on"]
            on = statistics.median(run["wall_seconds"] for run in runs["on"])
            off = statistics.median(run["wall_seconds"] for run in runs["off"])
            report["crossed_cost"] = {"median_on_seconds": on, "median_off_seconds": off, "ratio": on / off}
        if args.browser_runs and Path(CHROMIUM).exists():
            report["browser_runs"] = browser_runs(url, args.browser_runs)
        if args.screenshot and Path(CHROMIUM).exists():
            report["screenshot_run_seconds"] = live_screenshot(url, args.screenshot)
    finally:
        demo.close()
    return finish(report, args)


def engine_round(pair, preset, max_new_tokens: int, into: dict) -> None:
    """The page's request run once through the engine in this process recording nothing, once
    recording every part of what crossed (as ``/run`` with ``attention=True``): wall seconds of each,
    and the recorded run's CPU per part."""
    from kvviz.engine.stream import ALL_AT_ONCE
    from kvviz.handoffs.registry import build_request, default_handoffs
    from kvviz.studies.run_speed import engine_run

    for way, inspect in (("plain", None), ("recorded", {"gold": None})):
        request = build_request(preset.query, preset.context, max_new_tokens, inspect=inspect)
        wall, done, _ = engine_run(pair, request, default_handoffs(), ALL_AT_ONCE)
        into[way].append(wall)
        if inspect is not None:
            parts: dict[str, float] = {}
            for result in done.values():
                for part, seconds in result["details"].get("crossed_seconds", {}).items():
                    parts[part] = parts.get(part, 0.0) + seconds
            into["crossed_seconds"].append(parts)


def page_breakdown(engine: dict, runs: dict) -> dict:
    """Where a page run's time goes: medians of the in-process runs and of the /run calls of the same
    rounds, and their ratios."""
    median = statistics.median
    plain, recorded = median(engine["plain"]), median(engine["recorded"])
    out = {"in_process_plain_seconds": plain, "in_process_recorded_seconds": recorded,
           "in_process_plain_runs": engine["plain"], "in_process_recorded_runs": engine["recorded"],
           "recording_in_process_ratio": recorded / plain,
           "crossed_cpu_seconds": {part: median(r.get(part, 0.0) for r in engine["crossed_seconds"])
                                   for part in engine["crossed_seconds"][0]} if engine["crossed_seconds"] else {}}
    if runs.get("off"):  # /run as served: the same work as the plain run
        served = median(r["wall_seconds"] for r in runs["off"])
        out.update(page_as_served_seconds=served, page_as_served_over_in_process_plain=served / plain)
    if runs.get("on"):  # /run with attention=True: the same work as the run recording every part
        page_on = median(r["wall_seconds"] for r in runs["on"])
        out.update(page_attention_seconds=page_on, page_attention_over_in_process_recorded=page_on / recorded,
                   page_attention_over_in_process_plain=page_on / plain)
    return out


def finish(report: dict, args) -> int:
    """Print the report (and write it as JSON with --out)."""
    from kvviz.app.presets import PRESETS

    if "first_answer_seconds" in report:
        print(median_line("first answer painted", report["first_answer_seconds"], report["control_first_answer_seconds"],
                          "a page with one textbox"))
        print(median_line("first plot painted", report["first_plot_seconds"], report["control_first_plot_seconds"],
                          "a page with one plot"))
    if "warm_runs" not in report:
        return write_report(report, args)
    print(f"pair {args.pair}, {args.max_new_tokens} new tokens per answer, preset '{PRESETS[0].key}'")
    print(f"models loaded in {report['model_load_seconds']:.1f} s (once per process)")
    walls = [run["wall_seconds"] for run in report["warm_runs"]]
    print(f"warm run of all handoffs through the app: median {statistics.median(walls):.2f} s (runs: "
          + ", ".join(f"{w:.2f}" for w in walls) + ")")
    cpu = report["warm_runs"][-1]["cpu"]
    busiest = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in list(cpu["threads"].items())[:3])
    print(f"  CPU in the last run: {cpu['process_seconds']:.2f} s in all (this process: server and client); "
          f"{cpu['threads_that_came_and_went_seconds']:.2f} s in the run's own threads (the models); {busiest}")
    last = report["warm_runs"][-1]["handoffs"]
    for name, row in last.items():
        if row["applicable"]:
            print(f"  {name:<9} {row['total_seconds']:.2f} s, {row['generated_tokens']} tokens")
        else:
            print(f"  {name:<9} not applicable: {row['reason'][:90]}")
    if "update_costs" in report:
        costs = report["update_costs"]
        print(f"one streamed update, every output given a value: /run ({costs['run_outputs']} outputs) "
              f"{costs['run_serialized_in_worker_ms']:.2f} ms serialized in its worker + {costs['run_event_loop_ms']:.2f} ms "
              f"in the event loop (Gradio's own postprocess, a thread hop per output: {costs['run_gradio_postprocess_ms']:.1f} ms; "
              f"2 set and the rest skipped: {costs['run_two_set_rest_skipped_ms']:.1f} ms); the page's run "
              f"({costs['page_run_outputs']} outputs) {costs['page_run_serialized_in_worker_ms']:.2f} + "
              f"{costs['page_run_event_loop_ms']:.2f} ms (Gradio's own: {costs['page_run_gradio_postprocess_ms']:.1f} ms); "
              f"its tabs drawn after it, 1 set, the rest skipped {costs['page_tabs_one_set_rest_skipped_ms']:.1f} ms")
    if "stacks" in report:
        busy = report["stacks"]["busy_samples_by_thread"]
        print("busy samples by thread (busy / sampled): " + ", ".join(f"{name} {b}/{n}" for name, (b, n) in busy.items() if b))
        for row in report["stacks"]["top_stacks"]:
            print(f"  {row['samples']:6d} {row['thread']}: {row['stack'][:300]}")
    if "crossed_cost" in report:
        cost = report["crossed_cost"]
        ons = [run["wall_seconds"] for run in report["crossed_on_runs"]]
        print(f"the same run with attention=True (recording every part of what crossed): median "
              f"{cost['median_on_seconds']:.2f} s (runs: " + ", ".join(f"{w:.2f}" for w in ons)
              + f"); x{cost['ratio']:.3f} the run as served")
    if "in_process" in report:
        b = report["in_process"]
        print(f"the same request in this process through the engine: {b['in_process_plain_seconds']:.2f} s recording nothing, "
              f"{b['in_process_recorded_seconds']:.2f} s recording what crossed (x{b['recording_in_process_ratio']:.2f}; CPU s per run: "
              + ", ".join(f"{part} {seconds:.2f}" for part, seconds in b["crossed_cpu_seconds"].items()) + ")")
        if "page_as_served_over_in_process_plain" in b:
            print(f"  /run as served (recording nothing) over the plain run in process: "
                  f"x{b['page_as_served_over_in_process_plain']:.2f} (target <= 1.15)")
        if "page_attention_over_in_process_recorded" in b:
            print(f"  /run with attention=True over the run recording every part in process: "
                  f"x{b['page_attention_over_in_process_recorded']:.2f} (x{b['page_attention_over_in_process_plain']:.2f} "
                  "over the plain run)")
    if "browser_runs" in report:
        streams = [run["stream_seconds"] for run in report["browser_runs"]]
        dones = [run["done_seconds"] for run in report["browser_runs"]]
        print(f"warm live run of the page in Chromium (Run pressed): stream ends, median {statistics.median(streams):.2f} s "
              f"(runs: {', '.join(f'{w:.2f}' for w in streams)}); Run back, median {statistics.median(dones):.2f} s")
    if "screenshot_run_seconds" in report:
        print(f"live run in the browser for the screenshot: {report['screenshot_run_seconds']:.1f} s -> {args.screenshot}")
    return write_report(report, args)


def write_report(report: dict, args) -> int:
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
