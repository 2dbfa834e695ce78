"""A paired A/B of two checkouts of kvviz through the page (a benchmark, not a test).

    python scripts/ab_app.py OTHER_CHECKOUT [--runs 6] [--browser-runs 3] [--out FILE]

This machine's speed drifts by up to 2x over minutes, so two benchmarks run one after the other
cannot tell a 10% change. This serves both checkouts at once (``python app.py`` of each, its own
process, on a free loopback port) and alternates between them: warm ``/run`` calls of the page's
default handoffs on the locker preset (``gradio_client``), A then B then A..., and with
``--browser-runs`` warm live runs of each page pressed in Chromium (seconds to the Run button's
return). It reports each side's median and the median of the paired ratios (this checkout / the
other), each pair measured within seconds of each other; and, from ``/proc`` (Linux), the CPU
seconds each server spent on each ``/run`` call and in 10 s with no request (an idle server is not
free: before kvviz set Gradio's queue to poll every 10 ms, its event loop woke every 1 ms).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_app import CHROMIUM, CHROMIUM_FLAGS, press_run  # noqa: E402
from load_test import cpu_seconds  # noqa: E402

HERE = Path(__file__).resolve().parent.parent
IDLE_SECONDS = 10


def api_run(client, pair: str, preset, max_new_tokens: int) -> float:
    started = time.perf_counter()
    client.predict(pair=pair, query=preset.query, context=preset.context or "", max_new_tokens=max_new_tokens,
                   api_name="/run")
    return time.perf_counter() - started


def page_run(page) -> float:
    """Press Run on an open page; seconds until the Run button is back (the results drawn)."""
    return press_run(page)[1]


def paired(samples: dict[str, list[float]]) -> dict:
    a, b = samples["this"], samples["other"]
    return {"this": a, "other": b, "median_this": statistics.median(a), "median_other": statistics.median(b),
            "median_paired_ratio": statistics.median(x / y for x, y in zip(a, b))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("other", help="the other checkout (a git worktree, say)")
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=6, help="timed /run calls per side, alternating (after one warm-up each)")
    parser.add_argument("--browser-runs", type=int, default=0, help="timed live runs pressed on each page, alternating")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    other = Path(args.other).resolve()
    if not (other / "app.py").is_file():
        raise SystemExit(f"{other} holds no app.py: give a checkout of kvviz")

    from gradio_client import Client

    from kvviz.app.presets import PRESETS
    from kvviz.studies.page_speed import PageNotServed, serve_page, stop_page

    preset = PRESETS[0]  # the locker preset: every default handoff applies
    servers = {}
    try:
        for side, checkout in (("this", HERE), ("other", other)):
            servers[side] = serve_page(args.pair, checkout)
    except PageNotServed as error:
        for server, _ in servers.values():
            stop_page(server)
        raise SystemExit(f"{checkout}: {error}") from None
    report: dict = {"this": str(HERE), "other": str(other), "pair": args.pair, "preset": preset.key}
    try:
        clients = {side: Client(url, verbose=False) for side, (_, url) in servers.items()}
        for side, client in clients.items():  # loads the models, then warms them
            api_run(client, args.pair, preset, args.max_new_tokens)
            api_run(client, args.pair, preset, args.max_new_tokens)
        api, cpu = {"this": [], "other": []}, {"this": [], "other": []}
        for index in range(args.runs):
            order = ("this", "other") if index % 2 == 0 else ("other", "this")
            for side in order:
                before = cpu_seconds(servers[side][0].pid)
                api[side].append(api_run(clients[side], args.pair, preset, args.max_new_tokens))
                cpu[side].append(cpu_seconds(servers[side][0].pid) - before)
        report["api_run_seconds"] = paired(api)
        report["server_cpu_seconds_per_run"] = paired(cpu)
        before = {side: cpu_seconds(server.pid) for side, (server, _) in servers.items()}
        time.sleep(IDLE_SECONDS)
        report[f"server_cpu_seconds_idle_{IDLE_SECONDS}_s"] = {
            side: cpu_seconds(server.pid) - before[side] for side, (server, _) in servers.items()}
        if args.browser_runs and Path(CHROMIUM).exists():
            from playwright.sync_api import sync_playwright

            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
                pages = {}
                for side, (_, url) in servers.items():
                    pages[side] = browser.new_page(viewport={"width": 1280, "height": 800})
                    pages[side].goto(url)
                    pages[side].locator("#kv-answer-receiver textarea").first.wait_for(timeout=120_000)
                    page_run(pages[side])  # warm the page
                runs = {"this": [], "other": []}
                for index in range(args.browser_runs):
                    order = ("this", "other") if index % 2 == 0 else ("other", "this")
                    for side in order:
                        pages[side].bring_to_front()
                        runs[side].append(page_run(pages[side]))
                        pages[side].wait_for_timeout(500)
                browser.close()
            report["page_run_seconds"] = paired(runs)
    finally:
        for server, _ in servers.values():
            stop_page(server)
    for key, title in (("api_run_seconds", "warm /run"), ("server_cpu_seconds_per_run", "server CPU per /run"),
                       ("page_run_seconds", "warm live run on the page (Chromium)")):
        if key in report:
            row = report[key]
            print(f"{title}: this {row['median_this']:.2f} s, other {row['median_other']:.2f} s, median paired ratio "
                  f"this/other x{row['median_paired_ratio']:.3f} (this: {', '.join(f'{v:.2f}' for v in row['this'])}; "
                  f"other: {', '.join(f'{v:.2f}' for v in row['other'])})")
    idle = report.get(f"server_cpu_seconds_idle_{IDLE_SECONDS}_s")
    if idle:
        print(f"server CPU in {IDLE_SECONDS} s with no request: this {idle['this']:.2f} s, other {idle['other']:.2f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
