"""Floods through the real server, on SQLite and on a throwaway PostgreSQL server: anonymous
requests in bulk cannot lock a real host out of making a class or saving a run, and the store stays
within its caps, bytes included.

The clients are told apart as a proxy in front of the server would tell them (``X-Forwarded-For``
from 127.0.0.1, which uvicorn trusts by default, ``FORWARDED_ALLOW_IPS``); a client that is not a
trusted proxy cannot choose its address that way.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import httpx
from sqlalchemy import text

from kvviz.app.workshop import api
from kvviz.core.policy import LOCAL_WORKSHOP
from kvviz.store import database
from tests.workshop_fixtures import db_url, demo, serving  # noqa: F401 (fixtures)

FLOOD = 1000  # requests: half creates, half saves
SENDERS = 4  # the flood's connections at once
HOST, FLOODER = "198.51.100.20", "203.0.113.9"
RESULTS = {"results": [{"handoff": "text", "answer": "x" * 8000}]}  # a small run: about 8 kB
# small caps, so that the flood from many addresses fills them
FULL = replace(LOCAL_WORKSHOP, max_classes=20, idle_class_minutes=0.0, max_saved_runs=40, max_saved_bytes=200_000)


@contextlib.contextmanager
def flooded(demo, db_url: str, caps):
    """The server over a store with ``caps``, emptied afterwards for the next test."""
    with serving(demo, api.Service(db_url, caps=caps)) as url:
        yield url
    with database.open_store(db_url).begin() as connection:
        for table in ("predictions", "learners", "saved_runs", "classes"):
            connection.execute(text(f"DELETE FROM {table}"))
    database.close_store(db_url)


def as_client(address: str) -> dict:
    return {"X-Forwarded-For": address}


def flood(url: str, addresses) -> dict:
    """``FLOOD`` creates and saves at once over ``SENDERS`` connections; the count of each status."""
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    plan = list(zip(range(FLOOD), addresses))

    def send(chunk):
        with httpx.Client(base_url=url, timeout=60) as http:
            for index, address in chunk:
                if index % 2:
                    answer = http.post("/workshop/api/runs", json={"title": "flood", "results": RESULTS}, headers=as_client(address))
                else:
                    answer = http.post("/workshop/api/classes", json={}, headers=as_client(address))
                assert answer.status_code in (200, 429), answer.text
                with lock:
                    statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1

    with ThreadPoolExecutor(SENDERS) as pool:
        list(pool.map(send, [plan[start::SENDERS] for start in range(SENDERS)]))
    return statuses


def host_makes_a_class_and_saves_a_run(url: str) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        made = http.post("/workshop/api/classes", json={"mode": "paced"}, headers=as_client(HOST))
        assert made.status_code == 200, made.text
        saved = http.post("/workshop/api/runs", json={"title": "mine", "results": RESULTS}, headers=as_client(HOST))
        assert saved.status_code == 200, saved.text
        board = http.get(f"/workshop/api/classes/{made.json()['code']}/board", headers={"X-Host-Token": made.json()["host_token"]})
        assert board.status_code == 200 and http.get(f"/workshop/api/runs/{saved.json()['id']}").status_code == 200


def test_workshop_flood_from_one_client_leaves_a_host_able_to_make_a_class_and_save_a_run(demo, db_url):
    caps = LOCAL_WORKSHOP
    with flooded(demo, db_url, caps) as url:
        with httpx.Client(base_url=url, timeout=60) as http:  # refused for its form: none of the host's allowance
            for _ in range(20):
                assert http.post("/workshop/api/classes", content=b"{}", headers=as_client(HOST)).status_code == 415
                assert http.post("/workshop/api/classes", content=b"{", headers={**as_client(HOST),
                                                                                   "Content-Type": "application/json"}).status_code == 400
        times: list[float] = []
        done = threading.Event()

        def host_at_work():  # the real host polls its board during the flood, as its page does
            with httpx.Client(base_url=url, timeout=60) as http:
                made = http.post("/workshop/api/classes", json={}, headers=as_client(HOST)).json()
                while not done.is_set():
                    began = time.perf_counter()
                    assert http.get(f"/workshop/api/classes/{made['code']}/board",
                                    headers={"X-Host-Token": made["host_token"]}).status_code == 200
                    times.append(time.perf_counter() - began)
                    time.sleep(0.05)

        watcher = threading.Thread(target=host_at_work)
        watcher.start()
        try:
            statuses = flood(url, itertools.repeat(FLOODER))
        finally:
            done.set()
            watcher.join()
        host_makes_a_class_and_saves_a_run(url)
        with database.open_store(db_url).connect() as connection:
            classes = connection.execute(text("SELECT count(*) FROM classes")).scalar()
            runs = connection.execute(text("SELECT count(*) FROM saved_runs")).scalar()
    creates_per_minute = int(caps.creates_per_client.split("/")[0])
    saves_per_minute = int(caps.saves_per_client.split("/")[0])
    assert statuses[200] == creates_per_minute + saves_per_minute and statuses[429] == FLOOD - statuses[200]
    assert (classes, runs) == (creates_per_minute + 2, saves_per_minute + 1)  # the flood's, the host's two and one
    print(f"\nthe host's board during a flood of {FLOOD}: median {statistics.median(times) * 1000:.0f} ms, "
          f"max {max(times) * 1000:.0f} ms over {len(times)} polls (a shared machine)")


def test_workshop_flood_from_many_addresses_fills_nothing_a_host_needs_and_keeps_the_byte_cap(demo, db_url):
    with flooded(demo, db_url, FULL) as url:
        statuses = flood(url, (f"10.{n // 65536}.{n // 256 % 256}.{n % 256}" for n in itertools.count(1)))
        host_makes_a_class_and_saves_a_run(url)
        engine = database.open_store(db_url)
        with engine.connect() as connection:
            classes = connection.execute(text("SELECT count(*) FROM classes")).scalar()
            runs, held = connection.execute(text("SELECT count(*), sum(size) FROM saved_runs")).one()
        if engine.dialect.name == "sqlite":
            size_on_disk = os.path.getsize(engine.url.database)
    assert statuses.get(429, 0) == 0  # each address stayed within its allowance: the caps made room instead
    assert classes == FULL.max_classes and runs <= FULL.max_saved_runs and held <= FULL.max_saved_bytes
    if engine.dialect.name == "sqlite":  # the file holds the runs (at most the byte cap) and a few pages more
        assert size_on_disk <= 2 * FULL.max_saved_bytes + 1_000_000, size_on_disk


def test_workshop_flood_a_client_that_is_no_trusted_proxy_cannot_choose_its_address(demo, db_url):
    caps = LOCAL_WORKSHOP
    creates_per_minute = int(caps.creates_per_client.split("/")[0])
    with flooded(demo, db_url, caps) as url:
        port = int(url.rsplit(":", 1)[1])
        # 127.0.0.2 is this machine too, but not a proxy uvicorn trusts: its X-Forwarded-For is ignored
        transport = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", transport=transport, timeout=60) as http:
            answers = [http.post("/workshop/api/classes", json={}, headers=as_client(f"10.9.9.{n}")).status_code
                       for n in range(creates_per_minute + 3)]
    assert answers == [200] * creates_per_minute + [429] * 3
