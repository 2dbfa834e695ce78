"""Load test: N concurrent gradio_client sessions x M requests against the app on 127.0.0.1.

The script starts ``python app.py`` in a subprocess on a free loopback port (with the
concurrency and environment given), waits for it, makes one warm-up run, and records the serial
answer of every distinct question (each asked alone). Then N sessions, each its own
``gradio_client.Client`` in its own thread, send M requests each, mixing:

* ``typed``: a live run of the page's default handoffs on one of the questions (greedy, --tokens
  new tokens); its answers are compared with the serial ones, handoff by handoff;
* ``preset``: a click on a preset (precomputed results, no model);
* ``bad``: a run with a bad input (an empty query, a ratio out of range): a clean refusal expected;
* ``cancel``: a live run cancelled after --cancel-after seconds.

It stops by itself: every request has a timeout, no request starts after --time-limit seconds,
and the server is stopped at the end. Afterwards one normal request must succeed. Reported:
completed / refused (bad input, as expected) / rejected (queue full) / cancelled / failed, p50 and
p95 latency (all requests, and live runs alone), answers that differ from the serial ones, server
errors (HTTP 5xx other than the queue's 503, tracebacks in the server log), and the server's
resident memory before, at peak and after.

    python scripts/load_test.py --sessions 8 --requests 5 --tokens 8
    python scripts/load_test.py --sessions 20 --requests 3 --mix typed:3,preset:1,bad:1,cancel:1
    python scripts/load_test.py --concurrency 2 --json out.json   # KVVIZ_CONCURRENCY for the server
    python scripts/load_test.py --sessions 1 --requests 200 --memory-after 10   # the soak (issue 20)

A class at once (issue 32): ``--class N --same-preset`` has N sessions (their clients opened first)
press Run on one question, not asked before on this server, each at a random moment within
``--window`` seconds; it reports completion, p50/p95 from press to answer, how many runs the server
computed, joined or served from its cache (``/run_counts``), memory, and the CPU seconds of the
server and of the simulated learners (all on this machine: in a room each browser has its own).
``--class N --distinct`` gives each session its own question (the secret code word of the first
question, changed). Then a fresh server that keeps no finished run asks each of the class's
questions alone, one after another: every learner's answer must equal that independent serial one,
and the p95 is compared with the time of running them one after another.

The other modes repeat their questions, so their server keeps no finished run (``KVVIZ_RUN_CACHE_MB=0``
unless ``--env`` says otherwise): they measure computed runs.

    python scripts/load_test.py --class 30 --same-preset
    python scripts/load_test.py --class 30 --distinct --tokens 8

``--memory-after N`` also records the server's resident memory once N requests have been answered,
and compares the memory at the end with it (a soak's memory must stay flat after its first runs).

This is a benchmark, not a test: its targets (issue 14) are reported, not asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUESTIONS = [  # (query, context): the presets' kind of question, and typed ones
    ("What is the secret code word?", "The secret code word is pineapple."),
    ("Which country is Uma located in?", "Uma is at the Mahaffie House."),
    ("What is the capital of France?", None),
    ("Where does Mira keep her bicycle?", "Mira keeps her red bicycle in the garden shed behind the old library."),
]
WARM_UP = 2  # the class's warm-up question: the capital of France, no note (no class asks it)
BAD_INPUTS = [({"query": "   "}, "The query is empty"), ({"kvcomm_ratio": 1.5}, "must be between 0 and 1")]
KINDS = ("typed", "preset", "bad", "cancel")


@dataclass
class Outcome:
    kind: str
    status: str  # completed | refused | rejected | cancelled | failed
    seconds: float
    detail: str = ""
    answers: dict = field(default_factory=dict)  # handoff -> answer token ids (typed runs)
    question: int = -1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (Linux /proc): a server and its worker processes
    (``kvviz.engine.run_processes``)."""
    found, todo = [], [pid]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                todo += [int(child) for child in (task / "children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):  # a thread that just ended
                pass
    return found


def cpu_seconds(pid: int, workers: bool = True) -> float:
    """User + system CPU seconds a process and (``workers``) its live worker processes have used so far
    (Linux /proc), all their threads. A worker that has ended no longer counts."""
    total = 0.0
    for each in process_tree(pid) if workers else [pid]:
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def rss_mib(pid: int) -> float:
    """Memory of the server and its worker processes (Linux /proc), MiB: the sum of their proportional
    set sizes (each page shared between them, the models' mapped files, counted once in all); for a
    server without workers, about its resident memory."""
    total_kib = 0
    for each in process_tree(pid):
        try:
            rollup = Path(f"/proc/{each}/smaps_rollup").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total_kib += sum(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:"))
    return total_kib / 1024 if total_kib else float("nan")


class MemoryWatch(threading.Thread):
    """Samples the server's resident memory twice a second; keeps the peak."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0.0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, rss_mib(self.pid))
            except OSError:
                return
            self.stop.wait(0.5)


def start_server(port: int, concurrency: int | None, env_extra: dict, log_path: Path) -> subprocess.Popen:
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", **env_extra)
    if concurrency:
        env["KVVIZ_CONCURRENCY"] = str(concurrency)
    log = open(log_path, "w")
    return subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), "--host", "127.0.0.1"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_until_up(url: str, server: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with code {server.returncode} (see its log)")
        try:
            urllib.request.urlopen(url, timeout=2).read(64)
            return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"the server did not answer within {seconds:.0f} s")


def answers_of(data: dict) -> dict:
    return {r["handoff"]: r["answer_ids"] if r["applicable"] else f"n/a: {r['reason'][:60]}" for r in data["results"]}


def live_run(client, question: int, tokens: int):
    query, context = QUESTIONS[question]
    return client.submit(pair="embedded", query=query, context=context or "", max_new_tokens=tokens, message_tokens=tokens,
                         api_name="/run")


def one_request(client, kind: str, question: int, args, presets: list[str]) -> Outcome:
    from gradio_client.exceptions import AppError
    from gradio_client.utils import QueueError

    started = time.perf_counter()

    def took() -> float:
        return time.perf_counter() - started

    try:
        if kind == "typed":
            outputs = live_run(client, question, args.tokens).result(timeout=args.request_timeout)
            data = outputs[-1]
            if "finished" not in outputs[0]:
                return Outcome(kind, "failed", took(), f"status: {outputs[0][:120]}", question=question)
            return Outcome(kind, "completed", took(), answers=answers_of(data), question=question)
        if kind == "preset":
            client.predict(presets[question % len(presets)], api_name="/load_preset")
            return Outcome(kind, "completed", took())
        if kind == "bad":
            settings, expected = BAD_INPUTS[question % len(BAD_INPUTS)]
            kwargs = {"pair": "embedded", "query": QUESTIONS[0][0], "max_new_tokens": args.tokens, **settings}
            try:
                client.predict(**kwargs, api_name="/run")
            except AppError as error:
                if expected in str(error):
                    return Outcome(kind, "refused", took(), str(error)[:80])
                return Outcome(kind, "failed", took(), f"unexpected refusal: {error}")
            return Outcome(kind, "failed", took(), "a bad input was accepted")
        if kind == "cancel":
            job = live_run(client, question, args.tokens)
            time.sleep(args.cancel_after)
            job.cancel()
            return Outcome(kind, "cancelled", took())
        raise ValueError(kind)
    except QueueError as error:
        return Outcome(kind, "rejected", took(), str(error))
    except AppError as error:
        return Outcome(kind, "failed", took(), f"AppError: {error}"[:200])
    except Exception as error:  # timeouts, connection errors, 5xx
        return Outcome(kind, "failed", took(), f"{type(error).__name__}: {error}"[:200])


def server_errors_in(log: str) -> list[str]:
    """The exceptions in the server's log that are not a refusal shown to the user: Gradio logs
    every ``gr.Error`` with its traceback, so those (and the exceptions that caused them) are left
    out; what is left is a crash of a request (what a client sees as HTTP 500)."""
    lines = log.splitlines()
    final = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")
    errors = []
    for index, line in enumerate(lines):
        if not final.match(line) or line.startswith("gradio.exceptions.Error"):
            continue
        following = "\n".join(lines[index + 1 : index + 4])
        if "The above exception was the direct cause" in following or "During handling of the above" in following:
            continue  # the first link of a chain: judged by its last link
        errors.append(line[:200])
    return errors


def parse_mix(text: str) -> list[str]:
    """"typed:3,preset:1" -> a repeating pattern of kinds."""
    pattern = []
    for part in text.split(","):
        name, _, weight = part.strip().partition(":")
        if name not in KINDS:
            raise SystemExit(f"--mix: unknown kind {name!r}; kinds: {', '.join(KINDS)}")
        pattern += [name] * int(weight or 1)
    return pattern


def percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))]


CODE_WORDS = ("pineapple", "harbour", "lantern", "meadow", "copper", "violet", "glacier", "saffron", "orchid", "falcon",
              "granite", "juniper", "marble", "nectar", "pepper", "quartz", "raven", "silver", "tulip", "walnut",
              "amber", "basil", "cedar", "dune", "ember", "fennel", "garnet", "hazel", "indigo", "jasmine")


def class_questions(count: int, distinct: bool) -> list[tuple[str, str | None]]:
    """The class's questions: one not asked before (same preset), or one per session (distinct)."""
    if not distinct:
        return [QUESTIONS[3]] * count
    return [("What is the secret code word?", f"The secret code word is {CODE_WORDS[i % len(CODE_WORDS)]}"
             + (f" number {i // len(CODE_WORDS)}." if i >= len(CODE_WORDS) else ".")) for i in range(count)]


def class_at_once(url: str, server: subprocess.Popen, args) -> dict:
    """N sessions press Run within the window (see the module's docstring); the figures."""
    import random

    from gradio_client import Client

    questions = class_questions(args.class_size, args.distinct)
    clients = [Client(url, verbose=False) for _ in questions]
    counts_before = clients[0].predict(api_name="/run_counts")
    rng = random.Random(0)
    delays = sorted(rng.uniform(0, args.window) for _ in questions)
    outcomes: list[dict] = [{} for _ in questions]
    memory = MemoryWatch(server.pid)
    memory.peak = before = rss_mib(server.pid)
    memory.start()
    server_cpu, clients_cpu = cpu_seconds(server.pid), own_cpu_seconds()
    own_process_cpu = cpu_seconds(server.pid, workers=False)
    began = time.perf_counter()

    def press(index: int):
        time.sleep(delays[index])
        query, context = questions[index]
        started = time.perf_counter()
        try:
            out = clients[index].submit(pair="embedded", query=query, context=context or "", max_new_tokens=args.tokens,
                                        message_tokens=args.tokens, api_name="/run").result(timeout=args.request_timeout)
            outcomes[index] = {"ok": "finished" in out[0], "seconds": time.perf_counter() - started,
                               "answers": answers_of(out[-1]), "status": out[0][:200]}
        except Exception as error:  # noqa: BLE001
            outcomes[index] = {"ok": False, "seconds": time.perf_counter() - started, "status": f"{type(error).__name__}: {error}"[:200]}

    threads = [threading.Thread(target=press, args=(i,), daemon=True) for i in range(len(questions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(args.request_timeout + args.window)
    wall = time.perf_counter() - began
    server_cpu, clients_cpu = cpu_seconds(server.pid) - server_cpu, own_cpu_seconds() - clients_cpu
    own_process_cpu = cpu_seconds(server.pid, workers=False) - own_process_cpu
    memory.stop.set()
    counts_after = clients[0].predict(api_name="/run_counts")
    ok = [o for o in outcomes if o.get("ok")]
    times = [o["seconds"] for o in ok]
    report = {"class": args.class_size, "kind": "distinct" if args.distinct else "same preset", "window_s": args.window,
              "tokens": args.tokens, "answered": len(ok), "p50_s": percentile(times, 0.5), "p95_s": percentile(times, 0.95),
              "max_s": max(times, default=float("nan")), "wall_s": wall,
              **{k: counts_after[k] - counts_before[k] for k in ("computed", "joined", "cached", "refused")},
              "rss_before_mib": before, "rss_peak_mib": memory.peak, "rss_after_mib": rss_mib(server.pid),
              # the machine's CPU over the class: the server's, and these simulated learners' own (on one
              # machine here; in a room each learner's browser is on its own laptop)
              "server_cpu_s": server_cpu, "server_own_process_cpu_s": own_process_cpu, "clients_cpu_s": clients_cpu,
              "failures": [o["status"] for o in outcomes if not o.get("ok")][:5]}
    report["load_average"] = os.getloadavg()
    report["outcomes"] = outcomes
    return report


def serial_pass(args, env_extra: dict) -> dict:
    """The class's questions asked one after another, each alone, on a fresh server that keeps no
    finished run (``KVVIZ_RUN_CACHE_MB=0``): each answer is computed again, independently of the class's
    server, and the time of running them one after another is measured (the distinct target's 1x)."""
    from gradio_client import Client

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"kvviz-load-serial-{port}.log"
    server = start_server(port, args.concurrency, {**env_extra, "KVVIZ_RUN_CACHE_MB": "0"}, log_path)
    try:
        wait_until_up(url, server, 300)
        client = Client(url, verbose=False)
        live_run(client, WARM_UP, args.tokens).result(timeout=args.request_timeout)  # loads the models
        answers, seconds = [], []
        for query, context in dict.fromkeys(class_questions(args.class_size, args.distinct)):
            started = time.perf_counter()
            out = client.submit(pair="embedded", query=query, context=context or "", max_new_tokens=args.tokens,
                                message_tokens=args.tokens, api_name="/run").result(timeout=args.request_timeout)
            seconds.append(time.perf_counter() - started)
            answers.append(answers_of(out[-1]))
        return {"answers": answers, "seconds": seconds}
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


def with_serial(report: dict, serial: dict, distinct: bool) -> dict:
    """The class's report with the serial pass: answers that differ, one run alone, one after another."""
    outcomes = report.pop("outcomes")
    answers = serial["answers"] if distinct else serial["answers"] * len(outcomes)
    one_after_another = sum(serial["seconds"]) if distinct else serial["seconds"][0] * len(outcomes)
    return {**report, "differ_from_serial": sum(1 for o, a in zip(outcomes, answers) if o.get("ok") and o["answers"] != a),
            "serial_one_run_median_s": statistics.median(serial["seconds"]), "serial_all_s": one_after_another,
            "p95_over_serial_all": report["p95_s"] / one_after_another,
            "serial_note": "each question asked alone on a fresh server that keeps no finished run"}


def class_markdown(r: dict) -> str:
    rows = [("sessions, kind, window", f"{r['class']}, {r['kind']}, {r['window_s']:.0f} s ({r['tokens']} new tokens)"),
            ("answered", f"{r['answered']} / {r['class']}"),
            ("latency p50 / p95 / max (press to answer)", f"{r['p50_s']:.1f} s / {r['p95_s']:.1f} s / {r['max_s']:.1f} s"),
            ("runs computed / joined a run in flight / from the cache / refused",
             f"{r['computed']} / {r['joined']} / {r['cached']} / {r['refused']}"),
            ("answers that differ from the serial one (each asked alone on a fresh server without the run cache)",
             f"{r['differ_from_serial']}"),
            ("one run alone (median of the serial pass) / the class's questions one after another",
             f"{r['serial_one_run_median_s']:.1f} s / {r['serial_all_s']:.1f} s"),
            ("p95 over one after another", f"{r['p95_over_serial_all']:.2f}x"),
            ("wall time", f"{r['wall_s']:.1f} s"),
            ("server memory before / peak / after", f"{r['rss_before_mib']:.0f} / {r['rss_peak_mib']:.0f} / {r['rss_after_mib']:.0f} MiB"),
            ("CPU seconds over the class: server with its workers (its own process) / these simulated learners "
             "(one machine here)", f"{r['server_cpu_s']:.1f} ({r['server_own_process_cpu_s']:.1f}) / {r['clients_cpu_s']:.1f}"),
            ("load average (1, 5, 15 min) at the end", ", ".join(f"{x:.2f}" for x in r["load_average"]))]
    lines = [f"`{r['command']}`", "", "| measure | value |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    if r["failures"]:
        lines += ["", "Failures: " + "; ".join(r["failures"])]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--requests", type=int, default=5, help="requests per session")
    parser.add_argument("--tokens", type=int, default=8, help="max new tokens per live run")
    parser.add_argument("--mix", default="typed", help="kinds and weights, e.g. typed:3,preset:1,bad:1,cancel:1")
    parser.add_argument("--concurrency", type=int, default=None, help="KVVIZ_CONCURRENCY for the server (default: its own)")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server (repeatable)")
    parser.add_argument("--cancel-after", type=float, default=1.0)
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument("--time-limit", type=float, default=1800.0, help="no request starts after this many seconds")
    parser.add_argument("--json", default=None, help="write the numbers here")
    parser.add_argument("--memory-after", type=int, default=None, metavar="N",
                        help="also record the server's memory once N requests are answered (the soak)")
    parser.add_argument("--log", default=None, help="the server's log (default: a temporary file)")
    parser.add_argument("--class", dest="class_size", type=int, default=None, metavar="N",
                        help="a class at once: N sessions press Run within --window seconds")
    same = parser.add_mutually_exclusive_group()
    same.add_argument("--same-preset", action="store_true", help="with --class: every session on one question")
    same.add_argument("--distinct", action="store_true", help="with --class: a question per session")
    parser.add_argument("--window", type=float, default=10.0, help="with --class: seconds within which they press Run")
    args = parser.parse_args()
    if args.class_size is not None and (args.class_size < 1 or not (args.same_preset or args.distinct)):
        parser.error("--class N needs N >= 1 and one of --same-preset or --distinct")

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from gradio_client import Client

    from kvviz.app.presets import PRESETS

    presets = [p.key for p in PRESETS]
    pattern = parse_mix(args.mix)
    env_extra = dict(item.split("=", 1) for item in args.env)
    if args.class_size is None:  # the load and the soak repeat their questions: measure computed runs, not the cache
        env_extra.setdefault("KVVIZ_RUN_CACHE_MB", "0")
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    log_path = Path(args.log) if args.log else Path(os.environ.get("TMPDIR", "/tmp")) / f"kvviz-load-{port}.log"
    server = start_server(port, args.concurrency, env_extra, log_path)
    memory = MemoryWatch(server.pid)
    try:
        wait_until_up(url, server, 300)
        client = Client(url, verbose=False)
        print(f"server up on {url} (log {log_path}); warming up and asking each question alone ...", file=sys.stderr)
        # loads the models (a class warms up on a question that is none of its own)
        live_run(client, WARM_UP if args.class_size is not None else 0, args.tokens).result(timeout=args.request_timeout)
        if args.class_size is not None:
            report = {"command": "python scripts/load_test.py " + " ".join(sys.argv[1:]), **class_at_once(url, server, args)}
            server.terminate()  # the serial pass runs on a server of its own, alone on the machine
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
            report = with_serial(report, serial_pass(args, env_extra), args.distinct)
            if args.json:
                Path(args.json).write_text(json.dumps(report, indent=2))
            print(class_markdown(report))
            return 0
        serial, serial_seconds = {}, []
        for index in range(len(QUESTIONS)):
            started = time.perf_counter()
            serial[index] = answers_of(live_run(client, index, args.tokens).result(timeout=args.request_timeout)[-1])
            serial_seconds.append(time.perf_counter() - started)
        before = rss_mib(server.pid)
        memory.peak = before
        memory.start()

        outcomes: list[Outcome] = []
        marks: dict[str, float] = {}
        lock = threading.Lock()
        deadline = time.monotonic() + args.time_limit

        def session(number: int):
            own = Client(url, verbose=False)
            for request in range(args.requests):
                if time.monotonic() > deadline:
                    return
                kind = pattern[(number + request) % len(pattern)]
                outcome = one_request(own, kind, (number + request) % len(QUESTIONS), args, presets)
                with lock:
                    outcomes.append(outcome)
                    if args.memory_after and len(outcomes) == args.memory_after:
                        marks["after_first"] = rss_mib(server.pid)

        print(f"{args.sessions} sessions x {args.requests} requests ({args.mix}) ...", file=sys.stderr)
        started = time.perf_counter()
        threads = [threading.Thread(target=session, args=(n,), daemon=True) for n in range(args.sessions)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(args.time_limit + args.request_timeout)
        wall = time.perf_counter() - started
        time.sleep(3)  # let cancelled runs stop and the server settle
        after_load = rss_mib(server.pid)
        memory.stop.set()
        try:
            normal_after = "finished" in live_run(client, 2, args.tokens).result(timeout=args.request_timeout)[0]
        except Exception as error:
            normal_after = False
            print(f"the normal request afterwards failed: {error}", file=sys.stderr)
        after = rss_mib(server.pid)
    finally:
        memory.stop.set()
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()

    log = log_path.read_text(errors="replace")
    counts = {status: sum(o.status == status for o in outcomes) for status in ("completed", "refused", "rejected", "cancelled", "failed")}
    differ = [o for o in outcomes if o.kind == "typed" and o.status == "completed" and o.answers != serial[o.question]]
    live = [o.seconds for o in outcomes if o.kind == "typed" and o.status == "completed"]
    every = [o.seconds for o in outcomes if o.status in ("completed", "refused")]
    server_errors = len(server_errors_in(log))
    report = {
        "command": "python scripts/load_test.py " + " ".join(sys.argv[1:]),
        "sessions": args.sessions, "requests_per_session": args.requests, "tokens": args.tokens, "mix": args.mix,
        "concurrency": args.concurrency or "default", "server_env": env_extra,
        "requests": len(outcomes), **counts,
        "differ_from_serial": len(differ),
        "p50_s_all": percentile(every, 0.5), "p95_s_all": percentile(every, 0.95),
        "p50_s_live": percentile(live, 0.5), "p95_s_live": percentile(live, 0.95),
        "serial_run_s_median": statistics.median(serial_seconds),
        "wall_s": wall, "server_errors": server_errors,
        "rss_before_mib": before, "rss_peak_mib": memory.peak, "rss_after_load_mib": after_load, "rss_after_mib": after,
        "rss_after_vs_before": (after - before) / before,
        "normal_request_after": normal_after,
        "memory_after_first": args.memory_after,
        "rss_after_first_mib": marks.get("after_first"),
        "rss_end_vs_after_first": (after_load - marks["after_first"]) / marks["after_first"] if "after_first" in marks else None,
        "failures": [f"{o.kind}: {o.detail}" for o in outcomes if o.status == "failed"][:10],
        "server_error_lines": server_errors_in(log)[:10],
        "load_average": os.getloadavg(),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print(markdown(report))
    return 0


def markdown(r: dict) -> str:
    rows = [
        ("sessions x requests", f"{r['sessions']} x {r['requests_per_session']} ({r['mix']}, {r['tokens']} new tokens)"),
        ("model runs at once (KVVIZ_CONCURRENCY)", f"{r['concurrency']}" + (f", {r['server_env']}" if r["server_env"] else "")),
        ("completed / refused (bad input) / rejected (queue full) / cancelled / failed",
         f"{r['completed']} / {r['refused']} / {r['rejected']} / {r['cancelled']} / {r['failed']}"),
        ("answers that differ from the serial ones", f"{r['differ_from_serial']}"),
        ("server errors (5xx other than queue full, tracebacks)", f"{r['server_errors']}"),
        ("latency p50 / p95, live runs", f"{r['p50_s_live']:.1f} s / {r['p95_s_live']:.1f} s"),
        ("latency p50 / p95, every answered request", f"{r['p50_s_all']:.1f} s / {r['p95_s_all']:.1f} s"),
        ("one live run alone (median)", f"{r['serial_run_s_median']:.1f} s"),
        ("wall time of the load", f"{r['wall_s']:.0f} s"),
        ("server memory before / peak / after", f"{r['rss_before_mib']:.0f} / {r['rss_peak_mib']:.0f} / {r['rss_after_mib']:.0f} MiB "
         f"({r['rss_after_vs_before']:+.1%} after vs before)"),
        ("a normal request afterwards", "answered" if r["normal_request_after"] else "FAILED"),
        *([(f"server memory after the first {r['memory_after_first']} requests / at the end of the load",
            f"{r['rss_after_first_mib']:.0f} / {r['rss_after_load_mib']:.0f} MiB ({r['rss_end_vs_after_first']:+.1%})")]
          if r.get("rss_after_first_mib") else []),
        ("machine load average (1, 5, 15 min) at the end", ", ".join(f"{x:.1f}" for x in r["load_average"])),
    ]
    lines = [f"`{r['command']}`", "", "| measure | value |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    if r["failures"]:
        lines += ["", "Failures: " + "; ".join(r["failures"])]
    if r["server_error_lines"]:
        lines += ["", "Server errors: " + "; ".join(r["server_error_lines"])]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
