"""The workshop store's suite (tests/workshop_store_suite.py) on PostgreSQL: a throwaway server that
this module starts itself (tests/postgres_server.py: initdb into a temporary folder, a free port,
stopped afterwards), with a fresh database per test.

Without PostgreSQL here the module skips, saying so; under ``CI=true`` it fails instead
(``scripts/setup.sh --test`` installs Debian's postgresql).
"""

from __future__ import annotations

import itertools
import os

import psycopg
import pytest

from tests.postgres_server import find_binaries, postgres_server
from tests.workshop_store_suite import *  # noqa: F401,F403 (the shared tests)

IN_CI = os.environ.get("CI", "").lower() == "true"
_NUMBERS = itertools.count()


@pytest.fixture(scope="module")
def postgres_url():
    binaries = find_binaries()
    if binaries is None:
        message = ("PostgreSQL is not installed (no initdb on PATH or under /usr/lib/postgresql/*/bin): "
                   "bash scripts/setup.sh --test installs Debian's postgresql")
        if IN_CI:
            pytest.fail(f"CI=true needs PostgreSQL: {message}")
        pytest.skip(message)
    with postgres_server(binaries) as url:
        yield url


@pytest.fixture()
def db_url(postgres_url):
    """An empty database on the throwaway server, dropped after the test."""
    name = f"kvviz_test_{os.getpid()}_{next(_NUMBERS)}"
    admin = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    yield postgres_url.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_store_really_is_postgresql(engine):
    with engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT version()").scalar().startswith("PostgreSQL")
