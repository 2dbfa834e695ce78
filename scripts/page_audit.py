"""Audit the page in a real browser: where things are, how long they take, and text contrast.

    python scripts/page_audit.py --url http://127.0.0.1:7860/ [--sizes 1280x800,1400x900,390x844] [--shots DIR]

With no --url it serves the page itself (``kvviz.app.ui.build_demo``, precomputed results, no model
runs) on a free loopback port. For each viewport size it loads the page in Debian's Chromium
(Playwright, never ``playwright install``) and prints:

* the position (x, y, width, height in CSS pixels) of the elements a learner looks for first:
  the Run button, the status line, each answer, each plot, and whether each is above the fold;
* seconds from navigation to the first answer's text and to the first plot (a noisy wall-clock
  number on a shared machine: compare pages in one run, never across runs);
* every rendered text colour against the background it is drawn on (alpha and opacity composited
  through the ancestors), as WCAG contrast ratios, grouped, worst first; plot text (SVG) included.

``--shots DIR`` also saves a screenshot of the first screen and of the whole page per size.

``--beside-plain N`` measures only the first answer: the page and a one-textbox Gradio page (its
value set on the server, as the page's first answer is) served here side by side, loaded N times
each, interleaved, at 1280x800 in fresh browser contexts; it prints each page's median and their
ratio (the target: the page's median <= 1.5 s on an idle machine).

``--data-tab N`` measures only the Data tab: seconds from clicking it to its table painted with the
opening preset's rows, N times in fresh contexts at 1280x800, and their median (target: < 1 s).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.page_checks import BOX_JS, CHROMIUM, CHROMIUM_FLAGS, CONTRAST_JS  # noqa: E402  (the browser tests measure the same)

FIRST_ANSWER = "#kv-answer-receiver textarea, #kv-answer-receiver .kv-card-answer"
LANDMARKS = ["kv-run", "kv-stop", "kv-status", "kv-query", "kv-context", "kv-handoffs", "kv-settings"]

def served_page():
    """The page served on a free loopback port, in this process (precomputed results only)."""
    from kvviz.app import ui
    from tests.conftest import served_on_loopback

    return served_on_loopback(ui.build_demo())


def plain_page():
    """The baseline: one Gradio textbox whose value the server sets, served on a free loopback port."""
    import gradio as gr

    from tests.conftest import served_on_loopback

    with gr.Blocks() as demo:
        gr.Textbox(value="4471", elem_id="kv-answer-receiver", label="answer")
    return served_on_loopback(demo)


def wait_for_first_answer(page) -> None:
    page.wait_for_function(
        f"() => {{ const e = document.querySelector({json.dumps(FIRST_ANSWER)}); "
        "return e && ((e.value || e.textContent || '').trim().length > 0); }", timeout=120_000)


def seconds_to_first_answer(browser, url: str) -> float:
    """From navigation to the first answer's text painted, in a fresh browser context."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    started = time.perf_counter()
    page.goto(url, wait_until="domcontentloaded")
    wait_for_first_answer(page)
    seconds = time.perf_counter() - started
    context.close()
    return seconds


def beside_plain(browser, url: str, plain_url: str, times: int) -> dict:
    page, plain = [], []
    seconds_to_first_answer(browser, url)  # a first load warms the server's caches (figures, assets)
    for _ in range(times):
        page.append(seconds_to_first_answer(browser, url))
        plain.append(seconds_to_first_answer(browser, plain_url))
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
    return {"page_s": [round(v, 2) for v in page], "plain_s": [round(v, 2) for v in plain],
            "page_median_s": round(median(page), 2), "plain_median_s": round(median(plain), 2),
            "ratio": round(median(page) / median(plain), 2)}


# Click the Data tab and resolve with the milliseconds until its table shows the preset's rows,
# checked on every animation frame (the paint, not the server's answer).
DATA_TAB_JS = """() => new Promise(resolve => {
  const started = performance.now();
  const painted = () => { const table = document.querySelector('#kv-results-table');
    if (table && table.offsetParent && table.innerText.includes('kvcomm')) resolve(performance.now() - started);
    else requestAnimationFrame(painted); };
  [...document.querySelectorAll('#kv-inside [role=tab]')].find(tab => tab.textContent.trim() === 'Data').click();
  painted(); })"""


def data_tab_seconds(browser, url: str, times: int) -> dict:
    """Seconds from a click on the Data tab to its table painted, each in a fresh context, once
    the page has loaded and settled."""
    seconds = []
    for _ in range(times):
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        page.goto(url, wait_until="domcontentloaded")
        wait_for_first_answer(page)
        page.wait_for_timeout(2000)  # the load's own events done
        seconds.append(page.evaluate(DATA_TAB_JS) / 1000)
        context.close()
    return {"data_tab_s": [round(v, 2) for v in seconds], "median_s": round(sorted(seconds)[len(seconds) // 2], 2)}


def audit_size(browser, url: str, width: int, height: int, shots: Path | None) -> dict:
    page = browser.new_page(viewport={"width": width, "height": height})
    started = time.perf_counter()
    page.goto(url, wait_until="domcontentloaded")
    wait_for_first_answer(page)
    first_answer = time.perf_counter() - started
    page.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=120_000)
    first_plot = time.perf_counter() - started
    page.wait_for_timeout(1500)  # let late layout settle
    ids = page.evaluate("() => [...document.querySelectorAll('[id^=kv-]')].map(e => e.id)")
    wanted = LANDMARKS + sorted(i for i in ids if i.startswith(("kv-answer-", "kv-plot-")))
    boxes = {i: page.evaluate(BOX_JS, i) for i in wanted}
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shots / f"page-{width}x{height}.png"))
        page.screenshot(path=str(shots / f"page-{width}x{height}-full.png"), full_page=True)
    texts = page.evaluate(CONTRAST_JS)
    page.close()
    return {"first_answer_s": round(first_answer, 2), "first_plot_s": round(first_plot, 2), "boxes": boxes, "texts": texts}


def contrast_groups(texts: list[dict]) -> list[dict]:
    groups: dict[tuple, dict] = {}
    for item in texts:
        key = (item["fg"], item["alpha"], item["bg"])
        group = groups.setdefault(key, {"fg": item["fg"], "alpha": item["alpha"], "bg": item["bg"], "ratio": item["ratio"],
                                        "count": 0, "examples": [], "ids": set()})
        group["count"] += 1
        group["ids"].add(item["id"])
        if len(group["examples"]) < 3:
            group["examples"].append(item["text"][:40])
    return sorted(groups.values(), key=lambda g: g["ratio"])


def report(size: str, height: int, data: dict) -> str:
    lines = [f"## {size}: first answer {data['first_answer_s']} s, first plot {data['first_plot_s']} s after navigation", "",
             "| element | x | y | width | height | above the fold |", "|---|---|---|---|---|---|"]
    for name, box in data["boxes"].items():
        if box is None:
            lines.append(f"| {name} | hidden | | | | |")
        else:
            lines.append(f"| {name} | {box[0]} | {box[1]} | {box[2]} | {box[3]} | {'yes' if box[1] + box[3] <= height else 'no'} |")
    lines += ["", "| contrast | verdict (AA 4.5) | texts | colour | on | where | e.g. |", "|---|---|---|---|---|---|---|"]
    for g in contrast_groups(data["texts"]):
        where = ", ".join(sorted(i for i in g["ids"] if i)[:3]) or "(no id)"
        alpha = "" if g["alpha"] >= 1 else f" at {g['alpha']:.2f}"
        lines.append(f"| {g['ratio']:.2f} | {'FAIL' if g['ratio'] < 4.5 else 'ok'} | {g['count']} | {g['fg']}{alpha} | {g['bg']} | "
                     f"{where} | {'; '.join(g['examples'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="a running page (default: serve one here)")
    parser.add_argument("--sizes", default="1280x800,1400x900,390x844")
    parser.add_argument("--shots", type=Path, default=None, help="folder for screenshots")
    parser.add_argument("--json", type=Path, default=None, help="also write every measurement here")
    parser.add_argument("--beside-plain", type=int, default=0, metavar="N",
                        help="only the first answer, N loads each beside a one-textbox Gradio page")
    parser.add_argument("--data-tab", type=int, default=0, metavar="N", help="only the Data tab's paint, N times")
    args = parser.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    served = nullcontext(args.url) if args.url else served_page()
    out = {}
    with served as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            if args.beside_plain:
                with plain_page() as plain_url:
                    out["beside_plain"] = beside_plain(browser, url, plain_url, args.beside_plain)
                print(f"first answer after navigation, 1280x800, median of {args.beside_plain}: "
                      f"the page {out['beside_plain']['page_median_s']} s, a one-textbox Gradio page "
                      f"{out['beside_plain']['plain_median_s']} s (ratio {out['beside_plain']['ratio']}); "
                      f"each load: {out['beside_plain']}", flush=True)
            if args.data_tab:
                out["data_tab"] = data_tab_seconds(browser, url, args.data_tab)
                print(f"Data tab, click to its table painted, 1280x800, median of {args.data_tab}: "
                      f"{out['data_tab']['median_s']} s; each: {out['data_tab']['data_tab_s']}", flush=True)
            for size in ([] if args.beside_plain or args.data_tab else args.sizes.split(",")):
                width, height = map(int, size.split("x"))
                out[size] = audit_size(browser, url, width, height, args.shots)
                print(report(size, height, out[size]) + "\n", flush=True)
        finally:
            browser.close()
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
