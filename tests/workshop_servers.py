"""App servers in processes of their own, as ``python app.py`` runs them, for the workshop's tests
with several servers on one store (and for ``scripts/workshop_cluster.py``).

``app_servers(db_url, count)`` starts ``count`` servers at once on free 127.0.0.1 ports, each with
``KVVIZ_DB_URL=db_url`` and no model preloaded, waits until each answers ``/workshop``, yields them
(``AppServer``: its URL, port and process) and stops them afterwards. A server that exits before it
answers fails with the last lines it printed (a second server refused at start says why there).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 300.0  # two servers starting at once on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class AppServer:
    port: int
    process: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        """kill -9: the server stops at once, mid-request."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


def start_app_server(db_url: str, folder: Path, port: int | None = None, env: dict | None = None,
                     host: str = "127.0.0.1") -> AppServer:
    """One ``python app.py`` process (not yet answering: ``wait_until_up``)."""
    port = port or free_port()
    log = folder / f"app-{port}.log"
    environment = {**os.environ, "KVVIZ_DB_URL": db_url, "GRADIO_ANALYTICS_ENABLED": "False",
                   "KVVIZ_STATE_DIR": str(folder / "state"), "OMP_NUM_THREADS": "1", **(env or {})}
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--no-preload", "--host", host,
                                    "--port", str(port)], cwd=ROOT, env=environment, stdout=out,
                                   stderr=subprocess.STDOUT)
    return AppServer(port, process, log)


def wait_until_up(server: AppServer, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the app server on port {server.port} exited ({server.process.returncode}):\n"
                               + "\n".join(server.output().splitlines()[-15:]))
        try:
            if httpx.get(server.url + "/workshop", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    server.kill()
    raise RuntimeError(f"the app server on port {server.port} did not answer within {timeout:.0f} s")


@contextlib.contextmanager
def app_servers(db_url: str, count: int, env: dict | None = None):
    """``count`` app servers on one store, started at once; stopped on the way out."""
    with tempfile.TemporaryDirectory(prefix="kvviz-servers-") as folder:
        servers = [start_app_server(db_url, Path(folder), env=env) for _ in range(count)]
        try:
            for server in servers:
                wait_until_up(server)
            yield servers
        finally:
            for server in servers:
                if server.process.poll() is None:
                    server.process.terminate()
            for server in servers:
                try:
                    server.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    server.kill()
