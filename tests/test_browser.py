"""The page in a real browser: Playwright (pip) driving Debian's Chromium at /usr/bin/chromium.

Loads the page, checks the precomputed first paint, clicks a preset, runs it live on the embedded
pair, waits for every answer and plot, checks the plots' bar counts, saves a screenshot into
$KVVIZ_TEST_ARTIFACTS (default test-artifacts/), and checks that HTML typed into the query is
shown as text and never executed. Never runs `playwright install`: the browser comes from apt.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import served_on_loopback

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
IN_CI = os.environ.get("CI", "").lower() == "true"
MAX_NEW_TOKENS = 4
RUN_TIMEOUT_MS = 300_000

pytestmark = [pytest.mark.integration, pytest.mark.real_model]


def artifacts_dir() -> Path:
    folder = Path(os.environ.get("KVVIZ_TEST_ARTIFACTS", "test-artifacts"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)"
        if IN_CI:
            pytest.fail(f"CI=true needs the browser: {message}")
        pytest.skip(message)
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def app_url(embedded_pair):
    from kvviz import ui

    with served_on_loopback(ui.build_demo(default_max_new_tokens=MAX_NEW_TOKENS)) as url:
        yield url


@pytest.fixture()
def page(browser, app_url):
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(app_url, wait_until="domcontentloaded")
    page.errors = errors
    yield page
    context.close()


# Bars per trace of the plotly figure inside a gr.Plot, read from the rendered DOM.
BAR_COUNTS_JS = """
(plotId) => {
  const gd = document.querySelector(`#${plotId} .js-plotly-plot`);
  if (!gd || !gd.data) return null;
  const out = {};
  gd.data.forEach((trace, i) => {
    if (trace.type !== 'bar') return;
    const key = (trace.meta && trace.meta.series) || trace.name || String(i);
    out[key] = (trace.y || []).length;
  });
  out.__rendered = gd.querySelectorAll('g.trace.bars path').length;
  return out;
}
"""


def bar_counts(page, plot_id: str) -> dict:
    return page.evaluate(BAR_COUNTS_JS, plot_id)


def textbox_value(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id} textarea").first.input_value()


def run_and_wait(page) -> None:
    page.locator("#kv-run").click()
    try:
        page.get_by_text("Live run finished").wait_for(timeout=RUN_TIMEOUT_MS)
    except Exception:
        page.screenshot(path=str(artifacts_dir() / "browser-failure.png"), full_page=True)
        raise AssertionError(
            f"the live run did not finish; status: {page.locator('#kv-status').inner_text()!r}; "
            f"page errors: {page.errors}; screenshot: browser-failure.png"
        ) from None


def test_page_loads_with_precomputed_plots_then_runs_a_preset_live(page, embedded_pair):
    from kvviz.presets import PRESETS

    # first paint: precomputed results and plots before any model runs
    page.locator("#kv-plot-latency .js-plotly-plot .main-svg").first.wait_for(timeout=60_000)
    assert page.locator("#kv-status").get_by_text("precomputed").count() >= 1

    # click a preset: query and context fill in
    target = PRESETS[1]
    page.locator("#kv-presets").get_by_text(target.label).click()
    page.wait_for_function(
        "(q) => document.querySelector('#kv-query textarea').value === q", arg=target.query, timeout=30_000
    )
    assert textbox_value(page, "kv-context") == target.context

    run_and_wait(page)
    for name in ("receiver", "text", "kvcomm", "skyline"):
        assert textbox_value(page, f"kv-answer-{name}").strip(), f"{name} has no answer"
    c2c_stats = page.locator("#kv-stats-c2c").inner_text()
    assert "total" in c2c_stats or "Not applicable" in c2c_stats
    control_stats = page.locator("#kv-stats-c2c_control").inner_text()
    assert "total" in control_stats or "Not applicable" in control_stats

    layers = embedded_pair.receiver.facts.num_layers
    kvcomm = bar_counts(page, "kv-plot-kvcomm")
    assert {k: v for k, v in kvcomm.items() if k != "__rendered"} == {"calibration": layers, "query": layers}
    assert kvcomm["__rendered"] == 2 * layers  # every bar drawn
    latency = bar_counts(page, "kv-plot-latency")
    assert len([k for k in latency if k != "__rendered"]) == 5  # one trace per stage
    applicable_columns = 4 + int("total" in c2c_stats) + int("total" in control_stats)
    assert all(v == applicable_columns for k, v in latency.items() if k != "__rendered")
    assert bar_counts(page, "kv-plot-bytes")["bytes"] >= 2  # text and KVComm send something
    c2c = bar_counts(page, "kv-plot-c2c")
    if "total" in c2c_stats:
        assert c2c["gate_k"] == c2c["gate_v"] == layers
    assert page.locator("#kv-status").get_by_text("precomputed").count() == 0

    page.locator("#kv-plot-sweep .js-plotly-plot").first.wait_for()
    page.screenshot(path=str(artifacts_dir() / "browser-live-run.png"), full_page=True)
    assert not page.errors, page.errors


def test_html_typed_into_the_query_is_shown_as_text(page):
    payload = '<img src=x onerror="window.__kvxss=1"><script>window.__kvxss=2</script> Where is it?'
    page.locator("#kv-query textarea").fill(payload)
    page.locator("#kv-context textarea").fill("The key is under the mat.")
    run_and_wait(page)
    assert page.evaluate("window.__kvxss") is None
    assert page.locator('img[src="x"]').count() == 0
    # what the receiver read holds the query as literal text
    page.locator("#kv-col-receiver").get_by_text("What each model saw").click()
    assert payload in textbox_value(page, "kv-seen-receiver")
    page.screenshot(path=str(artifacts_dir() / "browser-html-query.png"), full_page=True)
    assert not page.errors, page.errors


def test_ticking_a_handoff_shows_its_column_with_no_page_code_for_it(page):
    """AC and CIPHER are registered handoffs off the page at first: ticking them shows their
    columns (and their precomputed results), without a line of the page's code naming them."""
    from kvviz.handoffs import registry

    page.locator("#kv-plot-latency .js-plotly-plot .main-svg").first.wait_for(timeout=60_000)
    for name in ("ac", "cipher"):
        assert not page.locator(f"#kv-col-{name}").is_visible()
        page.locator("#kv-handoffs").get_by_text(registry.get(name).title).click()
        page.locator(f"#kv-col-{name}").wait_for(state="visible", timeout=30_000)
        assert registry.get(name).title in page.locator(f"#kv-col-{name}").inner_text()
    page.locator("#kv-plot-ac .js-plotly-plot").first.wait_for(state="visible", timeout=30_000)
    assert not page.errors, page.errors
