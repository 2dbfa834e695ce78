"""Where the store is and how it is opened: ``open_store()`` gives an Engine migrated to the head.

* ``KVVIZ_DB_URL`` set: that database (``postgresql+psycopg://user@host:port/name`` for PostgreSQL,
  psycopg 3; a plain ``postgresql://`` URL is read as psycopg too);
* else one SQLite file, ``workshop.sqlite3`` in ``kvviz.core.paths.state_dir()``, in WAL mode (readers
  do not wait on the writer) with foreign keys on and a busy timeout, so several threads of one
  server share it.

Migrations are Alembic's (``kvviz/store/migrations``), run in-process on open; ``alembic upgrade
head`` with ``-x`` is not needed. ``head()`` and ``current()`` say where a database stands.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event

from kvviz.core.paths import state_dir

DB_URL_ENV = "KVVIZ_DB_URL"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_ENGINES: dict[str, Engine] = {}
_LOCK = threading.Lock()


def default_url() -> str:
    """``KVVIZ_DB_URL``, else the SQLite file in kvviz's state folder."""
    given = os.environ.get(DB_URL_ENV, "").strip()
    if given:
        return given
    return f"sqlite:///{state_dir() / 'workshop.sqlite3'}"


def normalized(url: str) -> str:
    """A ``postgresql://`` or ``postgres://`` URL as psycopg 3's (SQLAlchemy's default driver is psycopg2)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def _sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def make_engine(url: str) -> Engine:
    url = normalized(url)
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 10})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # no pre-ping (a round trip per request); connections are renewed after half an hour instead
    return create_engine(url, pool_size=10, max_overflow=20, pool_recycle=1800)


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", normalized(url).replace("%", "%%"))
    return config


def migrate(engine: Engine) -> None:
    """Upgrade the database to the newest revision (an empty one gets every table)."""
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def head() -> str:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def open_store(url: str | None = None) -> Engine:
    """The engine for ``url`` (default: ``default_url()``), migrated to the head, one per URL per process."""
    url = normalized(url or default_url())
    with _LOCK:
        if url not in _ENGINES:
            engine = make_engine(url)
            migrate(engine)
            _ENGINES[url] = engine
        return _ENGINES[url]


def close_store(url: str | None = None) -> None:
    """Forget and dispose of the engine for ``url`` (tests; a server stopping)."""
    with _LOCK:
        engine = _ENGINES.pop(normalized(url or default_url()), None)
    if engine is not None:
        engine.dispose()
