"""Workshop mode in a real browser (Playwright driving Debian's Chromium at /usr/bin/chromium), over
the lab's server with the workshop's routes and a SQLite store in a temporary folder.

One host and three learners (phones, 390x844) run a whole exercise: the host starts a class and
opens the first exercise, each learner joins and predicts, each prediction shows on the board
within a second, the counts are the learners' choices, and after the reveal each learner sees
their own verdict. A saved run opens at /r/<id> with its own results and no model.

Screenshots go to $KVVIZ_TEST_ARTIFACTS (default test-artifacts/): ``workshop-board-1280x800.png``,
``workshop-projector-1280x800.png`` and ``workshop-learner-390x844.png`` are the ones in docs/.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time

import httpx
import pytest

from kvviz.app import ui
from kvviz.app.exercises import EXERCISES, answer_of, stored_results
from kvviz.app.page import views
from kvviz.app.presets import load_precomputed
from kvviz.app.workshop import api
from kvviz.store import database
from kvviz.store.values import MAX_NAME
from tests.page_checks import artifacts_dir, launched_chromium

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
ON_THE_BOARD_S = 1.0


@pytest.fixture(scope="module")
def browser():
    with launched_chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('workshop') / 'workshop.sqlite3'}"
    before = os.environ.get(database.DB_URL_ENV)
    os.environ[database.DB_URL_ENV] = url  # the page's Save run opens the store as app.py's server does
    demo = ui.build_demo(default_max_new_tokens=4)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                app_kwargs=api.launch_app_kwargs(api.Service()), **ui.launch_kwargs())
    try:
        yield demo.local_url.rstrip("/")
    finally:
        demo.close()
        database.close_store(url)
        if before is None:
            os.environ.pop(database.DB_URL_ENV, None)
        else:
            os.environ[database.DB_URL_ENV] = before


@contextlib.contextmanager
def opened(browser, url: str, viewport: dict):
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url, wait_until="domcontentloaded")
    page.errors = errors
    try:
        yield page
    finally:
        context.close()


def board_total(host) -> int:
    return int(host.locator("#focus #total").inner_text())


def test_one_host_and_three_learners_run_a_whole_exercise(browser, server):
    exercise = EXERCISES.exercises[0]
    truth = answer_of(exercise, stored_results(exercise))
    picks = {"Ada": exercise.choices[0], "Bo": exercise.choices[1], "Cy": exercise.choices[0]}
    with opened(browser, f"{server}/workshop", LAPTOP) as host, contextlib.ExitStack() as stack:
        host.click("#make")
        host.wait_for_url("**/workshop/host/*", timeout=30_000)
        code = host.locator("#class-code").inner_text()
        host.locator(f"[data-open='{exercise.key}']").wait_for(timeout=10_000)
        assert host.locator(f"[data-reveal='{exercise.key}']").is_disabled()  # Reveal only after Open
        host.locator(f"[data-open='{exercise.key}']").click()
        host.wait_for_function(f"() => document.querySelector(\"[data-open='{exercise.key}']\").disabled", timeout=10_000)
        learners = {}
        for name in picks:
            learner = stack.enter_context(opened(browser, f"{server}/workshop/class/{code}", PHONE))
            learner.fill("#name", name)
            learner.click("#join button[type=submit]")
            learner.locator(f"#exercise[data-key='{exercise.key}']").wait_for(timeout=10_000)
            learners[name] = learner
        host.wait_for_function("() => document.querySelector('#count').textContent === '3'", timeout=5_000)
        for count, (name, choice) in enumerate(picks.items(), start=1):
            learners[name].locator(f"button[data-value='{choice}']").click()
            clicked = time.perf_counter()
            host.wait_for_function(f"() => document.querySelector('#focus #total').textContent === '{count}'",
                                   timeout=5_000)
            assert time.perf_counter() - clicked <= ON_THE_BOARD_S, f"{name}'s prediction took over a second to show"
            learners[name].locator("#saved").wait_for(timeout=5_000)
        bars = host.locator("#focus .bar").all_inner_texts()
        for choice in exercise.choices:
            label, expected = exercise.choice_label(choice), sum(1 for pick in picks.values() if pick == choice)
            assert any(bar.startswith(label) and bar.rstrip().endswith(str(expected)) for bar in bars), (label, bars)
        host.evaluate("() => window.scrollTo(0, 0)")
        host.screenshot(path=str(artifacts_dir() / "workshop-board-1280x800.png"))
        host.locator(f"[data-reveal='{exercise.key}']").click()
        for name, learner in learners.items():
            verdict = learner.locator("#verdict")
            verdict.wait_for(timeout=10_000)
            assert verdict.inner_text() == ("You were right." if picks[name] == truth else "Not this time.")
            assert exercise.explain[:40] in learner.locator("#reveal").inner_text()
            assert not {"null", "undefined"} & set(learner.locator("#flow-body").inner_text().split())
            assert learner.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")  # no sideways scroll
            assert not learner.errors
        learners["Bo"].screenshot(path=str(artifacts_dir() / "workshop-learner-390x844.png"), full_page=True)
        projector_link = host.locator("#projector").get_attribute("href")
        projector = stack.enter_context(opened(browser, server + projector_link, LAPTOP))
        projector.locator("#focus").wait_for(timeout=10_000)
        assert projector.evaluate("() => parseFloat(getComputedStyle(document.body).fontSize)") >= 24
        projector.wait_for_function("() => document.querySelector('#join-qr').naturalWidth > 0", timeout=10_000)
        projector.screenshot(path=str(artifacts_dir() / "workshop-projector-1280x800.png"))
        assert not host.errors and not projector.errors


def test_a_saved_run_opens_at_its_short_link_with_its_own_results_and_no_model(browser, server):
    payload, _ = views.precomputed_payload(load_precomputed(), "locker", "embedded")
    mark = "Saved for the workshop: 4471"
    payload = {**payload, "results": [{**r, "answer": mark} if r["handoff"] == "text" else r for r in payload["results"]]}
    saved = httpx.post(f"{server}/workshop/api/runs", json={"title": "Locker", "link": "preset=locker&h=receiver,text",
                                                              "results": payload}, timeout=60).json()
    assert len(server + saved["link"]) <= 40
    with opened(browser, server + saved["link"], LAPTOP) as page:
        page.wait_for_function(
            f"() => {{ const box = document.querySelector('#kv-answer-text textarea'); return box && box.value === {mark!r}; }}",
            timeout=60_000)
        assert f"run={saved['id']}" in page.url
        assert not page.errors


def test_save_run_on_the_page_keeps_its_results_under_a_short_link(browser, server):
    with opened(browser, server, LAPTOP) as page:
        page.locator("#kv-answer-receiver textarea").first.wait_for(timeout=60_000)
        page.wait_for_timeout(1500)  # the page's load event
        page.click("#kv-save-run")
        page.wait_for_url("**/r/*", timeout=30_000)
        run_id = page.url.rsplit("/r/", 1)[1]
        kept = httpx.get(f"{server}/workshop/api/runs/{run_id}", timeout=30).json()
        assert "preset=locker" in kept["link"]
        assert {r["handoff"] for r in kept["results"]["results"]} >= {"receiver", "text"}


def test_workshop_hostile_the_host_token_leaves_the_address_bar_and_the_projector_needs_none(browser, server):
    """The host link's token goes to the tab's session storage and leaves the address bar; the projector
    opens with its read-only key, which leaves it too; the model's answers stay hidden on the host's
    board until the reveal (a peek shows them on that screen); a late joiner after the reveal has no
    Predict box; a long word and right-to-left controls break no layout."""
    made = httpx.post(f"{server}/workshop/api/classes", json={"mode": "paced"}, timeout=30).json()
    words = next(e for e in EXERCISES.exercises if e.predict == "words")
    with opened(browser, server + made["host_link"], LAPTOP) as host, contextlib.ExitStack() as stack:
        host.locator(f"[data-open='{words.key}']").wait_for(timeout=30_000)
        assert "#" not in host.url and made["host_token"] not in host.url
        assert made["host_token"] not in host.evaluate("() => location.href")
        host.locator(f"[data-open='{words.key}']").click()
        host.wait_for_function(f"() => document.querySelector('#focus').dataset.key === {words.key!r}", timeout=10_000)
        assert host.locator("#model-hidden").is_visible() and host.locator("#model-answer").count() == 0
        host.click("#peek")
        host.locator("#model-answer").wait_for(timeout=5_000)
        assert "listens on 127.0.0.1 only" in host.locator("#join-warning").inner_text()
        assert "--host 0.0.0.0" in host.locator("#join-warning").inner_text()
        learner = stack.enter_context(opened(browser, f"{server}/workshop/class/{made['code']}", PHONE))
        assert learner.locator("#name").get_attribute("maxlength") == str(MAX_NAME)
        learner.fill("#name", "\u202eW" + "w" * 20)
        learner.click("#join button[type=submit]")
        learner.locator("#answer").fill("Supercalifragilistic" * 4)  # 80 characters, one word
        learner.click("#send")
        learner.locator("#saved").wait_for(timeout=10_000)
        host.wait_for_function("() => document.querySelector('#focus #total').textContent === '1'", timeout=10_000)
        projector_link = host.locator("#projector").get_attribute("href")
        assert made["host_token"] not in projector_link
        projector = stack.enter_context(opened(browser, server + projector_link, LAPTOP))
        projector.locator("#focus").wait_for(timeout=10_000)
        assert "#" not in projector.url and projector.locator("#names").count() == 0
        assert projector.locator("#model-hidden").is_visible()
        for page in (host, projector):
            assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth"), page.url
        host.locator(f"[data-reveal='{words.key}']").click()
        projector.locator("#model-answer").wait_for(timeout=10_000)
        late = stack.enter_context(opened(browser, f"{server}/workshop/class/{made['code']}", PHONE))
        late.fill("#name", "Late")
        late.click("#join button[type=submit]")
        late.locator("#closed").wait_for(timeout=10_000)
        assert late.locator("#answer").count() == 0 and late.locator("#send").count() == 0
        host.wait_for_function("() => document.querySelectorAll('#names bdi').length === 2", timeout=10_000)
        learner_names = host.locator("#names bdi").all_inner_texts()
        assert learner_names == ["W" + "w" * 20, "Late"]  # the override is gone, each name isolated
        assert not host.errors and not projector.errors and not learner.errors and not late.errors
