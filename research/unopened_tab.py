"""Does a component in a tab nobody has opened cost the page's first paint? (issue 42; docs/SPEED.md 13.11)

    PYTHONPATH=. python research/unopened_tab.py [--components 70] [--loads 7]

Two Gradio pages served here side by side, each with one textbox whose value the server sets (as the
page's first answer is) and two tabs: the first holds one line of markdown, the second (never opened)
nothing on one page and ``--components`` rows of a textbox and a markdown line on the other. Each is
loaded ``--loads`` times in fresh Chromium contexts at 1280x800, interleaved, after one warm load each;
the seconds from navigation to the textbox's text painted (``scripts/page_audit.py``'s measure), and
their medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.page_audit import seconds_to_first_answer  # noqa: E402
from tests.conftest import served_on_loopback  # noqa: E402
from tests.page_checks import CHROMIUM, CHROMIUM_FLAGS  # noqa: E402


def page_with_unopened_tab(rows: int):
    import gradio as gr

    with gr.Blocks() as demo:
        gr.Textbox(value="4471", elem_id="kv-answer-receiver", label="answer")
        with gr.Tabs():
            with gr.Tab("first"):
                gr.Markdown("the tab shown at load")
            with gr.Tab("unopened"):
                for row in range(rows):
                    with gr.Row():
                        gr.Textbox(value=f"text {row}", label=f"box {row}")
                        gr.Markdown(f"note {row}")
    return demo


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--components", type=int, default=70, help="rows in the unopened tab (three components each)")
    parser.add_argument("--loads", type=int, default=7)
    args = parser.parse_args()
    with (served_on_loopback(page_with_unopened_tab(0)) as empty, served_on_loopback(page_with_unopened_tab(args.components)) as full,
          sync_playwright() as playwright):
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        seconds = {empty: [], full: []}
        for url in seconds:  # a first load warms each server
            seconds_to_first_answer(browser, url)
        for _ in range(args.loads):
            for url in seconds:
                seconds[url].append(seconds_to_first_answer(browser, url))
    for label, url in (("an empty unopened tab", empty), (f"{3 * args.components} components in it", full)):
        print(f"{label}: median {statistics.median(seconds[url]):.2f} s, each {[round(s, 2) for s in seconds[url]]}")
    print(f"ratio {statistics.median(seconds[full]) / statistics.median(seconds[empty]):.2f}")


if __name__ == "__main__":
    main()
