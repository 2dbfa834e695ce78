"""The workshop's load benchmark: 30 learners answer the eight first exercises at once, on SQLite
and on a throwaway PostgreSQL server, through the real server (the lab's page with the workshop's
routes, as app.py serves them).

    python scripts/workshop_load.py [--learners 30] [--backends sqlite,postgresql] [--flood 1000]

For each backend it prints how many predictions were answered, lost or doubled (read back from
the host's CSV export) and the round trips' median and p95 against the target (p95 <= 300 ms).
The learners run in a process of their own (tests/workshop_load.py), as they would on their phones;
with ``--flood N`` another process sends N anonymous creates and saves from one address while they
answer (the per-client allowance refuses most of them), and the line says what it got.
A noisy wall-clock number on a shared machine: report the load (``uptime``) beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

P95_TARGET_S = 0.300
EXERCISES_ANSWERED = 8


@contextlib.contextmanager
def store_url(backend: str):
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{Path(folder) / 'workshop.sqlite3'}"
        return
    from tests.postgres_server import find_binaries, postgres_server

    binaries = find_binaries()
    if binaries is None:
        raise SystemExit("PostgreSQL is not installed (no initdb): bash scripts/setup.sh --test installs it")
    with postgres_server(binaries) as url:
        yield url


@contextlib.contextmanager
def serving(db_url: str):
    from kvviz.app import ui
    from kvviz.app.workshop import api
    from kvviz.store import database
    from tests.workshop_fixtures import serving as served

    with served(ui.build_demo(default_max_new_tokens=4), api.Service(db_url)) as url:
        yield url
    database.close_store(db_url)


def measure(url: str, learners: int, flood: int = 0) -> dict:
    import httpx

    from kvviz.app.exercises import EXERCISES

    exercises = EXERCISES.exercises[:EXERCISES_ANSWERED]
    with httpx.Client(base_url=url, timeout=30) as http:
        made = http.post("/workshop/api/classes", json={"mode": "self"}).json()
        seats = [http.post("/workshop/api/join", json={"code": made["code"], "name": f"Learner {n}"}).json()
                 for n in range(learners)]
    choice = {e.key: (e.choices[0] if e.predict == "choice" else "1") for e in exercises}
    plan = [{"token": seat["token"], "predictions": [[e.key, choice[e.key]] for e in exercises]} for seat in seats]
    flooder = subprocess.Popen([sys.executable, "-m", "tests.workshop_load", "--flood", url, str(flood)], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True) if flood else None
    ran = subprocess.run([sys.executable, "-m", "tests.workshop_load", url], input=json.dumps(plan), capture_output=True,
                         text=True, timeout=600, cwd=ROOT, check=True)
    load = json.loads(ran.stdout)
    flooded = json.loads(flooder.communicate(timeout=600)[0]) if flooder else {}
    with httpx.Client(base_url=url, timeout=30) as http:
        csv = http.get(f"/workshop/api/classes/{made['code']}/export.csv",
                       headers={"X-Host-Token": made["host_token"]}).text.strip().splitlines()[1:]
    keys = [row.rsplit(",", 1)[0] for row in csv]
    times = load["times"]
    return {"sent": learners * len(exercises), "answered": len(times) - len(load["failures"]),
            "stored": len(set(keys)), "doubled": len(keys) - len(set(keys)),
            "median_ms": round(statistics.median(times) * 1000, 1),
            "p95_ms": round(statistics.quantiles(times, n=20)[-1] * 1000, 1), "failures": load["failures"][:3],
            "flood": flooded}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--learners", type=int, default=30)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--flood", type=int, default=0, help="anonymous creates and saves sent at once (default none)")
    args = parser.parse_args(argv)
    print(f"load: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs", flush=True)
    for backend in args.backends.split(","):
        with store_url(backend) as db_url, serving(db_url) as url:
            figures = measure(url, args.learners, args.flood)
        met = "met" if figures["p95_ms"] <= P95_TARGET_S * 1000 else "missed"
        lost = figures["sent"] - figures["stored"]
        print(f"{backend}: {args.learners} learners x {EXERCISES_ANSWERED} exercises: {figures['answered']}/{figures['sent']} "
              f"answered, {lost} lost, {figures['doubled']} doubled; round trip median {figures['median_ms']} ms, "
              f"p95 {figures['p95_ms']} ms (target <= {P95_TARGET_S * 1000:.0f} ms: {met})"
              + (f"; a flood of {args.flood} at once got {figures['flood']}" if args.flood else ""), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
