"""A throwaway PostgreSQL server for the store's tests: initdb into a temporary folder, start on a
free 127.0.0.1 port (and a unix socket in that folder), stop and remove it afterwards.

The server binaries are Debian's postgresql package (``scripts/setup.sh --test`` installs it):
``initdb`` and ``pg_ctl`` on PATH or under /usr/lib/postgresql/<version>/bin. PostgreSQL refuses to
run as root, so as root the server runs as the ``postgres`` user (``runuser``), else as the current
user. ``find_binaries`` returns None when there is no PostgreSQL here: the caller skips with that
reason, or fails under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def find_binaries() -> Path | None:
    """The folder holding initdb and pg_ctl, or None."""
    on_path = shutil.which("initdb")
    candidates = ([Path(on_path).resolve().parent] if on_path else []) + [
        Path(folder) for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for folder in candidates:
        if (folder / "initdb").exists() and (folder / "pg_ctl").exists():
            return folder
    return None


def _as_server_user(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    # runuser is in /usr/sbin, which a CI job's PATH may not hold
    runuser = shutil.which("runuser") or next((path for path in ("/usr/sbin/runuser", "/sbin/runuser")
                                               if os.path.exists(path)), "runuser")
    return [runuser, "-u", "postgres", "--", *command]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def postgres_server(binaries: Path):
    """Yield a ``postgresql+psycopg://`` URL of a fresh server with an empty ``kvviz`` database."""
    folder = Path(tempfile.mkdtemp(prefix="kvviz-pg-"))
    data, port = folder / "data", _free_port()
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    run = lambda *command: subprocess.run(_as_server_user([str(c) for c in command]), check=True,  # noqa: E731
                                          capture_output=True, text=True, timeout=120)
    try:
        run(binaries / "initdb", "-D", data, "-U", "kvviz", "--auth=trust", "-E", "UTF8", "--no-sync")
        options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
        run(binaries / "pg_ctl", "-D", data, "-o", options, "-l", folder / "server.log", "-w", "-t", "60", "start")
        try:
            run(binaries / "createdb", "-h", "127.0.0.1", "-p", port, "-U", "kvviz", "kvviz")
            yield f"postgresql+psycopg://kvviz@127.0.0.1:{port}/kvviz"
        finally:
            run(binaries / "pg_ctl", "-D", data, "-m", "fast", "-w", "stop")
    except subprocess.CalledProcessError as error:
        raise RuntimeError(f"PostgreSQL test server: {error.cmd[-1]} failed: {error.stderr or error.stdout}") from error
    finally:
        shutil.rmtree(folder, ignore_errors=True)
