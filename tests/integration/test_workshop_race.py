"""Races on the workshop's store through the real server, on SQLite and on a throwaway PostgreSQL
server: requests that arrive at once must not lose an acknowledged change nor overshoot a cap.

* the host's changes: 11 "open exercise" requests at once on one class, 10 trials; every change the
  server acknowledged (200) is on the board afterwards (110 of 110);
* the caps: 11 joins at once into a class five short of its learner cap, 11 creates at once five
  short of the class cap, 10 trials each: exactly five admitted, the cap never exceeded;
* two app servers (``python app.py`` processes) on one store: the same host changes split across
  them (PostgreSQL: nothing lost; SQLite: nothing lost, the same discipline across processes) and
  a cap race at each real cap (500 learners, 200 classes), and one session's per-minute prediction
  limit (40 attempts at once: exactly 30 counted).

Each class is made from an address of its own (``X-Forwarded-For`` from 127.0.0.1, a proxy uvicorn
trusts), so that the per-client allowance (guard.Allowance) does not stand in for the caps.

Before this suite (issue #41) the store read a row or a count and then wrote: on PostgreSQL no row
was locked, on SQLite the writer lock was per process and began at the first write.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import httpx
import pytest

from kvviz.app.exercises import EXERCISES
from kvviz.app.workshop import api
from kvviz.core.policy import LOCAL_WORKSHOP
from kvviz.store import database
from kvviz.store.classes import Workshop
from tests.workshop_fixtures import db_url, demo, serving  # noqa: F401 (fixtures)
from tests.workshop_servers import app_servers

AT_ONCE = 11
TRIALS = 10
SHORT = 5  # a cap race starts this many short of the cap
CAPS = replace(LOCAL_WORKSHOP, max_classes=40, max_learners=20)
KEYS = [exercise.key for exercise in EXERCISES.exercises]
assert len(KEYS) >= AT_ONCE


@pytest.fixture(scope="module")
def server(demo, db_url):
    """One server over the store, with small caps so that a cap race takes a few requests."""
    with serving(demo, api.Service(db_url, caps=CAPS)) as url:
        yield url
    database.close_store(db_url)


def at_once(calls) -> list:
    """Run every call in a thread of its own, released together; their results in order."""
    results, gate = [None] * len(calls), threading.Barrier(len(calls))

    def run(index):
        gate.wait()
        results[index] = calls[index]()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def post(url: str, path: str, body: dict, headers: dict | None = None, forwarded: str | None = None):
    extra = {"X-Forwarded-For": forwarded} if forwarded else {}
    return lambda: httpx.post(url + path, json=body, headers={**(headers or {}), **extra}, timeout=60)


def lost_host_changes(urls: list[str]) -> tuple[int, int]:
    """11 host changes at once on one class (spread over ``urls``), ``TRIALS`` times: (acknowledged, lost)."""
    acknowledged = lost = 0
    for trial in range(TRIALS):  # each class from an address of its own (behind the trusted proxy 127.0.0.1)
        made = httpx.post(urls[0] + "/workshop/api/classes", json={"mode": "paced"}, timeout=60,
                          headers={"X-Forwarded-For": f"192.0.2.{trial + 1}"}).json()
        host = {"X-Host-Token": made["host_token"], "X-Host-Session": "the-host-page"}
        route = f"/workshop/api/classes/{made['code']}/host"
        assert httpx.post(urls[0] + route, json={}, headers=host, timeout=60).status_code == 200
        answers = at_once([post(urls[index % len(urls)], route, {"open": KEYS[index]}, host) for index in range(AT_ONCE)])
        done = {KEYS[index] for index, answer in enumerate(answers) if answer.status_code == 200}
        board = httpx.get(urls[0] + f"/workshop/api/classes/{made['code']}/board", headers=host, timeout=60).json()
        acknowledged += len(done)
        lost += len(done - set(board["open"]))
    return acknowledged, lost


def test_workshop_race_every_acknowledged_host_change_stays(server):
    acknowledged, lost = lost_host_changes([server])
    assert (acknowledged, lost) == (AT_ONCE * TRIALS, 0), f"{lost} of {acknowledged} acknowledged host changes lost"


def test_workshop_race_joins_and_creates_at_once_never_pass_the_caps(server, db_url):
    shop = Workshop(database.open_store(db_url), CAPS)
    admitted_joins, admitted_creates = [], []
    for trial in range(TRIALS):
        made = shop.create_class(KEYS)
        for index in range(CAPS.max_learners - SHORT):
            shop.join(made.code, f"Seated {index}")
        answers = at_once([post(server, "/workshop/api/join", {"code": made.code, "name": f"Late {trial} {index}"})
                           for index in range(AT_ONCE)])
        admitted_joins.append(sum(answer.status_code == 200 for answer in answers))
        assert len(shop.board(made.code, made.host_token)["names"]) == CAPS.max_learners
    for trial in range(TRIALS):
        with database.open_store(db_url).connect() as connection:
            alive = connection.exec_driver_sql("SELECT count(*) FROM classes").scalar()
        for _ in range(CAPS.max_classes - SHORT - alive):
            shop.create_class(KEYS)
        answers = at_once([post(server, "/workshop/api/classes", {"mode": "paced"}, forwarded=f"198.51.100.{trial * AT_ONCE + index}")
                           for index in range(AT_ONCE)])
        admitted_creates.append(sum(answer.status_code == 200 for answer in answers))
        with database.open_store(db_url).connect() as connection:
            assert connection.exec_driver_sql("SELECT count(*) FROM classes").scalar() == CAPS.max_classes
        with database.open_store(db_url).begin() as connection:  # room for the next trial
            connection.exec_driver_sql("DELETE FROM classes WHERE id IN (SELECT id FROM classes ORDER BY id DESC LIMIT 20)")
    assert admitted_joins == [SHORT] * TRIALS, admitted_joins
    assert admitted_creates == [SHORT] * TRIALS, admitted_creates


def test_workshop_race_two_servers_on_one_store_lose_nothing_and_keep_the_caps(db_url):
    with app_servers(db_url, 2) as servers:
        urls = [server.url for server in servers]
        acknowledged, lost = lost_host_changes(urls)
        assert (acknowledged, lost) == (AT_ONCE * TRIALS, 0), f"{lost} of {acknowledged} acknowledged host changes lost"
        shop = Workshop(database.open_store(db_url), LOCAL_WORKSHOP)
        made = shop.create_class(KEYS)
        for index in range(LOCAL_WORKSHOP.max_learners - SHORT):
            shop.join(made.code, f"Seated {index}")
        answers = at_once([post(urls[index % 2], "/workshop/api/join", {"code": made.code, "name": f"Late {index}"})
                           for index in range(AT_ONCE)])
        assert sum(answer.status_code == 200 for answer in answers) == SHORT
        assert len(shop.board(made.code, made.host_token)["names"]) == LOCAL_WORKSHOP.max_learners
        # one session's per-minute prediction limit holds across both servers
        paced = shop.create_class(KEYS, mode="self")
        seat = shop.join(paced.code, "Quick")
        attempts = LOCAL_WORKSHOP.predictions_per_minute + 10
        answers = at_once([post(urls[index % 2], "/workshop/api/predict", {"exercise": KEYS[0], "value": "right"},
                                {"X-Learner-Token": seat.token}) for index in range(attempts)])
        assert sum(answer.status_code == 429 for answer in answers) == attempts - LOCAL_WORKSHOP.predictions_per_minute
        assert sum(answer.status_code == 200 for answer in answers) == 1
        with database.open_store(db_url).connect() as connection:
            alive = connection.exec_driver_sql("SELECT count(*) FROM classes").scalar()
        for _ in range(LOCAL_WORKSHOP.max_classes - SHORT - alive):
            shop.create_class(KEYS)
        answers = at_once([post(urls[index % 2], "/workshop/api/classes", {}, forwarded=f"198.51.100.{index + 1}")
                           for index in range(AT_ONCE)])
        assert sum(answer.status_code == 200 for answer in answers) == SHORT
        with database.open_store(db_url).connect() as connection:
            assert connection.exec_driver_sql("SELECT count(*) FROM classes").scalar() == LOCAL_WORKSHOP.max_classes
    database.close_store(db_url)
