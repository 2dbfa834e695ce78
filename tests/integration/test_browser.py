"""The page in a real browser: Playwright (pip) driving Debian's Chromium at /usr/bin/chromium.

What a learner sees (issue 21): at 1280x800 the Run button, every default column's answer and its
mark on the first screen; no text under 4.5:1 contrast in any tab, on a laptop or a phone; at 390
px no plot title or legend cut; Stop mid-run ends the run and says each column's state; an empty
query gives exactly one message, in the status line. Then a live run of a preset (answers, marks,
the text handoff's message as it is written, the figures of its tabs), typed HTML shown as text,
columns ticked on, and the walk-through that loads, scrolls to and outlines what it talks about.

Screenshots go to $KVVIZ_TEST_ARTIFACTS (default test-artifacts/): ``page-1280x800.png`` and
``page-390x844.png`` are the ones in docs/. Never runs `playwright install`: the browser comes from apt.
"""

from __future__ import annotations

import itertools
import os

import pytest

from tests.conftest import served_on_loopback
from tests.page_checks import (BOX_JS, CONTRAST_JS, PLOT_PARTS_JS, artifacts_dir, launched_chromium, marks, wait_for_marks,
                               walked)

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

MAX_NEW_TOKENS = 4
RUN_TIMEOUT_MS = 300_000
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
MIN_CONTRAST = 4.5

pytestmark = [pytest.mark.integration, pytest.mark.real_model]


@pytest.fixture(scope="module")
def browser():
    with launched_chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def app_url(embedded_pair):
    from kvviz.app import ui

    with served_on_loopback(ui.build_demo(default_max_new_tokens=MAX_NEW_TOKENS)) as url:
        yield url


def open_page(browser, app_url, viewport=LAPTOP):
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(app_url, wait_until="domcontentloaded")
    page.errors = errors
    page.locator("#kv-answer-receiver textarea").first.wait_for(timeout=60_000)
    wait_for_plots(page)
    return context, page


@pytest.fixture()
def page(browser, app_url):
    context, page = open_page(browser, app_url)
    yield page
    context.close()


@pytest.fixture()
def phone(browser, app_url):
    context, page = open_page(browser, app_url, PHONE)
    yield page
    context.close()


def wait_for_plots(page) -> None:
    """Until every plot shown in the open tab has drawn its SVG."""
    page.wait_for_function(
        "() => { const plots = [...document.querySelectorAll('#kv-inside [id^=kv-plot-]')].filter(e => e.offsetParent);"
        " return plots.length > 0 && plots.every(e => e.querySelector('.main-svg')); }", timeout=60_000)
    page.wait_for_timeout(300)


def open_tab(page, title: str) -> None:
    page.locator("#kv-inside").get_by_role("tab", name=title, exact=True).click()
    page.wait_for_timeout(500)


def box(page, elem_id: str):
    return page.evaluate(BOX_JS, elem_id)


def textbox_value(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id} textarea").first.input_value()


def swap_marks(page) -> dict[str, str]:
    """Each shown card's swap mark (``data-swap``: followed / kept / neither / none)."""
    return page.evaluate("() => Object.fromEntries([...document.querySelectorAll('[id^=kv-swap-]')]"
                         ".filter(e => e.offsetParent && e.dataset.swap).map(e => [e.id.slice(8), e.dataset.swap]))")


def choose_preset(page, label: str) -> None:
    page.locator("#kv-presets input").click()
    page.get_by_role("option", name=label, exact=True).click()


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


# Gradio's status tracker while an event of the page is queued or running ("queue: 1/1 | 0.8s",
# "processing | 0.5s", "0.1s"): transparent with show_progress="hidden", and gone when it is done.
EVENTS_PENDING_JS = r"""() => [...document.querySelectorAll('body *')].some(e => e.childElementCount === 0
  && /^(queue:|processing\b|\d+(\.\d+)?(\/\d+(\.\d+)?)?s$)/.test((e.textContent || '').trim()))"""


TRANSITIONS_RUNNING_JS = "() => document.getAnimations().some(a => a instanceof CSSTransition && a.playState === 'running')"


def overlapping(one, two, slack: float = 1.0) -> bool:
    """Two boxes [left, top, right, bottom] that share more than ``slack`` px each way."""
    return (one[0] < two[2] - slack and two[0] < one[2] - slack and one[1] < two[3] - slack and two[1] < one[3] - slack)


def low_contrast(page) -> list[dict]:
    """The texts under MIN_CONTRAST once the page's events are done (a pending event's tracker is not
    text a learner reads)."""
    # One JS turn: the page is checked for pending events and running CSS transitions (a button fading
    # in as it is enabled again) and read in the same task, so a queued event (a tab's recording) cannot
    # start its tracker between the two.
    settling = f"({EVENTS_PENDING_JS})() || ({TRANSITIONS_RUNNING_JS})()"
    texts = page.wait_for_function(f"() => {settling} ? null : ({CONTRAST_JS})()", timeout=30_000).json_value()
    return [t for t in texts if t["ratio"] < MIN_CONTRAST]


# --- the first screen, contrast, the phone ----------------------------------------------------------


def test_the_first_screen_at_1280x800_holds_run_and_every_default_answer_with_its_mark(page):
    from kvviz.app import ui

    page.screenshot(path=str(artifacts_dir() / "page-1280x800.png"))
    fold = LAPTOP["height"]
    run = box(page, "kv-run")
    assert run is not None and run[1] + run[3] <= fold, run
    for name in ui.default_columns():
        for elem_id in (f"kv-answer-{name}", f"kv-mark-{name}"):
            found = box(page, elem_id)
            assert found is not None and found[1] + found[3] <= fold, (elem_id, found)
    assert set(marks(page)) == set(ui.default_columns())
    assert all(kind in ("right", "wrong", "none", "na") for kind in marks(page).values())
    tabs = box(page, "kv-inside")
    assert tabs[1] < fold  # the tab bar is on the first screen
    plot = page.evaluate("() => { const p = [...document.querySelectorAll('#kv-inside [id^=kv-plot-]')]"
                         ".find(e => e.offsetParent); return p ? p.getBoundingClientRect().top : null; }")
    assert plot is not None and plot <= fold - 150, plot  # and the first plot's title and top with it
    assert page.locator("#kv-status").get_by_text("precomputed").count() == 1
    assert not page.errors, page.errors


@pytest.mark.parametrize("viewport", [LAPTOP, PHONE], ids=["1280x800", "390x844"])
def test_no_text_on_the_page_is_below_4_5_to_1_in_any_tab(browser, app_url, viewport):
    from kvviz.app.page.spec import TABS

    context, page = open_page(browser, app_url, viewport)
    try:
        failing = low_contrast(page)
        for _, title in TABS:
            open_tab(page, title)
            if title in ("Layers", "Time and bytes", "Sweep"):
                wait_for_plots(page)
            failing += [dict(t, tab=title) for t in low_contrast(page)]
        page.locator("#kv-settings .toggle-button, #kv-settings button").first.click()  # the settings sidebar
        page.locator("#kv-pair").wait_for(state="visible", timeout=10_000)
        failing += [dict(t, tab="settings") for t in low_contrast(page)]
        worst = sorted(failing, key=lambda t: t["ratio"])[:8]
        assert not failing, f"{len(failing)} texts under {MIN_CONTRAST}:1, e.g. {worst}"
    finally:
        context.close()


def test_at_390_px_no_plot_title_or_legend_is_cut_or_overlaps_another_and_the_first_answer_is_on_the_first_screen(phone):
    phone.screenshot(path=str(artifacts_dir() / "page-390x844.png"))
    answer = box(phone, "kv-answer-receiver")
    assert answer[1] + answer[3] <= PHONE["height"], answer
    rows = phone.evaluate("() => new Set([...document.querySelectorAll('#kv-inside [role=tab]')]"
                          ".map(t => Math.round(t.getBoundingClientRect().top))).size")
    assert rows == 1, f"the tabs take {rows} rows"  # one row that scrolls sideways
    assert phone.evaluate("() => getComputedStyle(document.getElementById('kv-verdict')).position") != "sticky"
    checked = 0
    for title in ("Layers", "Depth", "Compare two", "Time and bytes", "Sweep"):
        open_tab(phone, title)
        wait_for_plots(phone)
        for plot in phone.evaluate(PLOT_PARTS_JS):
            left, top, right, bottom = plot["svg"]
            for kind, text, (x0, y0, x1, y1) in plot["parts"]:
                inside = x0 >= left - 1 and x1 <= right + 1 and y0 >= top - 1 and y1 <= bottom + 1
                assert inside, f"{plot['id']}: {kind} {text!r} at {[x0, y0, x1, y1]} is cut by the plot {plot['svg']}"
            for (kind, text, one), (other_kind, other_text, two) in itertools.combinations(plot["parts"], 2):
                assert not overlapping(one, two), f"{plot['id']}: {kind} {text!r} lies over {other_kind} {other_text!r}"
            checked += 1
    assert checked >= 6  # C2C, its control, KVComm, the logit lens, compare, latency, bytes, sweep
    # plotly's toolbar would lie over the titles of a phone's plot (a tap shows it): none is shown
    assert phone.evaluate("() => [...document.querySelectorAll('.modebar-container')].every(e => !e.offsetParent)")
    phone.screenshot(path=str(artifacts_dir() / "page-390x844-plots.png"), full_page=True)


# --- errors and stops ---------------------------------------------------------------------------


def test_every_presets_whole_label_fits_in_the_preset_box_at_1280_px(page):
    """Each preset's label (title and scenario) is shown whole in the preset box on a laptop, clear of
    the box's arrow: at 300 px the box cut "Capital of Truxbiwaesk (shared question)" and "Capital of
    Australia (shared question)", and at 345 px the arrow covered their last letter."""
    from kvviz.app.presets import PRESETS

    assert labels_hidden_in_the_preset_box(page, [preset.label for preset in PRESETS]) == []


def test_every_presets_whole_label_fits_in_the_preset_box_on_a_phone(phone):
    from kvviz.app.presets import PRESETS

    assert labels_hidden_in_the_preset_box(phone, [preset.label for preset in PRESETS]) == []


def labels_hidden_in_the_preset_box(page, labels: list[str]) -> list[str]:
    """The labels that the preset box cuts or draws its arrow over (each set into its input, its
    text measured in the input's own font)."""
    return page.locator("#kv-presets input").first.evaluate(
        """(input, labels) => {
            const shown = input.value, hidden = [];
            const style = getComputedStyle(input), pen = document.createElement('canvas').getContext('2d');
            pen.font = style.font;
            const arrow = document.querySelector('#kv-presets .icon-wrap, #kv-presets svg');
            const arrowLeft = arrow ? arrow.getBoundingClientRect().left : Infinity;
            const textLeft = input.getBoundingClientRect().left + parseFloat(style.paddingLeft) + parseFloat(style.borderLeftWidth);
            for (const label of labels) {
                input.value = label;
                if (input.scrollWidth > input.clientWidth || textLeft + pen.measureText(label).width > arrowLeft) hidden.push(label);
            }
            input.value = shown;
            return hidden;
        }""", labels)


def test_an_empty_query_gives_exactly_one_message_in_the_status_line(page):
    before = {name: textbox_value(page, f"kv-answer-{name}") for name in ("receiver", "kvcomm")}
    page.locator("#kv-query textarea").fill("   ")
    page.locator("#kv-run").click()
    page.locator("#kv-status").get_by_text("Not run").wait_for(timeout=30_000)
    page.wait_for_timeout(1000)
    assert "query is empty" in page.locator("#kv-status").inner_text()
    body = page.locator("body").inner_text()
    assert body.count("query is empty") == 1, "the refusal is said once, in the status line"
    assert page.locator(".toast-body").count() == 0  # no toast
    assert page.get_by_text("Error", exact=True).count() == 0  # no error pill on the outputs
    assert {name: textbox_value(page, f"kv-answer-{name}") for name in before} == before  # the cards stay
    assert page.locator("#kv-run").is_enabled() and page.locator("#kv-run").inner_text() == "Run live"
    assert not page.errors, page.errors


def test_stop_pressed_mid_run_ends_it_and_marks_each_column(page):
    from kvviz.app import ui
    from kvviz.handoffs import registry

    page.locator("#kv-run").click()
    page.wait_for_function("() => [...document.querySelectorAll('[id^=kv-mark-]')].some(e => e.dataset.verdict === 'running')",
                           timeout=RUN_TIMEOUT_MS)
    assert not page.locator("#kv-run").is_enabled()  # busy: a second click cannot start another run
    assert page.locator("#kv-run").inner_text() == "Running…"
    page.locator("#kv-stop").click()
    page.locator("#kv-status").get_by_text("Stopped by you").wait_for(timeout=30_000)
    page.wait_for_timeout(500)
    states = marks(page)
    status = page.locator("#kv-status").inner_text()
    finished = {"right", "wrong", "none", "na", "failed"}
    assert set(states) == set(ui.default_columns())
    assert all(state in finished | {"stopped", "notstarted"} for state in states.values()), states
    assert any(state in ("stopped", "notstarted") for state in states.values()), states
    for name, state in states.items():
        said = {"stopped": "stopped", "notstarted": "not started"}.get(state, "finished")
        part = next(p for p in status.split(";") if registry.get(name).title in p)
        assert said in part, (name, state, status)
    # the button comes back with the run's last update (a fixed 500 ms wait lost that race on a busy CI machine)
    page.wait_for_function("() => { const b = document.querySelector('#kv-run'); "
                           "return b && !b.disabled && b.innerText.trim() === 'Run live'; }", timeout=10_000)
    page.screenshot(path=str(artifacts_dir() / "browser-stopped.png"))
    assert not page.errors, page.errors


# --- a live run, its tabs, typed HTML, ticks, the walk-through --------------------------------------


def test_a_preset_runs_live_with_marks_its_message_as_written_and_its_figures(page, embedded_pair):
    from kvviz.app import ui
    from kvviz.app.presets import preset

    target = preset("fuji")
    choose_preset(page, target.label)
    page.wait_for_function("(q) => document.querySelector('#kv-query textarea').value === q", arg=target.query,
                           timeout=30_000)
    assert textbox_value(page, "kv-context") == target.context
    assert page.locator("#kv-expected textarea, #kv-expected input").first.input_value() == "Japan"
    assert target.lesson[:40] in page.locator("#kv-lesson").inner_text()

    page.locator("#kv-run").click()
    page.locator("#kv-stats-text").get_by_text("the sharer writes").wait_for(timeout=RUN_TIMEOUT_MS)
    page.get_by_text("Live run finished").wait_for(timeout=RUN_TIMEOUT_MS)
    for name in ("receiver", "text", "kvcomm", "skyline"):
        assert textbox_value(page, f"kv-answer-{name}").strip(), f"{name} has no answer"
    assert set(marks(page)) == set(ui.default_columns())
    assert "got through by" in page.locator("#kv-verdict").inner_text()

    layers = embedded_pair.receiver.facts.num_layers
    wait_for_plots(page)
    kvcomm = page.evaluate(BAR_COUNTS_JS, "kv-plot-kvcomm")
    assert {k: v for k, v in kvcomm.items() if k != "__rendered"} == {"calibration": layers, "query": layers}
    open_tab(page, "Time and bytes")
    wait_for_plots(page)
    latency = page.evaluate(BAR_COUNTS_JS, "kv-plot-latency")
    stages = {k: v for k, v in latency.items() if k != "__rendered"}
    applicable = sum(state != "na" for state in marks(page).values())
    assert len(stages) == 5 and set(stages.values()) == {applicable}  # the columns on the page, no hidden one
    assert page.locator("#kv-status").get_by_text("precomputed").count() == 0
    page.screenshot(path=str(artifacts_dir() / "browser-live-run.png"), full_page=True)
    # the live run joined the session's runs: Compare two shows C2C beside its control, in that run; the run
    # (on the Layers tab) recorded none of what crossed, so the tab records it as it opens, then draws it
    open_tab(page, "Compare two")
    page.wait_for_function("() => ((document.querySelector('#kv-compare-a input') || {}).value || '').includes('(live)')",
                           timeout=RUN_TIMEOUT_MS)  # the tab's events wait behind any run in the models' queue
    page.locator("#kv-recorded-compare").get_by_text("Recorded when this tab opened").wait_for(timeout=RUN_TIMEOUT_MS)
    assert "answered differently" not in page.locator("#kv-recorded-compare").inner_text()  # greedy: the same answers
    assert page.locator("#kv-compare-a input").input_value().endswith("· C2C")
    assert page.locator("#kv-compare-b input").input_value().endswith("· C2C control")
    page.wait_for_function("() => (document.querySelector('#kv-compare .kv-cmp-view') || {}).innerText"
                           "?.includes('scored against its control')", timeout=RUN_TIMEOUT_MS)
    assert not page.errors, page.errors


# Bars per trace of the plotly figure inside a gr.Plot, read from the rendered DOM.
BAR_COUNTS_JS = """
(plotId) => {
  const gd = document.querySelector(`#${plotId} .js-plotly-plot`);
  if (!gd || !gd.data) return null;
  const out = {};
  gd.data.forEach((trace, i) => {
    if (trace.type !== 'bar' || (trace.meta && trace.meta.legend_only)) return;
    const key = (trace.meta && trace.meta.series) || trace.name || String(i);
    out[key] = (trace.y || []).length;
  });
  out.__rendered = gd.querySelectorAll('g.trace.bars path').length;
  return out;
}
"""


def test_swap_the_fact_on_a_preset_marks_every_card_with_what_it_did_on_the_swapped_note(page):
    """The opening preset's stored swap: every card shows its answer on the swapped note and the
    outcome stored with the preset, the status line sums them up, and Compare two puts A beside A
    on the swapped note."""
    from kvviz.app import ui
    from kvviz.app.presets import DEFAULT_PRESET, load_precomputed, preset

    picked = preset(DEFAULT_PRESET)
    assert picked.swap is not None, "the opening preset carries a swap"
    assert page.locator("#kv-swap-replace textarea, #kv-swap-replace input").first.input_value() == picked.swap_words[0]
    assert swap_marks(page) == {}  # nothing about the swap before it is asked for
    page.locator("#kv-swap-button").click()
    page.locator("#kv-status").get_by_text("swapped note").wait_for(timeout=60_000)
    stored = {r["handoff"]: (r.get("swap") or {}).get("outcome") or "none"
              for r in load_precomputed()["presets"][DEFAULT_PRESET]["results"]}
    shown = swap_marks(page)
    assert set(shown) == set(ui.default_columns())
    assert shown == {name: stored[name] for name in shown}
    assert "followed" in shown.values()  # Skyline reads the note: the swap is one the receiver can follow
    for name, outcome in shown.items():  # each mark says on hover what it means
        title = page.locator(f"#kv-swap-{name}").get_attribute("title")
        assert outcome == "none" or title.startswith(registry_label(name)), (name, title)
    page.screenshot(path=str(artifacts_dir() / "browser-swap.png"), full_page=False)
    open_tab(page, "Compare two")
    page.locator("#kv-compare-swapped").click()
    page.locator("#kv-compare").get_by_text("on the swapped note").first.wait_for(timeout=30_000)
    assert "one fact of the note changed" in page.locator("#kv-compare").inner_text()
    assert not page.errors, page.errors


def test_a_preset_without_a_note_says_so_and_the_handbooks_swap_is_its_sharer_that_learned_the_opposite(page):
    """The sentence under the title follows the preset (no "private note" where there is none); the
    handbook preset fills its swap's answer, and Swap the fact shows its stored sharer swap."""
    from kvviz.app.presets import preset

    setup = page.locator("#kv-setup")
    assert "private note" in setup.inner_text()  # the opening preset has one
    picked = preset("handbook")
    choose_preset(page, picked.label)
    setup.get_by_text("learned facts in training").wait_for(timeout=30_000)
    assert "private note" not in setup.inner_text()
    answer = page.locator("#kv-swap-answer textarea, #kv-swap-answer input").first
    assert answer.input_value() == picked.swap.answers[0]
    page.locator("#kv-swap-button").click()
    page.locator("#kv-status").get_by_text("swapped sharer").wait_for(timeout=60_000)
    assert "came from the sharer" in page.locator("#kv-status").inner_text()
    page.screenshot(path=str(artifacts_dir() / "browser-handbook-swap.png"), full_page=False)
    assert not page.errors, page.errors


def registry_label(name: str) -> str:
    from kvviz.handoffs import registry

    return registry.label_of(name)


def test_swap_the_fact_on_a_typed_note_runs_it_live_and_marks_each_card(page):
    page.locator("#kv-query textarea").fill("What is the code for locker 7?")
    page.locator("#kv-context textarea").fill("The code for locker 7 is 5316.")
    page.locator("#kv-expected textarea, #kv-expected input").first.fill("5316")
    page.locator("#kv-swap-replace textarea, #kv-swap-replace input").first.fill("5316")
    page.locator("#kv-swap-by textarea, #kv-swap-by input").first.fill("8042")
    page.locator("#kv-swap-answer textarea, #kv-swap-answer input").first.fill("")
    page.locator("#kv-swap-button").click()
    page.locator("#kv-status").get_by_text("swapped note").first.wait_for(timeout=RUN_TIMEOUT_MS)
    page.locator("#kv-status").get_by_text("so the note now answers").wait_for(timeout=RUN_TIMEOUT_MS)
    shown = swap_marks(page)
    assert set(shown) == set(marks(page)) and set(shown.values()) <= {"followed", "kept", "neither"}, shown
    assert "8042" in page.locator("#kv-status").inner_text()
    assert not page.errors, page.errors


def test_insert_a_contradiction_on_a_typed_note_runs_it_live_and_each_card_says_which_answer_it_gave(page):
    """Insert a contradiction (issue 43): every shown card says which answer it gave with the sentence
    inserted, and both answers' first-token shares; the new rows read at 4.5:1."""
    page.locator("#kv-query textarea").fill("What is the code for locker 7?")
    page.locator("#kv-context textarea").fill("The code for locker 7 is 5316.")
    page.locator("#kv-expected textarea, #kv-expected input").first.fill("5316")
    page.wait_for_function(f"() => !({EVENTS_PENDING_JS})()", timeout=30_000)  # a new question clears the fields
    page.locator("#kv-contra-sentence textarea, #kv-contra-sentence input").first.fill("The code for locker 7 is 8042.")
    page.locator("#kv-contra-answer textarea, #kv-contra-answer input").first.fill("8042")
    page.locator("#kv-contra-button").click()
    page.locator("#kv-status").get_by_text("inserted after the sentence").wait_for(timeout=RUN_TIMEOUT_MS)
    shown = page.evaluate("() => Object.fromEntries([...document.querySelectorAll('[data-contradicted]')]"
                          ".filter(e => e.offsetParent).map(e => [e.id.slice(10), e.dataset.contradicted]))")
    assert set(shown) == set(marks(page)) and set(shown.values()) <= {"gold", "counter", "both", "neither"}, shown
    assert "first token: 5316" in page.locator(".kv-contra-row").first.inner_text()
    assert "8042" in page.locator("#kv-status").inner_text()
    page.wait_for_function("() => { const b = document.querySelector('#kv-run');"
                           "return b && !b.disabled && b.innerText.trim() === 'Run live'; }", timeout=30_000)
    failing = low_contrast(page)
    assert not failing, failing[:8]
    page.screenshot(path=str(artifacts_dir() / "browser-contradiction.png"), full_page=False)
    assert not page.errors, page.errors


# Each shown card: whether its title is cut (its text wider than its box) and its mark inside the card.
CARD_TITLES_JS = """() => [...document.querySelectorAll('.kv-card')].filter(c => c.offsetParent).map(c => {
  const t = c.querySelector('.kv-card-title'), m = c.querySelector('.kv-mark');
  const card = c.getBoundingClientRect(), mark = m.getBoundingClientRect(), title = t.getBoundingClientRect();
  return {id: c.id, cut: t.scrollWidth > t.clientWidth + 1 || title.width < 20,
          mark_inside: mark.left >= card.left - 1 && mark.right <= card.right + 1};
})"""


def tick(page, names) -> None:
    import re

    from kvviz.handoffs import registry

    for name in names:  # the exact label: "C2C" is in three chips' labels
        exact = re.compile(rf"^\s*{re.escape(registry.get(name).label)}\s*$")
        page.locator("#kv-handoffs label").filter(has_text=exact).click()
        page.locator(f"#kv-col-{name}").wait_for(state="visible", timeout=10_000)


@pytest.mark.parametrize("viewport", [LAPTOP, PHONE], ids=["1280x800", "390x844"])
def test_every_card_keeps_its_title_and_its_mark_at_6_11_and_14_columns(browser, app_url, viewport):
    from kvviz.app import ui
    from kvviz.app.page import spec

    context, page = open_page(browser, app_url, viewport)
    try:
        others = [name for name in spec.column_names() if name not in ui.default_columns()]
        for count, more in ((6, []), (11, others[:5]), (14, others[5:])):
            tick(page, more)
            cards = page.evaluate(CARD_TITLES_JS)
            assert len(cards) == count
            assert [c["id"] for c in cards if c["cut"] or not c["mark_inside"]] == [], (count, cards)
        if viewport is LAPTOP:
            page.screenshot(path=str(artifacts_dir() / "page-1280x800-every-column.png"), full_page=False)
        assert not page.errors, page.errors
    finally:
        context.close()


def test_run_is_within_ten_tab_presses_and_the_closed_settings_take_no_focus(page):
    for presses in range(1, 11):
        page.keyboard.press("Tab")
        focused = page.evaluate("() => [(document.activeElement.closest('[id]') || {}).id,"
                                " Math.round(document.activeElement.getBoundingClientRect().x)]")
        assert focused[1] >= 0, f"press {presses} focused {focused[0]!r} off screen"
        if focused[0] == "kv-run":
            break
    else:
        raise AssertionError("Run is not reached within 10 Tab presses")
    page.locator("#kv-settings .toggle-button").click()  # opened, the settings take focus again
    page.wait_for_function("() => !document.querySelector('#kv-settings .sidebar-content').inert", timeout=5_000)
    named = page.evaluate("() => [...document.querySelectorAll('[id^=kv-plot-]')].filter(e => e.offsetParent)"
                          ".map(e => e.getAttribute('aria-label'))")
    assert named and all(named), named  # every plot shown has an accessible name (its title)


def test_html_typed_into_the_query_is_shown_as_text(page):
    payload = '<img src=x onerror="window.__kvxss=1"><script>window.__kvxss=2</script> Where is it?'
    page.locator("#kv-query textarea").fill(payload)
    page.locator("#kv-context textarea").fill("The key is under the mat.")
    page.locator("#kv-expected textarea, #kv-expected input").first.fill('<b onmouseover="window.__kvxss=3">mat</b>')
    run_and_wait(page)
    assert page.evaluate("window.__kvxss") is None
    assert page.locator('img[src="x"]').count() == 0 and page.locator("#kv-verdict b[onmouseover]").count() == 0
    open_tab(page, "What each model saw")
    assert payload in textbox_value(page, "kv-seen-receiver")  # what the receiver read holds it as literal text
    assert not page.errors, page.errors


def test_ticking_a_handoff_shows_its_column_with_no_page_code_for_it(page):
    """AC and CIPHER are registered handoffs off the page at first: ticking them shows their cards
    (and their precomputed results) and their figures, without a line of the page's code naming them."""
    from kvviz.handoffs import registry

    for name in ("ac", "cipher"):
        assert not page.locator(f"#kv-col-{name}").is_visible()
        page.locator("#kv-handoffs").get_by_text(registry.get(name).label, exact=True).click()
        page.locator(f"#kv-col-{name}").wait_for(state="visible", timeout=30_000)
        assert page.locator(f"#kv-mark-{name}").is_visible()
    page.locator("#kv-plot-ac .js-plotly-plot").first.wait_for(state="visible", timeout=30_000)
    assert not page.errors, page.errors


# Where the walk-through's text, its Next button and its target are on screen, and the room the
# docked panel leaves above it.
WALK_BOXES_JS = """(target) => {
  const rect = (el) => { const r = el.getBoundingClientRect(); return {top: r.top, bottom: r.bottom}; };
  return {text: rect(document.getElementById('kv-walk-text')), next: rect(document.getElementById('kv-walk-next')),
          panel: rect(document.getElementById('kv-walk')), target: rect(document.getElementById(target)),
          height: window.innerHeight};
}"""


def on_one_screen(boxes: dict) -> bool:
    """Text and Next wholly in the viewport, and the target's top in the room above the panel with
    at least 120 px of it (or all of it, when shorter) showing there."""
    inside = all(0 <= boxes[part]["top"] and boxes[part]["bottom"] <= boxes["height"] for part in ("text", "next"))
    target, panel_top = boxes["target"], boxes["panel"]["top"]
    shown = min(target["bottom"], panel_top) - max(target["top"], 0)
    return inside and target["top"] >= 0 and shown >= min(120, target["bottom"] - target["top"])


@pytest.mark.parametrize("viewport", [LAPTOP, PHONE], ids=["1280x800", "390px"])
def test_every_walkthrough_step_shows_its_text_its_next_button_and_its_target_on_one_screen(browser, app_url, viewport):
    """The walk-through loads each step's preset, outlines its target and scrolls it into the room
    above the docked panel: text, Next and target on one screen at 1280x800 and at 390 px."""
    from kvviz.app import ui

    context, page = open_page(browser, app_url, viewport)
    try:
        for index, step in walked(page, ui.walkthrough_steps()):
            boxes = page.evaluate(WALK_BOXES_JS, step.target)
            assert on_one_screen(boxes), f"step {index + 1} ({step.title}, {step.target}) at {viewport}: {boxes}"
            if viewport == LAPTOP and step.target == "kv-plot-kvcomm":
                page.screenshot(path=str(artifacts_dir() / "walkthrough-kvcomm-1280x800.png"))
        assert not page.errors, page.errors
    finally:
        context.close()


def stale_state(page) -> dict:
    """The signals a learner reads the page's state from: the shown cards' marks, the preset box,
    the lesson and the strip."""
    return {"marks": set(marks(page).values()), "preset": page.locator("#kv-presets input").first.input_value(),
            "lesson": page.evaluate("() => ((document.getElementById('kv-lesson') || {}).innerText || '').trim()"),
            "strip": page.locator("#kv-verdict").inner_text()}



def test_a_typed_question_greys_the_presets_cards_clears_its_lesson_and_a_link_opens_the_same_way(browser, app_url, page):
    """Typing a question clears the preset box, its lesson, the expected answer and the swap words and
    marks every card "other question" (greyed, no ✓ or ✗), the strip says which question they answer;
    typing the preset's question back brings them back; a typed-question link opens in the greyed
    state (tests/integration/test_browser_reading.py pastes, drops and deletes instead of typing)."""
    from urllib.parse import urlencode

    before = stale_state(page)
    assert before["preset"] and before["lesson"] and "stale" not in before["marks"], before
    type_into(page, "kv-query", "Where is Tomas?")
    try:
        wait_for_marks(page, {"stale"})
    except Exception:
        raise AssertionError(f"not greyed: {stale_state(page)}; status {page.locator('#kv-status').inner_text()!r}") from None
    typed = stale_state(page)
    assert typed["preset"] == "" and typed["lesson"] == "" and "Run live" in typed["strip"], typed
    assert page.locator("#kv-expected textarea, #kv-expected input").first.input_value() == ""
    color = page.evaluate("() => getComputedStyle(document.querySelector('#kv-answer-receiver textarea')).fontStyle")
    assert color == "italic"  # greyed (the theme's stale card)
    type_into(page, "kv-query", textbox_value_of_preset())
    wait_for_marks(page, {"right", "wrong", "none", "na"})
    assert stale_state(page)["lesson"] == before["lesson"]

    context = browser.new_context(viewport=LAPTOP)
    try:
        linked = context.new_page()
        linked.goto(f"{app_url}?{urlencode({'q': 'Where is Tomas?', 'c': 'Tomas moved to Lisbon.'})}",
                    wait_until="domcontentloaded")
        linked.locator("#kv-answer-receiver textarea").first.wait_for(timeout=60_000)
        wait_for_marks(linked, {"stale"})
        state = stale_state(linked)
        assert state["preset"] == "" and state["lesson"] == "" and "Where is Tomas?" in textbox_value(linked, "kv-query"), state
    finally:
        context.close()


def type_into(page, elem_id: str, text: str) -> None:
    """Type as a learner does: Gradio's input event comes from the keyboard (a bare ``fill`` sets the
    value without it), so the last character is typed."""
    box = page.locator(f"#{elem_id} textarea").first
    box.fill(text[:-1])
    box.press_sequentially(text[-1:])


def textbox_value_of_preset() -> str:
    """The opening preset's question (the page opens on it)."""
    from kvviz.app.page.spec import DEFAULT_PRESET
    from kvviz.app.presets import preset

    return preset(DEFAULT_PRESET).query


def test_a_predict_step_hides_its_answers_until_the_learner_picks_then_says_what_the_stored_run_did(page):
    from kvviz.app import ui

    steps = ui.walkthrough_steps()
    index = next(i for i, step in enumerate(steps) if step.predict is not None and step.predict.ask.kind == "follow")
    column = steps[index].predict.ask.column
    page.locator("#kv-walkthrough").click()
    page.locator("#kv-walk-text").get_by_text(steps[0].title).wait_for(timeout=30_000)
    for step in steps[1:index + 1]:
        page.locator("#kv-walk-next").click()
        page.locator("#kv-walk-text").get_by_text(step.title).wait_for(timeout=30_000)
    blurred = "(id) => getComputedStyle(document.getElementById(id)).filter.includes('blur')"
    page.wait_for_function(blurred, arg=f"kv-answer-{column}", timeout=10_000)
    assert page.evaluate(blurred, "kv-verdict") and page.locator("#kv-walk-guess").is_visible()
    assert page.locator("#kv-walk-next").is_visible()  # the panel's buttons stay in view beside the choices
    page.locator("#kv-walk-guess").get_by_text("Yes", exact=True).click()  # the stored run: it does not follow
    page.locator("#kv-walk-reveal").get_by_text("Not this time").wait_for(timeout=10_000)
    assert not page.evaluate(blurred, f"kv-answer-{column}") and not page.evaluate(blurred, "kv-verdict")
    page.locator("#kv-walk-next").click()
    page.locator("#kv-walk-text").get_by_text(steps[index + 1].title).wait_for(timeout=30_000)
    assert not page.locator("#kv-walk-guess").is_visible()
    assert not page.errors, page.errors


def test_the_data_tab_paints_its_table_as_it_opens_and_draws_the_json_when_its_box_opens(page):
    open_tab(page, "Data")
    page.wait_for_function("() => document.querySelector('#kv-results-table').innerText.includes('kvcomm')",
                           timeout=10_000)
    page.locator("#kv-json-box").get_by_text("Structured results", exact=False).first.click()
    page.wait_for_function("() => (document.querySelector('#kv-json') || {}).innerText?.includes('results')", timeout=30_000)
    assert not page.errors, page.errors
