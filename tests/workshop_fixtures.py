"""What the workshop's server suites share (race, flood, hostile, server): the store on SQLite and on a
throwaway PostgreSQL server (``db_url``, one per module, both backends), the lab's page built once
(``demo``), and ``serving``: the page with the workshop's routes on a free 127.0.0.1 port, as app.py
serves them. A module imports the fixtures it uses by name."""

from __future__ import annotations

import contextlib
import os

import pytest

from kvviz.app import ui
from kvviz.app.workshop import api
from tests.postgres_server import find_binaries, postgres_server
from tests.workshop_servers import free_port

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def db_url(request, tmp_path_factory):
    """An empty store: a SQLite file, or a database on a throwaway PostgreSQL server (skipped without
    PostgreSQL here, failed under CI=true)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('workshop') / 'workshop.sqlite3'}"
        return
    binaries = find_binaries()
    if binaries is None:
        message = "PostgreSQL is not installed (no initdb): bash scripts/setup.sh --test installs Debian's postgresql"
        if IN_CI:
            pytest.fail(f"CI=true needs PostgreSQL: {message}")
        pytest.skip(message)
    with postgres_server(binaries) as url:
        yield url


@pytest.fixture(scope="module")
def demo():
    return ui.build_demo(default_max_new_tokens=4)


@contextlib.contextmanager
def serving(demo, service: api.Service):
    """The page and the workshop's routes over ``service`` on a free 127.0.0.1 port; its URL."""
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                app_kwargs=api.launch_app_kwargs(service), **ui.launch_kwargs())
    try:
        yield demo.local_url.rstrip("/")
    finally:
        demo.close()
