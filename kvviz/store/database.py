"""Where the store is and how it is opened: ``open_store()`` gives an Engine migrated to the head.

* ``KVVIZ_DB_URL`` set: that database (``postgresql+psycopg://user@host:port/name`` for PostgreSQL,
  psycopg 3; a plain ``postgresql://`` URL is read as psycopg too);
* else one SQLite file, ``workshop.sqlite3`` in ``kvviz.core.paths.state_dir()``, in WAL mode (readers
  do not wait on the writer) with foreign keys on and a busy timeout.

**One write discipline** (``writing``): every read-then-write of the store runs in one transaction
that holds what it read, so that no acknowledged change is lost and no cap is passed when requests
arrive at once, from one server or several. On SQLite the transaction starts with ``BEGIN
IMMEDIATE``: it takes the database's writer lock before its first read, across processes (several
servers on one file are safe); a server's own writers queue on a lock of the process first, so that
they do not spin in SQLite's busy timeout. On PostgreSQL the rows a change reads are locked with
``SELECT ... FOR UPDATE`` (``locked``), and a cap over a whole table (classes alive, saved runs and
their bytes) is counted under a transaction-level advisory lock named for that table. Reads use
plain transactions (``reading``). New keys (class codes, saved-run ids) come from ``free_key``,
inside the writing transaction that inserts them.

Migrations are Alembic's (``kvviz/store/migrations``), run in-process on open; ``alembic upgrade
head`` with ``-x`` is not needed. ``head()`` and ``current()`` say where a database stands.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import weakref
import zlib
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, Select, create_engine, event, select, text
from sqlalchemy.orm import InstrumentedAttribute, Session

from kvviz.core.paths import state_dir

DB_URL_ENV = "KVVIZ_DB_URL"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_ENGINES: dict[str, Engine] = {}
_LOCK = threading.Lock()
_WRITERS: weakref.WeakKeyDictionary[Engine, threading.Lock] = weakref.WeakKeyDictionary()
WRITE_OPTION = "kvviz_write"  # a connection's execution option: its transaction writes
# what a person is told when the store cannot be written (where it is goes to the server's log only)
UNWRITABLE = "The workshop's store cannot be written now (it is read-only, full or unreachable); tell the server's admin."


def default_url() -> str:
    """``KVVIZ_DB_URL``, else the SQLite file in kvviz's state folder."""
    given = os.environ.get(DB_URL_ENV, "").strip()
    if given:
        return given
    return f"sqlite:///{state_dir() / 'workshop.sqlite3'}"


def shown_url(url: str) -> str:
    """Where a store is, without its user and password: for the server's log."""
    return url.split("@", 1)[-1] if "@" in url else url


def normalized(url: str) -> str:
    """A ``postgresql://`` or ``postgres://`` URL as psycopg 3's (SQLAlchemy's default driver is psycopg2)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def _sqlite_pragmas(connection, _record) -> None:
    # pysqlite begins transactions itself, lazily, at the first write; kvviz begins them (``_sqlite_begin``)
    connection.isolation_level = None
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _sqlite_begin(connection) -> None:
    """A writing transaction takes SQLite's writer lock at once (``BEGIN IMMEDIATE``), before it reads."""
    immediate = connection.get_execution_options().get(WRITE_OPTION)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def make_engine(url: str) -> Engine:
    url = normalized(url)
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:" and not path.startswith("file:"):  # a file: URI (?mode=ro) names its own
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 10})
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        _WRITERS[engine] = threading.Lock()
        return engine
    # no pre-ping (a round trip per request); connections are renewed after half an hour instead
    return create_engine(url, pool_size=10, max_overflow=20, pool_recycle=1800)


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", normalized(url).replace("%", "%%"))
    return config


def migrate(engine: Engine) -> None:
    """Upgrade the database to the newest revision (an empty one gets every table); servers starting
    together on one database migrate one after the other."""
    if current(engine) == head():  # nothing to write (a read-only store still opens)
        return
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with _transaction(engine, "migrations") as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


@contextlib.contextmanager
def _transaction(engine: Engine, table_lock: str | None = None):
    """A writing transaction on a connection of its own (see the module docstring)."""
    process_lock = _WRITERS.get(engine) or contextlib.nullcontext()
    with process_lock, engine.connect().execution_options(**{WRITE_OPTION: True}) as connection:
        with connection.begin():
            if table_lock and engine.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": advisory_key(table_lock)})
            yield connection


def advisory_key(name: str) -> int:
    """A stable 32-bit number for a named PostgreSQL advisory lock."""
    return zlib.crc32(f"kvviz.store.{name}".encode())


@contextlib.contextmanager
def writing(engine: Engine, table_lock: str | None = None):
    """The one way the store writes: a Session whose transaction holds what it reads, committed on the
    way out (rolled back on an exception). ``table_lock`` names a cap over a whole table that this
    change counts (PostgreSQL takes that advisory lock first; SQLite's writer lock covers it)."""
    with _transaction(engine, table_lock) as connection, Session(bind=connection) as session:
        yield session
        session.flush()


@contextlib.contextmanager
def reading(engine: Engine):
    """A Session for reads only (one consistent snapshot; it holds no lock)."""
    with Session(engine) as session:
        yield session


def locked(statement: Select) -> Select:
    """``statement`` taking row locks on what it reads, for a writing transaction (PostgreSQL's
    ``FOR UPDATE``; on SQLite the transaction's writer lock already holds the whole database)."""
    return statement.with_for_update()


def free_key(session: Session, column: InstrumentedAttribute, letters: str, length: int, tries: int = 50) -> str | None:
    """A random key of ``length`` ``letters`` that no row holds in ``column`` (class codes, saved-run
    ids), or None; call it in the writing transaction that inserts the key."""
    for _ in range(tries):
        key = "".join(secrets.choice(letters) for _ in range(length))
        if session.scalar(select(column).where(column == key)) is None:
            return key
    return None


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
