"""The page's side of the speed report: the warm run through the served page, and the class at once.

* ``page_run``: ``python app.py`` served on a free loopback port (one torch thread per handoff, as it
  serves; it keeps no finished run, so every timed request is computed), its ``/run`` endpoint called
  with ``gradio_client`` once to warm up, then ``repeats`` times: the wall seconds of each call. As
  served, ``/run`` records nothing of what crossed (only with ``attention=True``), as the in-process
  ``warm_full_run_seconds`` does. Each round runs that in-process run right before its ``/run`` call,
  and the page's cost is the ratio within each round (this machine's speed drifts by
  up to 2x over minutes: a ratio of two medians measured minutes apart measures the drift).
* ``class_load``: ``scripts/load_test.py --class N --distinct`` (N learners, a question each, pressed
  within 10 s; then a fresh server asks each question alone: every answer must equal that one), its
  report.

Both serve this checkout's ``app.py`` in this process's environment (``KVVIZ_NUMERICS`` included).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from kvviz.core import paths
from kvviz.runtime.measure import spread
from kvviz.studies.run_speed import FULL_RUN_CONTEXT, FULL_RUN_QUERY, FULL_RUN_TOKENS

PAGE_START_SECONDS = 300  # the served page must answer within this (it loads the models first)
CLASS_SIZE = 30
CLASS_SECONDS = 3600  # the class test (its class, then a fresh server's serial pass) must end within this


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PageNotServed(RuntimeError):
    """``python app.py`` exited, or did not answer in time (the message says which)."""


def serve_page(pair_name: str, checkout: Path = paths.PROJECT_ROOT, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """``python app.py`` of ``checkout`` (importing that checkout's kvviz) served on a free loopback
    port, once it answers: (the server, its URL). Stop it with ``stop_page``. It keeps no finished
    run (``KVVIZ_RUN_CACHE_MB=0``), so that every timed request is computed. ``env``: more settings."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", KVVIZ_RUN_CACHE_MB="0", **(env or {}),
               PYTHONPATH=os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")])))
    server = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--host", "127.0.0.1", "--pair", pair_name],
                              cwd=checkout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + PAGE_START_SECONDS
    while True:
        if server.poll() is not None:
            raise PageNotServed(f"python app.py exited with code {server.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2).read(64)
            return server, url
        except OSError:
            if time.monotonic() > deadline:
                stop_page(server)
                raise PageNotServed(f"the page did not answer within {PAGE_START_SECONDS} s") from None
            time.sleep(1)


def stop_page(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()


def page_run(pair_name: str, repeats: int, beside: Callable[[], float]) -> dict:
    """The warm run through the page (the module docstring): the wall seconds of each ``/run`` call.
    ``beside``: one run of the same request in this process (its wall seconds), made right before each
    ``/run`` call, so that each round pairs the two and the machine's drift falls on both; then
    ``in_process_seconds`` and ``page_over_process``, the per-round ratios."""
    app = paths.PROJECT_ROOT / "app.py"
    if not app.is_file():
        return {"warm_page_run_seconds": spread([]), "skipped": f"{app} is not here (an installed package)"}
    from gradio_client import Client

    try:
        server, url = serve_page(pair_name)
    except PageNotServed as error:
        return {"warm_page_run_seconds": spread([]), "skipped": str(error)}
    try:
        client = Client(url, verbose=False)
        walls, in_process = [], []
        for repeat in range(repeats + 1):
            alone = beside()
            started = time.perf_counter()
            try:
                client.predict(pair=pair_name, query=FULL_RUN_QUERY, context=FULL_RUN_CONTEXT,
                               max_new_tokens=FULL_RUN_TOKENS, api_name="/run")
            except Exception as error:  # the page refused or failed: say so, measure nothing
                return {"warm_page_run_seconds": spread([]), "skipped": f"the page's /run failed: {error}"}
            if repeat:
                walls.append(time.perf_counter() - started)
                in_process.append(alone)
        return {"warm_page_run_seconds": spread(walls), "how": "python app.py, /run through gradio_client",
                "in_process_seconds": spread(in_process),
                "page_over_process": spread([page / alone for page, alone in zip(walls, in_process)]),
                "paired": "each round: the run in this process, then the same request through /run"}
    finally:
        stop_page(server)


def class_load(size: int = CLASS_SIZE) -> dict:
    """``scripts/load_test.py --class SIZE --distinct`` of this checkout, its JSON report (or
    ``skipped`` with why)."""
    script = paths.PROJECT_ROOT / "scripts" / "load_test.py"
    if not script.is_file():
        return {"skipped": f"{script} is not here (an installed package)"}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "class.json"
        command = [sys.executable, str(script), "--class", str(size), "--distinct", "--json", str(out)]
        try:
            done = subprocess.run(command, cwd=paths.PROJECT_ROOT, capture_output=True, text=True, timeout=CLASS_SECONDS)
        except subprocess.TimeoutExpired:
            return {"skipped": f"the class test did not finish within {CLASS_SECONDS} s"}
        if done.returncode != 0 or not out.is_file():
            return {"skipped": f"the class test failed ({done.returncode}): {done.stderr[-500:]}"}
        return json.loads(out.read_text())
