"""What crossed and permalinks in a real browser (issue 22): Playwright driving Debian's Chromium.

What crossed opened after a live run records what it shows then (issue 42; the embedded pair runs).

Hovering an answer token in the What crossed tab lights the sent tokens that the stored attention
says (the precomputed locker preset: no model runs); a permalink restores every field of the page,
and "Copy link" puts the same state back in the address bar. The token view's screenshot on the
locker preset is ``tokens-locker.png`` in $KVVIZ_TEST_ARTIFACTS (docs/tokens.png is a copy), and Compare
two's on the fuji preset ``compare.png`` (docs/compare.png).
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

import pytest

from kvviz.app.page import links, spec
from kvviz.app.presets import load_precomputed, preset
from tests.conftest import served_on_loopback
from tests.integration.test_browser import LAPTOP, RUN_TIMEOUT_MS, browser  # noqa: F401 (the browser fixture)
from tests.page_checks import artifacts_dir

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def app_url():
    from kvviz.app import ui

    with served_on_loopback(ui.build_demo()) as url:
        yield url


@pytest.fixture()
def page(browser):  # noqa: F811
    context = browser.new_context(viewport=LAPTOP)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.errors = errors
    yield page
    context.close()


def stored_result(key: str, handoff: str) -> dict:
    results = load_precomputed()["presets"][key]["results"]
    result = next(r for r in results if r["handoff"] == handoff)
    if not result.get("token_attention"):
        pytest.fail("assets/precomputed/presets.json holds no token_attention: run python scripts/precompute_presets.py")
    return result


def expected_masses(data: dict, token: int) -> list[float]:
    """The sent tokens' attention from answer token ``token``, summed over every layer and head."""
    sums = [0.0] * len(data["sent_tokens"])
    for layer in data["attention"][token]:
        for head in layer:
            for s, value in enumerate(head):
                sums[s] += value
    return sums


def test_hovering_an_answer_token_lights_the_sent_tokens_its_stored_attention_says(page, app_url):
    data = stored_result("locker", "kvcomm")["token_attention"]
    page.goto(f"{app_url}/?preset=locker&tab=tokens&column=kvcomm", wait_until="domcontentloaded")
    view = page.locator('#kv-tokens .kv-tv[data-handoff="kvcomm"]')
    view.wait_for(timeout=60_000)
    # the first digit the answer writes: the token that must read the code from the context
    token = next(i for i, text in enumerate(data["answer_tokens"][: data["captured"]]) if text.strip().isdigit())
    view.locator(f'.kv-tv-ans[data-i="{token}"]').hover()
    page.wait_for_timeout(200)
    chips = view.locator(".kv-tv-sent-tok")
    shown = [float(chips.nth(s).get_attribute("data-mass")) for s in range(chips.count())]
    masses = expected_masses(data, token)
    assert shown == pytest.approx(masses, abs=2e-3)
    top = max(masses[1:])  # the sink (first sent token) is left out by default
    lit = [s for s in range(chips.count()) if "kv-tv-lit" in (chips.nth(s).get_attribute("class") or "")]
    assert lit == [s for s in range(1, len(masses)) if masses[s] >= 0.5 * top]
    # clicking locks it: hovering another token changes nothing
    view.locator(f'.kv-tv-ans[data-i="{token}"]').click()
    view.locator('.kv-tv-ans[data-i="0"]').hover()
    assert view.get_attribute("data-shown") == str(token)
    # leaving out every layer but the sent ones changes the sums to theirs
    view.locator('.kv-tv-pick[data-pick="sent"]').click()
    sent_only = [sum(data["attention"][token][layer][head][s] for layer in data["sent_layers"]
                     for head in range(data["heads"])) for s in range(len(masses))]
    shown = [float(chips.nth(s).get_attribute("data-mass")) for s in range(chips.count())]
    assert shown == pytest.approx(sent_only, abs=2e-3)
    view.locator('.kv-tv-pick[data-pick="all"]').click()
    page.locator("#kv-tokens").screenshot(path=str(artifacts_dir() / "tokens-locker.png"))
    assert not page.errors


def test_a_permalink_restores_every_field_and_copy_link_gives_it_back(page, app_url):
    picked = preset("fuji")
    link = ("preset=fuji&h=receiver,kvcomm,skyline&expected=Japan%3B+Nippon&pair=embedded&max_new_tokens=7&sample=1"
            "&temperature=0.9&seed=3&o.kvcomm.ratio=0.35&o.kvcomm.strategy=prior&tab=lens")
    page.goto(f"{app_url}/?{link}", wait_until="domcontentloaded")
    page.locator("#kv-plot-lens .main-svg").first.wait_for(timeout=60_000)
    page.wait_for_timeout(500)
    assert page.locator("#kv-query textarea").input_value() == picked.query
    assert page.locator("#kv-context textarea").input_value() == (picked.context or "")
    assert page.locator("#kv-expected textarea, #kv-expected input").first.input_value() == "Japan; Nippon"
    ticked = page.eval_on_selector_all("#kv-handoffs input[type=checkbox]", "els => els.filter(e => e.checked).map(e => e.value || e.name)")
    labels = page.eval_on_selector_all("#kv-handoffs label", "els => els.filter(e => e.querySelector('input').checked)"
                                                            ".map(e => e.textContent.trim())")
    assert sorted(labels) == sorted(["Receiver", "KVComm", "Skyline"]), (ticked, labels)
    assert page.locator("#kv-inside [role=tab][aria-selected=true]").inner_text().strip() == "Depth"
    # the settings live in the closed sidebar: their inputs hold the link's values
    number = "input[type=number]"
    assert float(page.locator(f"#kv-settings {number}").first.input_value()) == 7  # max new tokens
    assert page.locator("#kv-settings input[type=checkbox]").first.is_checked()  # sample
    assert float(page.locator(f"#kv-opt-kvcomm-ratio {number}").input_value()) == pytest.approx(0.35)
    assert page.locator("#kv-opt-kvcomm-strategy input").input_value() == "prior"
    page.locator("#kv-copy-link").click()
    page.wait_for_function("() => location.search.includes('seed=')", timeout=30_000)
    given = dict(parse_qsl(link))
    copied = dict(parse_qsl(urlsplit(page.url).query))
    for name in ("preset", "h", "expected", "pair", "max_new_tokens", "sample", "temperature", "seed",
                 "o.kvcomm.ratio", "o.kvcomm.strategy", "tab"):
        assert copied.get(name) == given[name], name
    assert set(copied) <= set(links.LINK_FIELDS) | set(links.option_link_names(spec.page_options()))
    assert not page.errors


def test_the_answer_is_coloured_by_its_change_against_the_control_as_stored(page, app_url):
    result = stored_result("locker", "kvcomm")
    change = result.get("token_change") or {}
    if change.get("control") != "kvcomm_control":
        pytest.fail("the locker preset holds no KVComm token_change: run python scripts/precompute_presets.py")
    page.goto(f"{app_url}/?preset=locker&tab=tokens&column=kvcomm", wait_until="domcontentloaded")
    view = page.locator('#kv-tokens .kv-tv[data-handoff="kvcomm"]')
    view.wait_for(timeout=60_000)
    chips = view.locator(".kv-tv-chg")
    assert chips.count() == len(change["change"])
    shown = [float(chips.nth(i).get_attribute("data-change")) for i in range(chips.count())]
    assert shown == pytest.approx(change["change"], abs=1e-3)
    top = max(range(len(shown)), key=lambda i: abs(shown[i]))
    assert "KVComm control" in chips.nth(top).get_attribute("title")
    assert "vs KVComm control" in view.inner_text()
    assert not page.errors


@pytest.mark.real_model
def test_what_crossed_opened_after_a_live_run_records_it_then_with_the_same_answers(page, app_url, embedded_pair):
    """A live run on the Layers tab records nothing of what crossed (issue 42); opening What crossed
    records it then: the tab says it is recording, then draws KVComm's token view and its scores
    against its control, and says they were recorded when it opened, with the answers unchanged."""
    page.goto(f"{app_url}/?preset=locker&h=receiver,kvcomm,kvcomm_control&max_new_tokens=6", wait_until="domcontentloaded")
    page.locator("#kv-answer-kvcomm textarea").first.wait_for(timeout=60_000)
    page.wait_for_timeout(1000)  # the link's state is on the page
    page.locator("#kv-run").click()
    page.get_by_text("Live run finished").wait_for(timeout=RUN_TIMEOUT_MS)
    page.wait_for_function("() => document.querySelector('#kv-run').innerText.trim() === 'Run live'", timeout=60_000)
    answers = {name: page.locator(f"#kv-answer-{name} textarea").first.input_value() for name in ("kvcomm", "kvcomm_control")}
    page.locator("#kv-inside").get_by_role("tab", name="What crossed", exact=True).click()
    note = page.locator("#kv-recorded-tokens")
    note.get_by_text("Recording the attention rows").wait_for(timeout=30_000)  # the tab says so while it records
    note.get_by_text("Recorded when this tab opened").wait_for(timeout=RUN_TIMEOUT_MS)
    assert "answered differently" not in note.inner_text()  # greedy: the same answers, so every column's is shown
    view = page.locator('#kv-tokens .kv-tv[data-handoff="kvcomm"]')
    view.wait_for(timeout=30_000)
    assert view.locator(".kv-tv-ans").count() >= 1 and view.locator(".kv-tv-sent-tok").count() >= 1
    assert "vs KVComm control" in view.inner_text()  # the scores against the control were recorded too
    assert {name: page.locator(f"#kv-answer-{name} textarea").first.input_value() for name in answers} == answers
    page.locator("#kv-inside").screenshot(path=str(artifacts_dir() / "tokens-recorded-on-open.png"))
    assert not page.errors


def test_compare_two_shows_a_column_beside_its_control_then_beside_the_run_before(page, app_url):
    page.goto(f"{app_url}/?preset=locker&tab=compare", wait_until="domcontentloaded")
    diff = page.locator("#kv-compare .kv-cmp-view")
    diff.wait_for(timeout=60_000)
    assert "same run" in diff.inner_text()
    page.locator("#kv-plot-compare .main-svg").first.wait_for(timeout=30_000)
    # the opening preset is run 1 of the session, another preset run 2: the tab shows it, and "the run
    # before" compares across the two
    page.locator("#kv-presets input").click()
    page.get_by_role("option", name=preset("fuji").label).click()
    page.wait_for_function("() => (document.querySelector('#kv-compare-a input') || {}).value?.startsWith('run 2')",
                           timeout=30_000)
    page.locator("#kv-compare-previous").click()
    page.wait_for_function("() => (document.querySelector('#kv-compare-b input') || {}).value?.startsWith('run 1')",
                           timeout=30_000)
    assert "the question differs" in page.locator("#kv-compare .kv-cmp-view").inner_text()
    page.locator("#kv-compare-control").click()
    page.wait_for_function("() => (document.querySelector('#kv-compare-b input') || {}).value?.startsWith('run 2')",
                           timeout=30_000)
    page.locator("#kv-inside").screenshot(path=str(artifacts_dir() / "compare.png"))
    assert not page.errors
