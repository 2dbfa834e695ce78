"""Several app servers, one class: N ``python app.py`` servers on one PostgreSQL database behind
Debian's nginx with sticky sessions, started by one command and stopped by Ctrl-C.

    python scripts/workshop_cluster.py [--servers 2] [--host 127.0.0.1] [--port 8080] [--db-url URL]

* **PostgreSQL**: ``--db-url`` (or ``KVVIZ_DB_URL``) names the database every server shares; without
  one, a throwaway server is started in a temporary folder (tests/postgres_server.py; Debian's
  postgresql) and removed at the end, with the classes in it.
* **The app servers** listen on free 127.0.0.1 ports, each with ``KVVIZ_DB_URL``, no model preloaded
  (a live run loads the pair on the server that takes it).
* **nginx** listens on ``--host:--port`` and spreads clients over the servers by their address
  (``hash $remote_addr consistent``): Gradio's queue needs every request of a page on the same
  server, and the workshop's per-client allowances live in each server's memory. The servers trust
  the balancer's ``X-Forwarded-For`` (uvicorn trusts 127.0.0.1). A server that stops answering is
  skipped for 10 s and its clients go to another: a class lives in the database, so a learner of a
  dead server carries on with their next request. ``X-Kvviz-Upstream`` says which server answered.
* **Where phones join**: ``KVVIZ_JOIN_URL`` is set to the balancer's address (this machine's network
  address with ``--host 0.0.0.0``).

It prints where everything is, then one line ``kvviz cluster ready: {json}`` for scripts (the
balancer's URL and each server's URL and process id), and runs until interrupted (SIGINT or SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvviz.app.workshop.joining import network_address  # noqa: E402
from tests.postgres_server import find_binaries, postgres_server  # noqa: E402
from tests.workshop_servers import start_app_server, wait_until_up  # noqa: E402

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {folder}/nginx.pid;
error_log {folder}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {folder}/body;
  proxy_temp_path {folder}/proxy;
  fastcgi_temp_path {folder}/fastcgi;
  uwsgi_temp_path {folder}/uwsgi;
  scgi_temp_path {folder}/scgi;
  client_max_body_size 20m;
  map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
  upstream kvviz {{
    hash $remote_addr consistent;
{servers}
  }}
  server {{
    listen {listen};
    location / {{
      proxy_pass http://kvviz;
      proxy_http_version 1.1;
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $connection_upgrade;
      proxy_buffering off;
      proxy_read_timeout 3600s;
      proxy_connect_timeout 2s;
      add_header X-Kvviz-Upstream $upstream_addr always;
    }}
  }}
}}
"""


def find_nginx() -> str | None:
    return shutil.which("nginx") or next((path for path in ("/usr/sbin/nginx",) if os.path.exists(path)), None)


def nginx_config(folder: Path, listen: str, ports: list[int]) -> Path:
    servers = "\n".join(f"    server 127.0.0.1:{port} max_fails=1 fail_timeout=10s;" for port in ports)
    path = folder / "nginx.conf"
    path.write_text(NGINX_CONF.format(folder=folder, servers=servers, listen=listen))
    return path


def wait_for_balancer(balancer: subprocess.Popen, host: str, port: int, folder: Path, within: float = 30.0) -> None:
    """Return once nginx accepts connections on ``host:port`` (the "ready" line promises it); say why not."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if balancer.poll() is not None:
            log = folder / "nginx-error.log"
            raise SystemExit("nginx stopped at start: " + (log.read_text()[-2000:] if log.exists() else "no log"))
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.1)
    raise SystemExit(f"nginx did not accept connections on port {port} within {within:.0f} s")


@contextlib.contextmanager
def database(given: str | None):
    if given:
        yield given
        return
    binaries = find_binaries()
    if binaries is None:
        raise SystemExit("No --db-url and no PostgreSQL here (initdb): bash scripts/setup.sh --test installs Debian's postgresql")
    with postgres_server(binaries) as url:
        print(f"kvviz cluster: a throwaway PostgreSQL at {url.split('@', 1)[-1]} (removed at the end: pass --db-url to keep classes)",
              flush=True)
        yield url


def interrupted(*_) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the cluster as Ctrl-C does


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=2, help="app servers (default 2)")
    parser.add_argument("--host", default="127.0.0.1", help="where nginx listens (default 127.0.0.1; 0.0.0.0 for phones)")
    parser.add_argument("--port", type=int, default=8080, help="nginx's port (default 8080)")
    parser.add_argument("--db-url", default=os.environ.get("KVVIZ_DB_URL", ""), help="PostgreSQL URL (default: a throwaway one)")
    args = parser.parse_args(argv)
    nginx = find_nginx()
    if nginx is None:
        raise SystemExit("nginx is not installed: bash scripts/setup.sh --test installs Debian's nginx-light (apt-get install nginx-light)")
    signal.signal(signal.SIGTERM, interrupted)
    shown_host = (network_address() or "127.0.0.1") if args.host in ("0.0.0.0", "::") else args.host
    join_url = f"http://{shown_host}:{args.port}"
    with tempfile.TemporaryDirectory(prefix="kvviz-cluster-") as name, database(args.db_url) as db_url:
        folder = Path(name)
        servers = [start_app_server(db_url, folder, env={"KVVIZ_JOIN_URL": join_url}) for _ in range(args.servers)]
        balancer = None
        try:
            for server in servers:
                wait_until_up(server)
                print(f"kvviz cluster: app server at {server.url} (pid {server.process.pid}, log {server.log})", flush=True)
            config = nginx_config(folder, f"{args.host}:{args.port}", [server.port for server in servers])
            balancer = subprocess.Popen([nginx, "-c", str(config), "-p", str(folder)], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.STDOUT)
            wait_for_balancer(balancer, "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host, args.port, folder)
            print(f"kvviz cluster: nginx at http://{args.host}:{args.port} (sticky by client address); "
                  f"phones join at {join_url}/workshop", flush=True)
            if args.host not in ("0.0.0.0", "::") and args.host.startswith("127."):
                print("kvviz cluster: listening on this machine only; --host 0.0.0.0 lets phones reach it", flush=True)
            ready = {"balancer": f"http://127.0.0.1:{args.port}" if args.host in ("0.0.0.0", "::") else f"http://{args.host}:{args.port}",
                     "servers": [{"url": server.url, "pid": server.process.pid} for server in servers]}
            print("kvviz cluster ready: " + json.dumps(ready), flush=True)
            balancer.wait()
        except KeyboardInterrupt:
            pass
        finally:
            if balancer is not None and balancer.poll() is None:
                balancer.terminate()
                balancer.wait(timeout=30)
            for server in servers:
                if server.process.poll() is None:
                    server.process.terminate()
            for server in servers:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    server.process.wait(timeout=30)
                server.kill()


if __name__ == "__main__":
    main()
