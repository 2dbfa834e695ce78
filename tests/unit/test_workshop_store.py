"""The workshop store's suite (tests/workshop_store_suite.py) on SQLite: a fresh file per test, in
WAL mode as the app opens it. The same suite runs on PostgreSQL in the integration tier."""

from __future__ import annotations

import pytest

from kvviz.store import database
from tests.workshop_store_suite import *  # noqa: F401,F403 (the shared tests)


@pytest.fixture()
def db_url(tmp_path):
    return f"sqlite:///{tmp_path / 'workshop.sqlite3'}"


def test_the_default_store_is_one_sqlite_file_in_kvvizs_state_folder_in_wal_mode(tmp_path, monkeypatch):
    monkeypatch.delenv(database.DB_URL_ENV, raising=False)
    monkeypatch.setenv("KVVIZ_STATE_DIR", str(tmp_path / "state"))
    assert database.default_url() == f"sqlite:///{tmp_path / 'state' / 'workshop.sqlite3'}"
    engine = database.open_store()
    try:
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert (tmp_path / "state" / "workshop.sqlite3").exists()
    finally:
        database.close_store()


def test_kvviz_db_url_names_another_database_and_a_postgres_url_uses_psycopg_3(monkeypatch):
    monkeypatch.setenv(database.DB_URL_ENV, "postgresql://kvviz@db.example:5432/kvviz")
    assert database.normalized(database.default_url()) == "postgresql+psycopg://kvviz@db.example:5432/kvviz"
