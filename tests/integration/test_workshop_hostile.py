"""Hostile requests through the real server, on SQLite and on a throwaway PostgreSQL server: every bad
request gets a 4xx and one line (never a 500, never what was sent echoed back, never a server path);
text is cleaned by kvviz's one rule or refused; CSV cells that would run as formulas are quoted;
requests from another site make nothing; a 100 MB body is refused before it is read; a read-only or
full store answers 503 in one line while the rest of the app serves.
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import select
import socket
import time

import httpx
import psycopg
import pytest
from sqlalchemy import event, text

from kvviz.app.exercises import EXERCISES
from kvviz.app.workshop import api, guard
from kvviz.store import database
from tests.workshop_fixtures import db_url, demo, serving  # noqa: F401 (fixtures)

WORDS = next(e for e in EXERCISES.exercises if e.predict == "words").key
CHOICE = next(e for e in EXERCISES.exercises if e.predict == "choice")
HUNDRED_MB = 100_000_000


@pytest.fixture()
def server(demo, db_url):
    with serving(demo, api.Service(db_url)) as url:
        yield url
    database.close_store(db_url)


def one_line(answer: httpx.Response, status: int | None = None, *hidden: str) -> str:
    """The refusal's line, checked: a 4xx (or ``status``), JSON with one line, no server path."""
    assert 400 <= answer.status_code < 500 if status is None else answer.status_code == status, (answer.status_code, answer.text[:300])
    line = answer.json()["error"]
    assert line and "\n" not in line and len(answer.text) < 600, answer.text[:300]
    for secret in ("/tmp", "/work", "/root", "sqlite:", "postgresql", "Traceback", *hidden):
        assert secret not in answer.text, (secret, answer.text)
    return line


def raw(url: str, path: str, body: bytes, content_type: str = "application/json") -> httpx.Response:
    return httpx.post(url + path, content=body, headers={"Content-Type": content_type}, timeout=60)


def test_workshop_hostile_requests_each_get_one_line_and_a_4xx(server):
    with httpx.Client(base_url=server, timeout=60) as http:
        made = http.post("/workshop/api/classes", json={}).json()
        seat = http.post("/workshop/api/join", json={"code": made["code"], "name": "Ada"}).json()
    learner, host = {"X-Learner-Token": seat["token"]}, {"X-Host-Token": made["host_token"], "X-Host-Session": "p"}
    code = made["code"]
    assert one_line(httpx.post(server + "/workshop/api/classes"), 415) == "Send the body as JSON (Content-Type: application/json)."
    for path in ("/workshop/api/classes", "/workshop/api/join", "/workshop/api/predict", "/workshop/api/runs",
                 f"/workshop/api/classes/{code}/host", f"/workshop/api/classes/{code}/pins"):
        one_line(httpx.post(server + path, content=b"mode=self", headers={"Content-Type": "application/x-www-form-urlencoded"}), 415)
        one_line(raw(server, path, b'{"mode": "self"'), 400)  # broken JSON
        for body in (b"[]", b'"text"', b"3", b"null"):
            one_line(raw(server, path, body), 400)
    echo = "SECRET-ECHO-" * 1500  # 18 kB: over the body limit
    one_line(raw(server, "/workshop/api/join", echo.encode(), "text/plain"), 413, "SECRET-ECHO")
    one_line(raw(server, "/workshop/api/join", ('{"code": "' + echo[:9000] + '"}').encode()), 400, "SECRET-ECHO")
    one_line(httpx.post(server + "/workshop/api/join", json={"code": code, "name": "x" * 500}), 400)
    assert "(this one has" not in one_line(httpx.post(server + "/workshop/api/join", json={"code": code, "name": "y" * 500}))
    assert "500 characters" in one_line(httpx.post(server + "/workshop/api/join", json={"code": code, "name": "y" * 500}))
    one_line(httpx.post(server + "/workshop/api/join", json={"code": 7, "name": "Bo"}), 400)
    one_line(httpx.post(server + "/workshop/api/join", json={"code": code, "name": "Bo", "admin": True}), 400)
    one_line(httpx.post(server + "/workshop/api/classes", json={"mode": ["self"]}), 400)
    one_line(httpx.post(server + "/workshop/api/predict", json={"exercise": CHOICE.key, "value": "maybe"}, headers=learner), 400)
    one_line(httpx.post(server + f"/workshop/api/classes/{code}/host", json={"reveal": CHOICE.key}, headers=host), 409)
    one_line(httpx.post(server + f"/workshop/api/classes/{code}/host", json={"open": "nine"}, headers=host), 404)
    one_line(httpx.get(server + "/workshop/api/nothing-here"), 404)
    one_line(httpx.get(server + "/workshop/api/join"), 405)
    one_line(httpx.get(server + "/workshop/api/classes/AB%0D%0ASet-Cookie:%20x/export.csv", headers=host))
    one_line(httpx.get(server + f"/workshop/api/classes/{code}/board", headers={"X-Host-Token": "wrong"}), 403)
    one_line(httpx.get(server + "/r/" + "z" * 40), 400)
    one_line(httpx.get(server + "/workshop/api/runs/nothere"), 404)
    assert httpx.get(server + f"/workshop/api/classes/{code}/board", headers=host).status_code == 200  # still serving


def test_workshop_hostile_lone_surrogates_are_refused_in_one_line_everywhere(server):
    with httpx.Client(base_url=server, timeout=60) as http:
        made = http.post("/workshop/api/classes", json={}).json()
        seat = http.post("/workshop/api/join", json={"code": made["code"], "name": "Ada"}).json()
    learner = {"X-Learner-Token": seat["token"], "Content-Type": "application/json"}
    bodies = [("/workshop/api/join", '{"code": "%s", "name": "A\\ud800"}' % made["code"], {}),
              ("/workshop/api/join", '{"code": "\\udfff", "name": "Bo"}', {}),
              ("/workshop/api/predict", '{"exercise": "%s", "value": "\\ud83d"}' % WORDS, learner),
              ("/workshop/api/runs", '{"title": "\\ud800", "results": {}}', {}),
              ("/workshop/api/runs", '{"link": "q=\\ud800", "results": {}}', {}),
              ("/workshop/api/runs", '{"results": {"answer": "\\udc00"}}', {})]
    for path, body, headers in bodies:
        line = one_line(httpx.post(server + path, content=body.encode(), headers={"Content-Type": "application/json", **headers}), 400)
        assert "surrogate" in line, line


def test_workshop_hostile_text_is_cleaned_and_formula_cells_are_quoted_in_the_csv(server):
    with httpx.Client(base_url=server, timeout=60) as http:
        made = http.post("/workshop/api/classes", json={"mode": "self"}).json()
        seat = http.post("/workshop/api/join", json={"code": f" {made['code'].lower()}\u202e\x00", "name": "Ev\x00e\u202e\u2066"}).json()
        assert seat["name"] == "Eve"
        answers = ['=HYPERLINK("http://x.example/?"&A1,"click")', "exe\u202e.txt\x00", "\tlooks like a tab"]
        headers = {"X-Learner-Token": seat["token"]}
        for index, answer in enumerate(answers):
            other = http.post("/workshop/api/join", json={"code": made["code"], "name": f"Learner {index}"}).json()
            assert http.post("/workshop/api/predict", json={"exercise": WORDS, "value": answer},
                             headers={"X-Learner-Token": other["token"]}).status_code == 200
        assert http.get("/workshop/api/me", headers=headers).json()["name"] == "Eve"
        export = http.get(f"/workshop/api/classes/{made['code']}/export.csv", headers={"X-Host-Token": made["host_token"]})
        saved = http.post("/workshop/api/runs", json={"title": "Ti\u202etle\x00", "link": "preset=locker\x00", "results": {}}).json()
        kept = http.get(f"/workshop/api/runs/{saved['id']}").json()
    cells = [row["prediction"] for row in csv.DictReader(io.StringIO(export.text))]
    assert cells == ["'=HYPERLINK(\"http://x.example/?\"&A1,\"click\")", "exe.txt", "looks like a tab"]
    assert export.headers["content-disposition"] == f'attachment; filename="kvviz-class-{made["code"]}.csv"'
    assert (kept["title"], kept["link"]) == ("Title", "preset=locker")


def classes_in(db_url: str) -> int:
    with database.open_store(db_url).connect() as connection:
        return connection.execute(text("SELECT count(*) FROM classes")).scalar()


def test_workshop_hostile_a_page_on_another_site_makes_no_class(server, db_url):
    evil, before = {"Origin": "http://evil.example"}, classes_in(db_url)
    # what fetch(..., {mode: "no-cors"}) can send: a "simple" body, no JSON content type
    assert one_line(httpx.post(server + "/workshop/api/classes", content=b"{}", headers={**evil, "Content-Type": "text/plain"}), 403)
    assert one_line(httpx.post(server + "/workshop/api/classes", json={}, headers=evil), 403)  # after a preflight
    one_line(httpx.post(server + "/workshop/api/runs", json={"results": {}}, headers={"Origin": "null"}), 403)
    one_line(httpx.post(server + "/workshop/api/classes", json={}, headers={"Sec-Fetch-Site": "cross-site"}), 403)
    one_line(httpx.post(server + "/workshop/api/classes", json={}, headers={"Sec-Fetch-Site": "same-site", **evil}), 403)
    assert classes_in(db_url) == before
    port = server.rsplit(":", 1)[1]
    assert httpx.post(server + "/workshop/api/classes", json={}, headers={"Origin": f"http://127.0.0.1:{port}"}).status_code == 200
    # behind a proxy that rewrites Host, the browser's own word that the page is this site's
    assert httpx.post(server + "/workshop/api/classes", json={}, headers={"Origin": "https://class.example.org",
                                                                          "Sec-Fetch-Site": "same-origin"}).status_code == 200


def test_workshop_hostile_a_100_mb_body_is_refused_before_it_is_read(server):
    host, port = "127.0.0.1", int(server.rsplit(":", 1)[1])
    for framing in ("declared", "chunked"):
        with socket.create_connection((host, port), timeout=30) as sock:
            head = f"POST /workshop/api/runs HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            head += f"Content-Length: {HUNDRED_MB}\r\n\r\n" if framing == "declared" else "Transfer-Encoding: chunked\r\n\r\n"
            sock.sendall(head.encode())
            chunk, sent, began = b'{"results": {"x": "' + b"x" * 65_000, 0, time.perf_counter()
            while sent < HUNDRED_MB and not select.select([sock], [], [], 0)[0]:
                try:
                    sock.sendall(chunk if framing == "declared" else b"%x\r\n%s\r\n" % (len(chunk), chunk))
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += len(chunk)
            answer = b""
            while b'"}' not in answer and (piece := sock.recv(65536)):
                answer += piece
            answer = answer.decode("latin-1")
        assert answer.startswith("HTTP/1.1 413"), answer[:200]
        assert '{"error":"This request\'s body is over' in answer
        # the server stopped at its limit (a saved run's cap, 16 MB here): the client had sent a part of the
        # 100 MB, what the loopback's buffers took, when it answered
        assert sent < 40_000_000, (framing, sent)
        print(f"\n{framing}: 413 after {sent / 1e6:.1f} MB sent, {time.perf_counter() - began:.2f} s")
    assert httpx.get(server + "/workshop").status_code == 200


@contextlib.contextmanager
def unwritable(db_url: str, how: str):
    """The store read-only or full, as the server's next connections see it; restored afterwards."""
    engine = database.open_store(db_url)
    if engine.dialect.name == "sqlite":
        def limit(connection, _record):
            cursor = connection.cursor()
            if how == "read-only":
                cursor.execute("PRAGMA query_only = ON")
            else:  # the file may not grow by a page: as a full disk
                pages = cursor.execute("PRAGMA page_count").fetchone()[0]
                cursor.execute(f"PRAGMA max_page_count = {pages}")
            cursor.close()
        event.listen(engine, "connect", limit)
        engine.dispose()
        try:
            yield
        finally:
            event.remove(engine, "connect", limit)
            engine.dispose()
        return
    name = engine.url.database
    admin = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    maintenance = engine.url.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(maintenance if how == "read-only" else admin, autocommit=True) as connection:
        if how == "read-only":
            connection.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        else:  # every insert fails as on a full disk (SQLSTATE 53100)
            connection.execute("CREATE FUNCTION kvviz_full() RETURNS trigger AS $$ BEGIN "
                               "RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = 'disk_full'; "
                               "END $$ LANGUAGE plpgsql")
            for table in ("classes", "learners", "predictions", "saved_runs"):
                connection.execute(f"CREATE TRIGGER full_{table} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION kvviz_full()")
    engine.dispose()
    try:
        yield
    finally:
        with psycopg.connect(maintenance if how == "read-only" else admin, autocommit=True) as connection:
            if how == "read-only":
                connection.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
            else:
                connection.execute("DROP FUNCTION kvviz_full() CASCADE")
        engine.dispose()


@pytest.mark.parametrize("how", ["read-only", "full"])
def test_workshop_hostile_a_read_only_or_full_store_answers_503_in_one_line(server, db_url, how, caplog):
    with httpx.Client(base_url=server, timeout=60) as http:
        made = http.post("/workshop/api/classes", json={}).json()
        with unwritable(db_url, how), caplog.at_level(logging.ERROR, logger=guard.LOG.name):
            small = (http.post("/workshop/api/classes", json={}),
                     http.post("/workshop/api/join", json={"code": made["code"], "name": "Ada"}))
            # a full SQLite file still takes a row that fits in the pages it has; a run of 9 kB does not
            for answer in small if how == "read-only" or "postgresql" in db_url else ():
                assert one_line(answer, 503) == guard.STORE_DOWN
            answer = http.post("/workshop/api/runs", json={"title": "t", "results": {"x": "y" * 9000}})
            assert one_line(answer, 503) == guard.STORE_DOWN
            assert http.get(f"/workshop/api/classes/{made['code']}/board", headers={"X-Host-Token": made["host_token"]}).status_code == 200
            assert http.get("/").status_code == 200 and http.get("/workshop").status_code == 200  # the rest serves
        logged = " ".join(record.getMessage() for record in caplog.records)
        assert database.shown_url(db_url) in logged  # where the store is: in the server's log only
        assert http.post("/workshop/api/join", json={"code": made["code"], "name": "Cy"}).status_code == 200  # and back
