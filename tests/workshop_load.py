"""Simulated learners for the workshop's load test, in a process of their own (so that they do not
share the server's interpreter lock): ``python -m tests.workshop_load URL`` reads a JSON list of
``{"token", "predictions": [[exercise, value], ...]}`` on stdin, runs every learner at once (one
asyncio task and one connection each, predictions in order) and prints a JSON object: each round
trip's seconds and the failures (status and body)."""

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


if __name__ == "__main__":
    json.dump(asyncio.run(run(sys.argv[1], json.load(sys.stdin))), sys.stdout)
