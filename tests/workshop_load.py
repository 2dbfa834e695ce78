"""Simulated learners for the workshop's load test, in a process of their own (so that their client
threads do not share the server's interpreter lock): ``python -m tests.workshop_load URL`` reads a
JSON list of ``{"token", "predictions": [[exercise, value], ...]}`` on stdin, runs every learner
at once (one thread each, predictions in order) and prints a JSON object: each round trip's
seconds and the failures (status and body)."""

from __future__ import annotations

import json
import sys
import threading
import time

import httpx


def learner(url: str, seat: dict, start: threading.Barrier, times: list, failures: list, lock: threading.Lock) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        http.get("/workshop/api/me", headers={"X-Learner-Token": seat["token"]})  # the connection, opened once
        start.wait()
        for exercise, value in seat["predictions"]:
            began = time.perf_counter()
            answer = http.post("/workshop/api/predict", json={"exercise": exercise, "value": value},
                               headers={"X-Learner-Token": seat["token"]})
            with lock:
                times.append(time.perf_counter() - began)
                if answer.status_code != 200:
                    failures.append(f"{answer.status_code} {answer.text}")


def main(url: str) -> None:
    seats = json.load(sys.stdin)
    times, failures, lock = [], [], threading.Lock()
    start = threading.Barrier(len(seats))
    threads = [threading.Thread(target=learner, args=(url, seat, start, times, failures, lock)) for seat in seats]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    json.dump({"times": times, "failures": failures}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
