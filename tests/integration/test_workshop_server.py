"""Workshop mode through the real server: the lab's Gradio page with the workshop's routes beside it
(as app.py serves them), on SQLite and on a throwaway PostgreSQL server (tests/postgres_server.py).

* without the host token no request opens an exercise, reads the learners' names, exports or
  deletes a class;
* 30 learners answering the eight first exercises at once: no prediction lost or doubled (the p95 of
  a prediction's round trip, target <= 300 ms, is a benchmark: scripts/workshop_load.py);
* a restarted server loses no class, prediction or saved run;
* a saved run's link is at most 40 characters and leads to the page with its id.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kvviz.app.exercises import EXERCISES, answer_of, stored_results
from kvviz.app.workshop import api
from kvviz.core.policy import LOCAL_WORKSHOP
from kvviz.store import database
from tests.workshop_fixtures import db_url, demo  # noqa: F401 (fixtures)
from tests.workshop_fixtures import serving as served

LEARNERS = 30
REPO_ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def serving(demo, db_url: str):
    """The page and the workshop's routes over the store at ``db_url``; the store closed afterwards."""
    with served(demo, api.Service(db_url)) as url:
        yield url
    database.close_store(db_url)


@pytest.fixture()
def server(demo, db_url):
    with serving(demo, db_url) as url:
        yield url


def client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=30)


def make_class(http: httpx.Client, mode: str = "paced") -> dict:
    made = http.post("/workshop/api/classes", json={"mode": mode})
    assert made.status_code == 200, made.text
    return made.json()


def test_without_the_host_token_no_request_opens_reads_names_exports_or_deletes(server):
    with client(server) as http:
        made = make_class(http)
        other = make_class(http)
        learner = http.post("/workshop/api/join", json={"code": made["code"], "name": "Ada"}).json()
        code, first = made["code"], EXERCISES.exercises[0].key
        for token in (None, "", "wrong", other["host_token"], learner["token"]):
            headers = {"X-Host-Session": "page"} | ({"X-Host-Token": token} if token is not None else {})
            answers = [
                http.post(f"/workshop/api/classes/{code}/host", json={"open": first}, headers=headers),
                http.get(f"/workshop/api/classes/{code}/board", headers=headers),
                http.get(f"/workshop/api/classes/{code}/export.csv", headers=headers),
                http.delete(f"/workshop/api/classes/{code}", headers=headers),
            ]
            for answer in answers:
                assert answer.status_code == 403, (token, answer.request.url, answer.text)
                assert answer.json()["error"] == "That host link does not control this class: the host token is wrong."
                assert "Ada" not in answer.text
        host = {"X-Host-Token": made["host_token"], "X-Host-Session": "page"}
        board = http.get(f"/workshop/api/classes/{code}/board", headers=host).json()
        assert board["open"] == [] and board["names"] == ["Ada"]  # nothing was opened, the class is still there
        me = http.get("/workshop/api/me", headers={"X-Learner-Token": learner["token"]}).json()
        assert "names" not in me and "Ada" == me["name"]


def test_thirty_learners_answering_at_once_lose_and_double_nothing(server):
    """The learners run in a process of their own (tests/workshop_load.py), as they would on their phones."""
    exercises = EXERCISES.exercises[:8]
    with client(server) as http:
        made = make_class(http, mode="self")
        seats = [http.post("/workshop/api/join", json={"code": made["code"], "name": f"Learner {n}"}).json()
                 for n in range(LEARNERS)]
    choice = {e.key: (e.choices[n % len(e.choices)] if e.predict == "choice" else str(n)) for n, e in enumerate(exercises)}
    plan = [{"token": seat["token"], "predictions": [[e.key, choice[e.key]] for e in exercises]} for seat in seats]
    ran = subprocess.run([sys.executable, "-m", "tests.workshop_load", server], input=json.dumps(plan), capture_output=True,
                         text=True, timeout=300, cwd=REPO_ROOT, check=True)
    load = json.loads(ran.stdout)
    assert load["failures"] == [] and len(load["times"]) == LEARNERS * len(exercises)
    with client(server) as http:
        host = {"X-Host-Token": made["host_token"]}
        board = http.get(f"/workshop/api/classes/{made['code']}/board", headers=host).json()["exercises_board"]
        rows = http.get(f"/workshop/api/classes/{made['code']}/export.csv", headers=host).text.strip().splitlines()[1:]
    for exercise in exercises:
        assert board[exercise.key]["total"] == LEARNERS and board[exercise.key]["counts"] == {choice[exercise.key]: LEARNERS}
    assert len(rows) == LEARNERS * len(exercises) == len({row.rsplit(",", 1)[0] for row in rows})  # none doubled


def test_a_prediction_is_graded_against_the_stored_run(server):
    exercise = next(e for e in EXERCISES.exercises if e.predict == "choice")
    truth = answer_of(exercise, stored_results(exercise))
    with client(server) as http:
        made = make_class(http, mode="self")
        seats = {value: http.post("/workshop/api/join", json={"code": made["code"], "name": f"Says {value}"}).json()
                 for value in exercise.choices}
        for value, seat in seats.items():
            headers = {"X-Learner-Token": seat["token"]}
            assert http.get(f"/workshop/api/reveal/{exercise.key}", headers=headers).status_code == 403  # predict first
            assert http.post("/workshop/api/predict", json={"exercise": exercise.key, "value": value}, headers=headers).status_code == 200
            revealed = http.get(f"/workshop/api/reveal/{exercise.key}", headers=headers).json()
            assert revealed["mine"] == {"value": value, "right": value == truth}
            assert revealed["explain"] == exercise.explain


def test_a_restarted_server_loses_no_class_prediction_or_saved_run(demo, db_url):
    key = EXERCISES.exercises[0].key
    with serving(demo, db_url) as first, client(first) as http:
        made = make_class(http, mode="self")
        seat = http.post("/workshop/api/join", json={"code": made["code"], "name": "Ada"}).json()
        http.post("/workshop/api/predict", json={"exercise": key, "value": "right"}, headers={"X-Learner-Token": seat["token"]})
        saved = http.post("/workshop/api/runs", json={"title": "t", "link": "preset=locker", "results": {"results": []}}).json()
    with serving(demo, db_url) as again, client(again) as http:
        board = http.get(f"/workshop/api/classes/{made['code']}/board", headers={"X-Host-Token": made["host_token"]}).json()
        assert board["names"] == ["Ada"] and board["exercises_board"][key]["counts"] == {"right": 1}
        assert http.get("/workshop/api/me", headers={"X-Learner-Token": seat["token"]}).json()["mine"][key]["value"] == "right"
        assert http.get(f"/workshop/api/runs/{saved['id']}").json()["link"] == "preset=locker"


def test_a_saved_runs_link_is_short_and_opens_the_page_with_its_id(server):
    with client(server) as http:
        saved = http.post("/workshop/api/runs", json={"title": "Locker", "link": "preset=locker&h=text,kvcomm",
                                                      "results": {"results": [{"handoff": "text", "answer": "4471"}]}}).json()
        link = server + saved["link"]
        assert len(link) <= 40, link
        opened = http.get(saved["link"], follow_redirects=False)
        assert opened.status_code == 307
        assert opened.headers["location"] == f"/?preset=locker&h=text%2Ckvcomm&run={saved['id']}"
        missing = http.get("/r/nothere")
        assert missing.status_code == 404 and "No saved run" in missing.json()["error"]


def test_a_learner_sees_no_answer_before_the_reveal_and_bad_input_gets_one_line(server):
    with client(server) as http:
        made = make_class(http, mode="self")
        assert http.post("/workshop/api/join", json={"code": "NOPE42", "name": "Ada"}).json() == {
            "error": "No class has the code NOPE42: check the code on the screen."}
        for name in ("", "<script>x</script>", "x" * 30):
            refused = http.post("/workshop/api/join", json={"code": made["code"], "name": name})
            assert refused.status_code == 400 and "\n" not in refused.json()["error"]
        seat = http.post("/workshop/api/join", json={"code": made["code"], "name": "Ada"}).json()
        headers = {"X-Learner-Token": seat["token"]}
        me = http.get("/workshop/api/me", headers=headers)
        for exercise in EXERCISES.exercises:
            assert exercise.explain not in me.text
        assert all(set(card) & {"expected", "explain", "check"} == set() for card in me.json()["cards"])
        key = EXERCISES.exercises[0].key
        answers = [http.post("/workshop/api/predict", json={"exercise": key, "value": "right"}, headers=headers)
                   for _ in range(LOCAL_WORKSHOP.predictions_per_minute + 1)]
        assert answers[0].status_code == 200
        assert {a.json()["error"] for a in answers[1:-1]} == {"You already predicted on this exercise."}
        assert answers[-1].status_code == 429
        assert answers[-1].json()["error"] == "Too many predictions from this session: wait a minute and try again."
        assert http.get("/workshop/api/me", headers=headers).json()["mine"] == {key: {"value": "right", "right": True}}


def test_a_second_host_page_gets_one_line_until_it_takes_over_and_pins_reach_the_learners(server):
    with client(server) as http:
        made = make_class(http)
        first, second = ({"X-Host-Token": made["host_token"], "X-Host-Session": name} for name in ("first", "second"))
        route = f"/workshop/api/classes/{made['code']}/host"
        keys = [e.key for e in EXERCISES.exercises]
        assert http.post(route, json={"open": keys[0]}, headers=first).status_code == 200
        refused = http.post(route, json={"open": keys[1]}, headers=second)
        assert refused.status_code == 409
        assert refused.json()["error"] == "This class is open on another host page: close it there, or take over from here."
        assert http.post(route, json={"open": keys[1], "take_over": True}, headers=second).json()["open"] == keys[:2]
        saved = http.post("/workshop/api/runs", json={"title": "Locker", "link": "preset=locker", "results": {"results": []}}).json()
        assert http.post(f"/workshop/api/classes/{made['code']}/pins", json={"run": saved["id"]},
                         headers={"X-Host-Token": "wrong"}).status_code == 403
        assert http.post(f"/workshop/api/classes/{made['code']}/pins", json={"run": saved["id"]}, headers=first).status_code == 200
        seat = http.post("/workshop/api/join", json={"code": made["code"], "name": "Ada"}).json()
        me = http.get("/workshop/api/me", headers={"X-Learner-Token": seat["token"]}).json()
        assert me["pinned"] == [{"id": saved["id"], "title": "Locker"}] and me["open"] == keys[:2]
