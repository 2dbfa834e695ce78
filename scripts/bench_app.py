"""Performance of the app (a benchmark, not a test).

    python scripts/bench_app.py [--pair embedded] [--max-new-tokens 32] [--loads 3] [--out FILE]

Measures, with the app served on 127.0.0.1 (random free port) in this process:
1. a warm run of the page's default handoffs through the app's ``run`` endpoint (gradio_client), with
   ``--max-new-tokens`` per answer: one run first loads and warms the models, the next ones are
   timed (wall clock of the whole endpoint call, and each handoff's own measured total);
2. the time from page load (navigation start) to the first plot painted, in Debian's Chromium
   driven by Playwright (skipped with a note when /usr/bin/chromium is missing), and the same for
   a control page served the same way: one Gradio ``gr.Plot`` with a three-bar figure and nothing
   else, the floor that any page drawing its plots with Gradio's plotly has on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
# Records when the first plotly figure's SVG appears, relative to navigation start.
FIRST_PLOT_JS = """
(() => {
  const mark = () => {
    if (window.__kvFirstPlot === undefined && document.querySelector('.js-plotly-plot .main-svg')) {
      window.__kvFirstPlot = performance.now();
    }
  };
  new MutationObserver(mark).observe(document, {childList: true, subtree: true});
})();
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def timed_run(client, pair: str, preset, max_new_tokens: int) -> dict:
    started = time.perf_counter()
    outputs = client.predict(  # every other setting at the page's defaults
        pair=pair, query=preset.query, context=preset.context or "", max_new_tokens=max_new_tokens, api_name="/run"
    )
    wall = time.perf_counter() - started
    data = outputs[-1]
    return {
        "wall_seconds": wall,
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


def first_plot_times(url: str, loads: int) -> list[float] | str:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} missing: page-load timing skipped"
    from playwright.sync_api import sync_playwright

    times = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        for _ in range(loads):
            context = browser.new_context(viewport={"width": 1500, "height": 1000})
            page = context.new_page()
            page.add_init_script(FIRST_PLOT_JS)
            page.goto(url)
            page.wait_for_function("window.__kvFirstPlot !== undefined", timeout=120_000)
            times.append(page.evaluate("window.__kvFirstPlot") / 1000)
            context.close()
        browser.close()
    return times


def control_page_times(loads: int) -> list[float] | str:
    """First-plot times of a page with one small plotly figure and nothing else (the floor)."""
    import gradio as gr
    import plotly.graph_objects as go

    from kvviz.ui import launch_kwargs

    with gr.Blocks() as control:
        gr.Plot(go.Figure(go.Bar(x=["a", "b", "c"], y=[3, 1, 2])))
    control.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True, **launch_kwargs())
    try:
        return first_plot_times(control.local_url, loads)
    finally:
        control.close()


def live_screenshot(url: str, path: str, preset_label: str | None = None) -> float:
    """Open the page, (optionally) click a preset, run it live, save a full-page screenshot."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.goto(url)
        page.locator("#kv-plot-latency .js-plotly-plot").first.wait_for(timeout=120_000)
        if preset_label:
            page.locator("#kv-presets").get_by_text(preset_label).click()
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
    args = parser.parse_args(argv)

    from gradio_client import Client

    from kvviz.engine import load_pair
    from kvviz.presets import PRESETS
    from kvviz.stream import use_one_thread_per_handoff
    from kvviz.ui import build_demo, launch_kwargs

    use_one_thread_per_handoff()  # as app.py serves it
    started = time.perf_counter()
    load_pair(args.pair, progress=lambda message: print(message, file=sys.stderr))
    load_seconds = time.perf_counter() - started
    demo = build_demo(default_pair=args.pair)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True, **launch_kwargs())
    url = demo.local_url
    report: dict = {"pair": args.pair, "max_new_tokens": args.max_new_tokens, "model_load_seconds": load_seconds}
    try:
        # page load first, while the server is idle (as a visitor would find it)
        times = first_plot_times(url, args.loads)
        report["first_plot_seconds"] = times
        control_times = control_page_times(args.loads)
        report["control_first_plot_seconds"] = control_times
        client = Client(url, verbose=False)
        preset = PRESETS[0]  # private context: every handoff applies
        timed_run(client, args.pair, preset, args.max_new_tokens)  # warm-up
        report["warm_runs"] = [timed_run(client, args.pair, preset, args.max_new_tokens) for _ in range(args.runs)]
        if args.screenshot and Path(CHROMIUM).exists():
            report["screenshot_run_seconds"] = live_screenshot(url, args.screenshot)
    finally:
        demo.close()

    print(f"pair {args.pair}, {args.max_new_tokens} new tokens per answer, preset '{PRESETS[0].key}'")
    print(f"models loaded in {load_seconds:.1f} s (once per process)")
    walls = [run["wall_seconds"] for run in report["warm_runs"]]
    print(f"warm run of all handoffs through the app: median {statistics.median(walls):.2f} s (runs: "
          + ", ".join(f"{w:.2f}" for w in walls) + ")")
    last = report["warm_runs"][-1]["handoffs"]
    for name, row in last.items():
        if row["applicable"]:
            print(f"  {name:<9} {row['total_seconds']:.2f} s, {row['generated_tokens']} tokens")
        else:
            print(f"  {name:<9} not applicable: {row['reason'][:90]}")
    if isinstance(times, str):
        print(times)
    else:
        print(f"page load to first plot painted: median {statistics.median(times):.2f} s (loads: "
              + ", ".join(f"{t:.2f}" for t in times) + ")")
        print(f"control page (one gr.Plot, nothing else): median {statistics.median(control_times):.2f} s; "
              f"the lab page takes {statistics.median(times) / statistics.median(control_times):.2f}x the floor")
    if "screenshot_run_seconds" in report:
        print(f"live run in the browser for the screenshot: {report['screenshot_run_seconds']:.1f} s -> {args.screenshot}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
