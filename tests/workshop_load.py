"""Simulated learners for the workshop's load test, in a process of their own (so that they do not
share the server's interpreter lock): ``python -m tests.workshop_load URL`` reads a JSON list of
``{"token", "predictions": [[exercise, value], ...]}`` on stdin, runs every learner at once (one
asyncio task and one connection each, predictions in order) and prints a JSON object: each round
trip's seconds and the failures (status and body).

``python -m tests.workshop_load --flood URL N`` is an anonymous client instead: N requests, creates
and saves in turn, over four connections at once, from one address (``X-Forwarded-For`` through
the trusted 127.0.0.1); it prints the count of each status."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx


async def learner(url: str, seat: dict, start: asyncio.Event, times: list, failures: list) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        headers = {"X-Learner-Token": seat["token"]}
        await http.get("/workshop/api/me", headers=headers)  # the connection, opened before the start
        await start.wait()
        for exercise, value in seat["predictions"]:
            began = time.perf_counter()
            answer = await http.post("/workshop/api/predict", json={"exercise": exercise, "value": value}, headers=headers)
            times.append(time.perf_counter() - began)
            if answer.status_code != 200:
                failures.append(f"{answer.status_code} {answer.text}")


async def run(url: str, seats: list[dict]) -> dict:
    times, failures, start = [], [], asyncio.Event()
    tasks = [asyncio.create_task(learner(url, seat, start, times, failures)) for seat in seats]
    await asyncio.sleep(1.0)  # every learner connected
    start.set()
    await asyncio.gather(*tasks)
    return {"times": times, "failures": failures}


async def flood(url: str, count: int, connections: int = 4) -> dict:
    statuses: dict[str, int] = {}
    results = {"results": [{"handoff": "text", "answer": "x" * 8000}]}

    async def sender(indexes) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30, headers={"X-Forwarded-For": "203.0.113.99"}) as http:
            for index in indexes:
                answer = await (http.post("/workshop/api/runs", json={"title": "flood", "results": results}) if index % 2
                                else http.post("/workshop/api/classes", json={}))
                statuses[str(answer.status_code)] = statuses.get(str(answer.status_code), 0) + 1

    await asyncio.gather(*(sender(range(start, count, connections)) for start in range(connections)))
    return statuses


if __name__ == "__main__":
    if sys.argv[1] == "--flood":
        json.dump(asyncio.run(flood(sys.argv[2], int(sys.argv[3]))), sys.stdout)
    else:
        json.dump(asyncio.run(run(sys.argv[1], json.load(sys.stdin))), sys.stdout)
