"""Run handoffs in a worker thread and stream what happens: the engine, for a page.

``stream_handoffs`` yields events as they happen so that a page can show each answer token by
token while the handoffs run one after another on a shared pair of models.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Iterable, Iterator

from kvviz import policy
from kvviz.results import HandoffRequest


class Cancelled(BaseException):
    """Raised inside a token callback to stop a run the user left or cancelled, or that ran out of
    time. A BaseException, like KeyboardInterrupt: no ``except Exception`` in a handoff swallows it."""


def stream_handoffs(
    pair_name: str, request: HandoffRequest, names: Iterable[str], max_seconds: float | None = None
) -> Iterator[tuple[str, str | None, object]]:
    """Run the handoffs one after another in a worker thread; yield ``(kind, name, data)`` events:
    ``status`` (a progress line), ``start``, ``token`` (answer so far), ``done`` (result dict),
    ``stopped`` (the run reached ``max_seconds``: why; the handoffs not done did not run),
    ``error`` (a message: the run could not start).

    Closing the generator (the user cancelled or left) stops the worker at its next token.
    ``max_seconds`` defaults to the policy's cap (``kvviz.policy``; none locally).
    """
    from kvviz.engine import check_fits, load_pair, run_handoff

    names = list(names)
    events: queue.Queue = queue.Queue()
    cancel = threading.Event()
    max_seconds = policy.caps().max_run_seconds if max_seconds is None else max_seconds
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    out_of_time = f"Stopped: this server allows {max_seconds or 0:g} s per run; the handoffs not finished did not run."

    def worker():
        try:
            events.put(("status", None, f"Loading the pair '{pair_name}' (once per server) ..."))
            pair = load_pair(pair_name, progress=lambda message: events.put(("status", None, str(message))))
            check_fits(pair, request)
            for name in names:
                if cancel.is_set():
                    return
                if deadline is not None and time.monotonic() > deadline:
                    events.put(("stopped", None, out_of_time))
                    return
                events.put(("start", name, None))

                def on_token(text, _name=name):
                    if cancel.is_set():
                        raise Cancelled()
                    if deadline is not None and time.monotonic() > deadline:
                        raise Cancelled(out_of_time)
                    events.put(("token", _name, text))

                result = run_handoff(name, pair, request, on_token=on_token)
                events.put(("done", name, result.to_dict()))
        except Cancelled as stop:
            if stop.args:
                events.put(("stopped", None, stop.args[0]))
        except Exception as error:  # shown to the user; the server keeps running
            said = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
            events.put(("error", None, said))
        finally:
            events.put(("end", None, None))

    thread = threading.Thread(target=worker, name="kvviz-run", daemon=True)
    thread.start()
    try:
        while True:
            event = events.get()
            if event[0] == "end":
                return
            yield event
    finally:
        cancel.set()
