"""The page says what its reading of a run says, and follows the question, in a real browser
(Playwright driving Debian's Chromium at /usr/bin/chromium), with no model: the presets' stored runs.

* a question or a note pasted (Ctrl+V), cut, dropped or autofilled greys every card and clears the
  preset, its lesson, the expected answer and the swap words, as typing does; pasting the preset's
  question back brings them back;
* every preset, with all 14 columns ticked: the verdict strip says "got through by" exactly the
  columns its lesson's claims name, the lesson shown is the preset's, and with the swap shown every
  card says what it did with the swapped note;
* the walk-through on a 390x844 phone: on every step its Back, Next and Close, its choices and its
  target can be hit (each is the topmost element where a finger lands), before and after a guess.

Screenshots go to $KVVIZ_TEST_ARTIFACTS (default test-artifacts/).
"""

from __future__ import annotations

import os
from urllib.parse import urlencode

import pytest

from tests.conftest import served_on_loopback
from tests.page_checks import artifacts_dir, launched_chromium, marks, wait_for_marks, walked

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def browser():
    with launched_chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def app_url():
    from kvviz.app import ui

    with served_on_loopback(ui.build_demo(default_max_new_tokens=4)) as url:  # nothing here runs a model
        yield url


def opened(browser, url: str, viewport=LAPTOP):
    context = browser.new_context(viewport=viewport, permissions=["clipboard-read", "clipboard-write"])
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url, wait_until="domcontentloaded")
    page.locator("#kv-answer-receiver textarea").first.wait_for(timeout=60_000)
    page.wait_for_function("() => [...document.querySelectorAll('#kv-inside [id^=kv-plot-]')].filter(e => e.offsetParent)"
                           ".some(e => e.querySelector('.main-svg'))", timeout=60_000)
    page.errors = errors
    return context, page


def value(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id} textarea, #{elem_id} input").first.input_value()


def state(page) -> dict:
    return {"marks": set(marks(page).values()), "preset": value(page, "kv-presets"), "expected": value(page, "kv-expected"),
            "swap": (value(page, "kv-swap-replace"), value(page, "kv-swap-by"), value(page, "kv-swap-answer")),
            "lesson": page.evaluate("() => ((document.getElementById('kv-lesson') || {}).innerText || '').trim()"),
            "status": page.locator("#kv-status").inner_text()}


def paste_into(page, elem_id: str, text: str) -> None:
    """Select the box's text and paste ``text`` over it with Ctrl+V, as a learner does."""
    page.evaluate("(text) => navigator.clipboard.writeText(text)", text)
    box = page.locator(f"#{elem_id} textarea").first
    box.click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Control+V")


def test_a_pasted_question_greys_the_cards_and_clears_the_expected_answer_and_the_preset(browser, app_url):
    from kvviz.app.page import spec
    from kvviz.app.presets import DEFAULT_PRESET, preset

    picked = preset(DEFAULT_PRESET)
    context, page = opened(browser, app_url)
    try:
        before = state(page)
        assert before["preset"] and before["lesson"] and before["expected"] == spec.expected_text(picked.answers)
        assert before["swap"][0] == picked.swap_words[0] and "stale" not in before["marks"]
        paste_into(page, "kv-query", "Where is Tomas?")
        try:
            wait_for_marks(page, {"stale"})
        except Exception:
            raise AssertionError(f"a paste did not grey the cards: {state(page)}") from None
        pasted = state(page)
        assert pasted["preset"] == "" and pasted["lesson"] == "" and pasted["expected"] == "", pasted
        assert pasted["swap"] == ("", "", "") and "Not run yet" in pasted["status"], pasted
        assert "Run live" in page.locator("#kv-verdict").inner_text()
        page.screenshot(path=str(artifacts_dir() / "pasted-question-1280x800.png"))
        paste_into(page, "kv-query", picked.query)  # the preset's question again: its marks, answer and words back
        wait_for_marks(page, {"right", "wrong", "none", "na"})
        back = state(page)
        assert back["preset"] == before["preset"] and back["expected"] == before["expected"], back
        assert back["swap"] == before["swap"] and back["lesson"] == before["lesson"], back
        # a note dropped (or autofilled) over the old one: no keypress, and still the cards follow it
        page.evaluate("""() => { const box = document.querySelector('#kv-context textarea');
            box.value = 'Tomas moved to Lisbon.';
            box.dispatchEvent(new InputEvent('input', {inputType: 'insertFromDrop', bubbles: true})); }""")
        wait_for_marks(page, {"stale"})
        assert state(page)["expected"] == "" and state(page)["preset"] == ""
        assert not page.errors, page.errors
    finally:
        context.close()


def test_backspace_in_the_expected_answer_marks_the_cards_again(browser, app_url):
    """Backspace and Delete send no keypress either: emptying the expected answer with them unmarks
    every card (the run read again by no answer)."""
    context, page = opened(browser, app_url)
    try:
        box = page.locator("#kv-expected textarea, #kv-expected input").first
        box.click()
        page.keyboard.press("End")
        for _ in range(len(box.input_value())):
            page.keyboard.press("Backspace")
        wait_for_marks(page, {"unmarked"})
        assert "No expected answer" in page.locator("#kv-verdict").inner_text()
        assert not page.errors, page.errors
    finally:
        context.close()


def strip_got_through(page) -> list[str]:
    text = page.locator("#kv-verdict").inner_text()
    listed = text.split("got through by:", 1)[1].split(";", 1)[0].split(".", 1)[0].strip()
    return [] if listed == "none" else [part.strip() for part in listed.split(",")]


def test_every_lesson_holds_with_every_column_ticked_and_with_the_swap_shown(browser, app_url):
    """Each preset opened with all 14 columns ticked: the strip's "got through by" is its lesson's
    ``crossed`` claim, the lesson is the preset's, and Swap the fact marks every card with what it
    did on the swapped note without changing who got through."""
    from kvviz.app.lessons import stored_reading
    from kvviz.app.presets import PRESETS, load_precomputed
    from kvviz.app.reading import catalog

    every = catalog.names()
    assert len(every) == 14
    context = browser.new_context(viewport=LAPTOP)
    try:
        for picked in PRESETS:
            page = context.new_page()
            page.goto(f"{app_url}?{urlencode({'preset': picked.key, 'h': ','.join(every)})}", wait_until="domcontentloaded")
            page.locator("#kv-answer-receiver textarea").first.wait_for(timeout=60_000)
            page.wait_for_function("(q) => document.querySelector('#kv-query textarea').value === q", arg=picked.query,
                                   timeout=30_000)
            page.wait_for_function("(n) => document.querySelectorAll('.kv-card:not(.hidden) [id^=kv-mark-]').length >= n "
                                   "&& [...document.querySelectorAll('[id^=kv-mark-]')].filter(e => e.offsetParent).length === n",
                                   arg=len(every), timeout=30_000)
            claimed = next(c.expected for c in picked.claims if c.question.kind == "crossed")
            shown = strip_got_through(page)
            assert shown == [catalog.label_of(name) for name in catalog.in_page_order(claimed)], (picked.key, shown)
            assert picked.lesson[:60] in " ".join(page.locator("#kv-lesson").inner_text().split()), picked.key
            if picked.key == "locker":
                page.screenshot(path=str(artifacts_dir() / "every-column-1280x800.png"))
            if picked.swap is not None:
                if picked.swap_words:  # a swapped note: shown when asked; a swapped sharer is on the cards at once
                    page.locator("#kv-swap-button").click()
                    page.locator("#kv-status").get_by_text("swapped note").wait_for(timeout=30_000)
                swaps = page.evaluate("() => [...document.querySelectorAll('[id^=kv-swap-]')].filter(e => e.offsetParent"
                                      " && e.dataset.swap).length")
                stored = stored_reading(picked, load_precomputed()["presets"][picked.key])
                applicable = [name for name in every if stored.column(name).applicable]  # a card that does not apply has no swap row
                assert swaps == len(applicable), (picked.key, swaps)
                assert strip_got_through(page) == shown, picked.key  # the swap shown changes no evidence
            page.close()
    finally:
        context.close()


# Where a finger lands on each of ``ids`` (its centre; for a target, the middle of what shows of it above
# the walk-through's panel): whether that element is the topmost there, and how much of it shows.
HITS_JS = """(ids) => { const panel = document.getElementById('kv-walk').getBoundingClientRect();
  return ids.map(([id, target]) => { const el = document.getElementById(id);
    if (!el || !el.offsetParent) return {id, hit: false, why: 'not shown'};
    const r = el.getBoundingClientRect();
    const top = Math.max(r.top, 0), bottom = target ? Math.min(r.bottom, panel.top) : Math.min(r.bottom, innerHeight);
    const x = r.left + r.width / 2, y = (top + bottom) / 2;
    if (bottom - top < 1) return {id, hit: false, why: 'off screen', top: r.top, bottom: r.bottom};
    const found = document.elementFromPoint(x, y);
    return {id, hit: !!found && el.contains(found), shows: Math.round(bottom - top), height: Math.round(r.height),
            why: found ? ((found.closest('[id]') || {}).id || found.tagName) : 'nothing'}; }); }"""


def assert_hittable(page, ids: list[tuple[str, bool]], where: str) -> None:
    for found in page.evaluate(HITS_JS, ids):
        assert found["hit"], f"{where}: {found}"
        if found.get("height") and dict(ids)[found["id"]]:  # a target shows at least 120 px (or all of it)
            assert found["shows"] >= min(120, found["height"]), f"{where}: {found}"


def test_phone_walkthrough_every_step_its_buttons_choices_and_target_can_be_hit(browser, app_url):
    from kvviz.app import ui

    context, page = opened(browser, app_url, PHONE)
    try:
        for index, step in walked(page, ui.walkthrough_steps(), settle_ms=400):
            buttons = [("kv-walk-back", False), ("kv-walk-next", False), ("kv-walk-close", False)]
            where = f"step {index + 1} ({step.title})"
            assert page.evaluate("() => { const p = document.getElementById('kv-walk'); return p.scrollHeight <= "
                                 "p.clientHeight + 1; }"), f"{where}: the panel scrolls inside"
            assert_hittable(page, buttons + [(step.target, True)], where)
            if step.predict is not None:
                choices = page.locator("#kv-walk-guess label")
                assert choices.count() == 2
                for label in range(2):
                    box = choices.nth(label).bounding_box()
                    assert box and box["y"] >= 0 and box["y"] + box["height"] <= PHONE["height"], (where, box)
                    hit = page.evaluate("([x, y]) => document.elementFromPoint(x, y).closest('#kv-walk-guess') !== null",
                                        [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2])
                    assert hit, f"{where}: choice {label} is covered"
                page.screenshot(path=str(artifacts_dir() / f"phone-walkthrough-step-{index + 1}.png"))
                choices.first.click()
                page.locator("#kv-walk-reveal").get_by_text("stored run").wait_for(timeout=10_000)
                page.wait_for_timeout(300)
                assert_hittable(page, buttons + [("kv-walk-reveal", False)], f"{where}, after the guess")
        assert not page.errors, page.errors
    finally:
        context.close()
