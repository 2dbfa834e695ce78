"""The workshop store's test suite, run as it is on SQLite (tests/unit/test_workshop_store.py) and on
a throwaway PostgreSQL server (tests/integration/test_workshop_postgres.py).

A module that imports these tests provides a ``db_url`` fixture: the URL of an empty database.
Each test opens it through ``kvviz.store.database.open_store`` (so the migrations run first) and
checks a behaviour: who may read and change what, the one-line refusals, and that nothing is lost.
"""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select, text
from sqlalchemy.orm import Session

from kvviz.core.policy import LOCAL_WORKSHOP
from kvviz.store import database
from kvviz.store.classes import Workshop
from kvviz.store.runs import SavedRuns
from kvviz.store.tables import Base, Class, Learner, Prediction
from kvviz.store.values import Refused, digest

EXERCISES = ["one", "two", "three"]


class Clock:
    def __init__(self):
        self.now = datetime(2026, 12, 3, 18, 0, tzinfo=timezone.utc)

    def __call__(self):
        return self.now

    def advance(self, **delta):
        self.now += timedelta(**delta)


@pytest.fixture()
def engine(db_url):
    engine = database.open_store(db_url)
    yield engine
    database.close_store(db_url)


@pytest.fixture()
def clock():
    return Clock()


@pytest.fixture()
def shop(engine, clock):
    return Workshop(engine, LOCAL_WORKSHOP, clock)


def refused(line_part: str, call, *args, **kwargs) -> Refused:
    with pytest.raises(Refused) as raised:
        call(*args, **kwargs)
    assert line_part in raised.value.line, raised.value.line
    assert "\n" not in raised.value.line
    return raised.value


def test_the_migrations_take_an_empty_database_to_the_head_and_match_the_tables(engine):
    assert database.current(engine) == database.head()
    assert {"classes", "learners", "predictions", "saved_runs"} <= set(inspect(engine).get_table_names())
    with engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert differences == []
    database.migrate(engine)  # a second upgrade finds nothing to do
    assert database.current(engine) == database.head()


def test_the_host_token_is_returned_once_and_stored_only_as_its_digest(engine, shop):
    made = shop.create_class(EXERCISES)
    assert len(made.code) == 6 and len(made.host_token) >= 24
    with Session(engine) as session:
        row = session.scalar(select(Class).where(Class.code == made.code))
        stored = [str(value) for value in (row.code, row.host_token_hash, row.settings, row.host_session)]
    assert row.host_token_hash == digest(made.host_token)
    assert not any(made.host_token in value for value in stored)


def test_a_learner_joins_with_the_code_and_a_name_and_bad_ones_get_one_line(shop, clock):
    made = shop.create_class(EXERCISES)
    seat = shop.join(made.code.lower(), "  Ada   Lovelace ")
    assert (seat.code, seat.name) == (made.code, "Ada Lovelace")
    refused("No class has the code ZZZZZZ", shop.join, "ZZZZZZ", "Bob")
    refused("Type a display name", shop.join, made.code, "   ")
    refused("The name is 25 characters; the limit is 24.", shop.join, made.code, "x" * 25)
    refused("no markup or links", shop.join, made.code, "<b>Eve</b>")
    refused("no markup or links", shop.join, made.code, "see https://example.org")
    assert refused("already uses that name", shop.join, made.code, "Ada Lovelace").status == 409
    clock.advance(hours=LOCAL_WORKSHOP.class_hours, seconds=1)
    assert refused(f"Class {made.code} has expired", shop.join, made.code, "Late").status == 410
    refused("has expired", shop.learner_view, seat.token)


def test_a_wrong_host_token_is_refused_for_every_host_action(shop):
    made = shop.create_class(EXERCISES)
    other = shop.create_class(EXERCISES)
    for token in ("", "guess", other.host_token):
        refused("host token is wrong", shop.host_settings, made.code, token, "page", open_exercise="one")
        refused("host token is wrong", shop.board, made.code, token)
        refused("host token is wrong", shop.export_csv, made.code, token)
        refused("host token is wrong", shop.delete_class, made.code, token)
    assert shop.board(made.code, made.host_token)["open"] == []


def test_paced_predictions_wait_for_the_host_and_close_at_the_reveal(shop):
    made = shop.create_class(EXERCISES)
    ada = shop.join(made.code, "Ada")
    refused("has not opened this exercise", shop.predict, ada.token, "one", "right", True)
    shop.host_settings(made.code, made.host_token, "page", open_exercise="one")
    shop.predict(ada.token, "one", "right", True)
    refused("already predicted", shop.predict, ada.token, "one", "wrong", False)
    refused("no exercise 'nine'", shop.predict, ada.token, "nine", "right", True)
    assert not shop.may_reveal(ada.token, "one")
    refused("after the reveal", shop.room, ada.token, "one")
    shop.host_settings(made.code, made.host_token, "page", reveal="one")
    assert shop.may_reveal(ada.token, "one")
    refused("predictions on it are closed", shop.predict, shop.join(made.code, "Bob").token, "one", "right", True)


def test_a_learner_reads_only_their_own_answers_and_the_rooms_counts(shop):
    made = shop.create_class(EXERCISES, mode="self")
    ada, bob, cy = (shop.join(made.code, name) for name in ("Ada", "Bob", "Cy"))
    shop.predict(ada.token, "one", "right", True)
    shop.predict(bob.token, "one", "wrong", False)
    shop.predict(bob.token, "two", "9", True)
    assert shop.learner_view(ada.token)["mine"] == {"one": {"value": "right", "right": True}}
    assert set(shop.learner_view(bob.token)["mine"]) == {"one", "two"}
    refused("after the reveal", shop.room, cy.token, "one")  # self-paced: a learner sees the room after predicting
    room = shop.room(ada.token, "one")
    assert room == {"counts": {"right": 1, "wrong": 1}, "total": 2, "right": 1, "graded": 2}
    seen = repr(shop.learner_view(ada.token)) + repr(room)
    assert "Bob" not in seen and "Cy" not in seen
    board = shop.board(made.code, made.host_token)
    assert board["names"] == ["Ada", "Bob", "Cy"]
    assert board["exercises_board"]["one"]["counts"] == {"right": 1, "wrong": 1}


def test_a_flood_of_predictions_from_one_session_is_refused_for_a_minute(engine, clock):
    shop = Workshop(engine, replace(LOCAL_WORKSHOP, predictions_per_minute=3), clock)
    made = shop.create_class([f"e{index}" for index in range(6)], mode="self")
    ada = shop.join(made.code, "Ada")
    for index in range(3):
        shop.predict(ada.token, f"e{index}", "x", None)
    assert refused("Too many predictions from this session", shop.predict, ada.token, "e3", "x", None).status == 429
    refused("Too many predictions", shop.predict, ada.token, "e4", "x", None)
    assert set(shop.learner_view(ada.token)["mine"]) == {"e0", "e1", "e2"}  # nothing lost, nothing extra
    clock.advance(seconds=61)
    shop.predict(ada.token, "e3", "x", None)


def test_a_second_host_page_is_refused_until_it_takes_over_or_the_first_goes_quiet(shop, clock):
    made = shop.create_class(EXERCISES)
    shop.host_settings(made.code, made.host_token, "first", open_exercise="one")
    assert refused("open on another host page", shop.host_settings, made.code, made.host_token, "second",
                   open_exercise="two").status == 409
    assert shop.board(made.code, made.host_token)["open"] == ["one"]  # the refused change did nothing
    shop.host_settings(made.code, made.host_token, "second", take_over=True, open_exercise="two")
    refused("open on another host page", shop.host_settings, made.code, made.host_token, "first", reveal="one")
    clock.advance(seconds=LOCAL_WORKSHOP.host_lease_seconds + 1)
    state = shop.host_settings(made.code, made.host_token, "first", reveal="one")
    assert state["open"] == ["one", "two"] and state["revealed"] == ["one"]


def test_the_csv_export_holds_every_answer_with_its_learner(shop):
    made = shop.create_class(EXERCISES, mode="self")
    for name, value, right in (("Ada", "right", True), ("Bob, Jr.", "wrong", False)):
        shop.predict(shop.join(made.code, name).token, "two", value, right)
    rows = list(csv.DictReader(io.StringIO(shop.export_csv(made.code, made.host_token))))
    assert [(r["learner"], r["exercise"], r["prediction"], r["right"]) for r in rows] == [
        ("Ada", "two", "right", "yes"), ("Bob, Jr.", "two", "wrong", "no")]


def test_deleting_a_class_removes_its_learners_and_answers(engine, shop):
    made = shop.create_class(EXERCISES, mode="self")
    kept = shop.create_class(EXERCISES, mode="self")
    ada = shop.join(made.code, "Ada")
    shop.predict(ada.token, "one", "right", True)
    shop.predict(shop.join(kept.code, "Kim").token, "one", "wrong", False)
    shop.delete_class(made.code, made.host_token)
    refused("No class has the code", shop.board, made.code, made.host_token)
    refused("has not joined a class", shop.learner_view, ada.token)
    with Session(engine) as session:
        assert session.scalars(select(Learner.name)).all() == ["Kim"]
        assert session.scalar(select(Prediction.value)) == "wrong"


def test_expired_classes_are_purged_and_the_caps_hold(engine, clock):
    shop = Workshop(engine, replace(LOCAL_WORKSHOP, max_classes=2, max_learners=2), clock)
    first = shop.create_class(EXERCISES)
    shop.create_class(EXERCISES, hours=1)
    refused("already holds 2 classes", shop.create_class, EXERCISES)
    shop.join(first.code, "A"), shop.join(first.code, "B")
    refused("is full (2 learners)", shop.join, first.code, "C")
    clock.advance(hours=2)
    assert shop.purge_expired() == 1
    shop.create_class(EXERCISES)  # the expired one no longer counts


def test_reopening_the_store_loses_no_class_prediction_or_saved_run(db_url, clock):
    engine = database.open_store(db_url)
    shop = Workshop(engine, LOCAL_WORKSHOP, clock)
    made = shop.create_class(EXERCISES, mode="self")
    ada = shop.join(made.code, "Ada")
    shop.predict(ada.token, "one", "right", True)
    run_id = SavedRuns(engine).save("Locker", "preset=locker", {"results": [{"handoff": "text", "answer": "4471"}]})
    database.close_store(db_url)
    engine = database.open_store(db_url)
    try:
        shop = Workshop(engine, LOCAL_WORKSHOP, clock)
        assert shop.learner_view(ada.token)["mine"]["one"]["value"] == "right"
        assert shop.board(made.code, made.host_token)["names"] == ["Ada"]
        assert SavedRuns(engine).get(run_id)["results"]["results"][0]["answer"] == "4471"
    finally:
        database.close_store(db_url)


def test_a_saved_run_comes_back_whole_under_a_short_id_and_can_be_pinned_to_a_class(engine, shop):
    runs = SavedRuns(engine, replace(LOCAL_WORKSHOP, max_saved_run_bytes=2000))
    payload = {"results": [{"handoff": "kvcomm", "answer": "4471", "layers": [{"layer": 0, "selected": True}]}]}
    run_id = runs.save("Locker code", "preset=locker&h=text,kvcomm", payload)
    assert len(f"/r/{run_id}") <= 12
    got = runs.get(run_id.upper())
    assert (got["title"], got["link"], got["results"]) == ("Locker code", "preset=locker&h=text,kvcomm", payload)
    refused("No saved run has the id", runs.get, "nothere")
    refused("a saved run holds at most", runs.save, "big", "", {"x": "y" * 3000})
    made = shop.create_class(EXERCISES)
    ada = shop.join(made.code, "Ada")
    refused("host token is wrong", runs.pin, shop, made.code, "guess", run_id)
    runs.pin(shop, made.code, made.host_token, run_id)
    assert runs.pinned(shop, ada.token) == [{"id": run_id, "title": "Locker code"}]


def test_the_database_enforces_one_prediction_per_learner_and_exercise(engine, shop):
    made = shop.create_class(EXERCISES, mode="self")
    shop.predict(shop.join(made.code, "Ada").token, "one", "right", True)
    with pytest.raises(Exception), engine.begin() as connection:
        connection.execute(text("INSERT INTO predictions (class_id, learner_id, exercise, value, created_at) "
                                "SELECT class_id, learner_id, exercise, 'again', created_at FROM predictions"))


def test_a_class_nobody_joins_expires_early_and_the_first_learner_gives_it_its_whole_lifetime(shop, clock):
    empty = shop.create_class(EXERCISES)
    used = shop.create_class(EXERCISES)
    assert empty.expires_at == clock.now + timedelta(hours=LOCAL_WORKSHOP.empty_class_hours)
    clock.advance(minutes=30)
    shop.host_settings(empty.code, empty.host_token, "page")  # a host at work renews the early expiry
    shop.join(used.code, "Ada")
    assert shop.board(used.code, used.host_token)["expires_at"] == (used.expires_at - timedelta(
        hours=LOCAL_WORKSHOP.empty_class_hours) + timedelta(hours=LOCAL_WORKSHOP.class_hours)).isoformat()
    clock.advance(hours=LOCAL_WORKSHOP.empty_class_hours, minutes=1)
    refused("has expired", shop.board, empty.code, empty.host_token)
    assert shop.board(used.code, used.host_token)["names"] == ["Ada"]


def test_a_full_server_makes_room_with_its_oldest_idle_empty_class_never_one_with_learners(engine, clock):
    shop = Workshop(engine, replace(LOCAL_WORKSHOP, max_classes=3), clock)
    with_learner, idle, fresh = (shop.create_class(EXERCISES) for _ in range(3))
    shop.join(with_learner.code, "Ada")
    clock.advance(minutes=LOCAL_WORKSHOP.idle_class_minutes - 1)
    shop.host_settings(fresh.code, fresh.host_token, "page")  # its host is at work
    refused("already holds 3 classes", shop.create_class, EXERCISES)  # nothing idle long enough yet
    clock.advance(minutes=2)
    newest = shop.create_class(EXERCISES)
    refused("No class has the code", shop.board, idle.code, idle.host_token)
    for kept in (with_learner, fresh, newest):
        assert shop.board(kept.code, kept.host_token)["code"] == kept.code


def test_paced_reveal_waits_for_open_and_a_pin_cannot_take_another_classs_run(engine, shop):
    made, other = shop.create_class(EXERCISES), shop.create_class(EXERCISES)
    assert refused("Open this exercise before you reveal it", shop.host_settings, made.code, made.host_token, "page",
                   reveal="one").status == 409
    assert shop.host_settings(made.code, made.host_token, "page", open_exercise="one", reveal="one")["revealed"] == ["one"]
    runs = SavedRuns(engine)
    run_id = runs.save("mine", "", {"results": []})
    runs.pin(shop, made.code, made.host_token, run_id)
    assert refused("pinned to another class", runs.pin, shop, other.code, other.host_token, run_id).status == 409
    runs.pin(shop, made.code, made.host_token, run_id)  # again, by its own class: fine


def test_saved_runs_expire_and_the_oldest_unpinned_make_room_under_the_count_and_byte_caps(engine, shop, clock):
    caps = replace(LOCAL_WORKSHOP, max_saved_runs=4, max_saved_bytes=3000, saved_run_days=7)
    runs = SavedRuns(engine, caps, clock)
    made = shop.create_class(EXERCISES)
    pinned = runs.save("pinned", "", {"x": "p" * 900})
    runs.pin(shop, made.code, made.host_token, pinned)
    first, second = (runs.save(f"run {n}", "", {"x": "r" * 900}) for n in range(2))
    third = runs.save("run 2", "", {"x": "r" * 900})  # 4 x ~910 bytes > 3000: the oldest unpinned goes
    refused("No saved run has the id", runs.get, first)
    assert {runs.get(run_id)["title"] for run_id in (pinned, second, third)} == {"pinned", "run 1", "run 2"}
    with engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT sum(size) FROM saved_runs").scalar() <= caps.max_saved_bytes
    refused("pinned to classes", SavedRuns(engine, replace(caps, max_saved_bytes=1000), clock).save, "big", "", {"x": "b" * 500})
    clock.advance(days=7, seconds=1)
    refused("No saved run has the id", runs.get, pinned)
    runs.save("after a week", "", {})
    with engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT count(*) FROM saved_runs").scalar() == 1


def test_hostile_text_is_cleaned_by_the_one_rule_and_formula_cells_are_quoted_in_the_csv(shop):
    made = shop.create_class(EXERCISES, mode="self")
    seat = shop.join(made.code, "Ad\x00a\u202e")
    assert seat.name == "Ada"
    assert "surrogate" in refused("invalid character", shop.join, made.code, "Bo\ud800").line
    shop.predict(seat.token, "one", '=HYPERLINK("http://x.example","click")', None)
    shop.predict(seat.token, "two", "txt\u202e.exe\x00", None)
    shop.predict(seat.token, "three", "-3", None)
    refused("invalid character", shop.predict, seat.token, "three", "\udfff", None)
    rows = list(csv.DictReader(io.StringIO(shop.export_csv(made.code, made.host_token))))
    assert [row["prediction"] for row in rows] == ["'=HYPERLINK(\"http://x.example\",\"click\")", "txt.exe", "-3"]
    other = shop.join(made.code, "Tab")
    shop.predict(other.token, "one", "@SUM(A1)", None)
    shop.predict(other.token, "two", "+1+1", None)
    cells = [row["prediction"] for row in csv.DictReader(io.StringIO(shop.export_csv(made.code, made.host_token)))]
    assert cells[-2:] == ["'@SUM(A1)", "'+1+1"]
