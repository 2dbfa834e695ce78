"""The lab page's *Save run* (``kvviz.app.page.saved``): it keeps a run in the store under a short id,
and one address may save only as many runs a while as the workshop's route allows it; another
address is not held back by it, and a refusal loses nothing saved before."""

from __future__ import annotations

import dataclasses

import pytest

from kvviz.app.page import saved
from kvviz.core import policy
from kvviz.store import database

RESULTS = {"results": [{"handoff": "receiver", "answer": "4471"}]}


@pytest.fixture()
def store_url(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'saved.sqlite3'}"
    monkeypatch.setenv(database.DB_URL_ENV, url)
    monkeypatch.setattr(policy, "LOCAL_WORKSHOP", dataclasses.replace(policy.LOCAL_WORKSHOP, saves_per_client="2/minute"))
    saved.allowance.cache_clear()
    yield url
    saved.allowance.cache_clear()
    database.close_store(url)


def test_one_address_saves_up_to_its_allowance_then_gets_one_line_and_loses_nothing(store_url):
    kept = [saved.save(RESULTS, "preset=locker", "run", "10.0.0.1") for _ in range(2)]
    assert all(update["saved_link"].startswith("/r/") for update in kept)
    refused = saved.save(RESULTS, "preset=locker", "run", "10.0.0.1")
    assert refused["saved_link"] == ""
    assert refused["status"].startswith("Too many saved runs from your address (at most 2 per 1 minute)")
    for update in kept:  # what was saved before the refusal is still there
        run_id = update["saved_link"].removeprefix("/r/")
        assert saved.store().get(run_id)["results"] == RESULTS
    assert saved.save(RESULTS, "preset=locker", "run", "10.0.0.2")["saved_link"].startswith("/r/")


def test_nothing_to_save_takes_none_of_the_allowance(store_url):
    for _ in range(5):
        assert saved.save({}, "", "run", "10.0.0.3")["status"].startswith("Nothing to save yet")
    assert saved.save(RESULTS, "", "run", "10.0.0.3")["saved_link"].startswith("/r/")
