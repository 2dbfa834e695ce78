"""What the browser tests and scripts measure on the rendered page, and how they open Debian's
Chromium: the browser's path and flags, a launched browser (a missing Chromium fails under
``CI=true`` and skips elsewhere), the artifacts folder, a walk through the walk-through; and, as
JavaScript for Playwright's ``page.evaluate``, WCAG contrast of every visible text, element boxes,
and whether a plot's title and legend lie inside its SVG."""

import contextlib
import os
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
IN_CI = os.environ.get("CI", "").lower() == "true"


def artifacts_dir() -> Path:
    """Where the browser tests write their screenshots and logs (``KVVIZ_TEST_ARTIFACTS``)."""
    folder = Path(os.environ.get("KVVIZ_TEST_ARTIFACTS", "test-artifacts"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def require_chromium() -> None:
    """Fail under CI=true, skip elsewhere, when Debian's Chromium is not installed."""
    import pytest

    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)"
        if IN_CI:
            pytest.fail(f"CI=true needs the browser: {message}")
        pytest.skip(message)


@contextlib.contextmanager
def launched_chromium():
    """Debian's Chromium through Playwright (never ``playwright install``), closed on the way out."""
    import pytest

    require_chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def marks(page) -> dict[str, str]:
    """Each shown card's mark (``data-verdict``), by column."""
    return page.evaluate("() => Object.fromEntries([...document.querySelectorAll('[id^=kv-mark-]')]"
                         ".filter(e => e.offsetParent).map(e => [e.id.slice(8), e.dataset.verdict]))")


def wait_for_marks(page, kinds: set[str]) -> None:
    """Until every shown card's mark is one of ``kinds``."""
    page.wait_for_function("(kinds) => { const shown = [...document.querySelectorAll('[id^=kv-mark-]')]"
                           ".filter(e => e.offsetParent); return shown.length > 0 && shown.every(e => kinds.includes("
                           "e.dataset.verdict)); }", arg=sorted(kinds), timeout=15_000)


def walked(page, steps, settle_ms: int = 300):
    """Open the walk-through and go through ``steps`` with Next: yields (index, step) once each
    step's text is in the panel, its preset's question in the form and its target outlined and
    scrolled into place."""
    from kvviz.app.presets import preset

    page.locator("#kv-walkthrough").click()
    for index, step in enumerate(steps):
        if index:
            page.locator("#kv-walk-next").click()
        page.locator("#kv-walk-text").get_by_text(step.title).wait_for(timeout=30_000)
        if step.preset:
            page.wait_for_function("(q) => document.querySelector('#kv-query textarea').value === q",
                                   arg=preset(step.preset).query, timeout=30_000)
        page.wait_for_function("(id) => document.getElementById(id) && document.getElementById(id)"
                               ".classList.contains('kv-highlight')", arg=step.target, timeout=10_000)
        page.wait_for_timeout(settle_ms)  # the scroll lands after the outline
        yield index, step


# WCAG 2 contrast of every visible text against its composited background.
CONTRAST_JS = r"""
() => {
  const parse = c => { const m = (c || '').match(/rgba?\(([^)]+)\)/); if (!m) return null;
    const p = m[1].split(/[ ,\/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const over = (top, bottom) => [0, 1, 2].map(i => top[i] * top[3] + bottom[i] * (1 - top[3])).concat([1]);
  const lum = c => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const ratio = (a, b) => { const x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); };
  const background = el => { const layers = []; for (let e = el; e && e.nodeType === 1; e = e.parentElement) {
      const bg = parse(getComputedStyle(e).backgroundColor); if (bg && bg[3] > 0) layers.push(bg); if (bg && bg[3] >= 1) break; }
    let c = [255, 255, 255, 1]; for (let i = layers.length - 1; i >= 0; i--) c = over(layers[i], c); return c; };
  const opacity = el => { let o = 1; for (let e = el; e && e.nodeType === 1; e = e.parentElement) o *= parseFloat(getComputedStyle(e).opacity); return o; };
  const record = (el, text, colour, alpha) => { const bg = background(el); const fg = over([colour[0], colour[1], colour[2], colour[3] * alpha], bg);
    const r = el.getBoundingClientRect(); const cs = getComputedStyle(el);
    return {text: text.slice(0, 60), fg: `rgb(${colour.slice(0, 3).join(',')})`, alpha: Math.round(colour[3] * alpha * 100) / 100,
            bg: `rgb(${bg.slice(0, 3).map(Math.round).join(',')})`, ratio: Math.round(ratio(fg, bg) * 100) / 100,
            size: cs.fontSize, id: (el.closest('[id]') || {}).id || '', y: Math.round(r.y + window.scrollY)}; };
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n; (n = walker.nextNode());) {
    const text = n.textContent.trim(), el = n.parentElement; if (!text || !el || el.closest('svg')) continue;
    const r = el.getBoundingClientRect(), cs = getComputedStyle(el);
    if (!r.width || !r.height || cs.visibility === 'hidden') continue;
    out.push(record(el, text, parse(cs.color), opacity(el)));
  }
  for (const el of document.querySelectorAll('textarea, input[type=text], input[type=number]')) {
    if (!el.getBoundingClientRect().width || !el.value) continue;
    out.push(record(el, '[value] ' + el.value, parse(getComputedStyle(el).color), opacity(el)));
  }
  for (const t of document.querySelectorAll('.js-plotly-plot svg text')) {
    const s = t.textContent.trim(); if (!s || !t.getBoundingClientRect().width) continue;
    const cs = getComputedStyle(t), fill = parse(cs.fill); if (!fill) continue;
    const rec = record(t.closest('.js-plotly-plot'), '[plot] ' + s, fill, parseFloat(cs.fillOpacity || 1) * opacity(t));
    rec.id = (t.closest('[id]') || {}).id || ''; out.push(rec);
  }
  return out;
}
"""

BOX_JS = """(id) => { const e = document.getElementById(id); if (!e || !e.offsetParent) return null;
  const r = e.getBoundingClientRect(); return [r.x, r.y + window.scrollY, r.width, r.height].map(Math.round); }"""

# Per plotly figure on screen: its SVG box, and the boxes of its title, subplot titles and legend;
# a title or legend cut by the plot's edge lies partly outside the SVG box.
PLOT_PARTS_JS = """
() => [...document.querySelectorAll('.js-plotly-plot')].filter(e => e.offsetParent).map(plot => {
  const svg = plot.querySelector('.main-svg').getBoundingClientRect();
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const parts = [];
  for (const e of plot.querySelectorAll('.gtitle, .legend, .annotation-text, .xtitle')) {
    const r = e.getBoundingClientRect(); if (r.width && r.height) parts.push([e.getAttribute('class'), e.textContent.slice(0, 50), box(e)]);
  }
  return {id: (plot.closest('[id^=kv-plot-]') || {}).id, svg: [svg.left, svg.top, svg.right, svg.bottom], parts};
})
"""
