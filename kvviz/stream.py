"""Run handoffs in a worker thread and stream what happens: the engine, for a page.

``stream_handoffs`` yields events as they happen so that a page can show each answer token by
token while the handoffs run one after another on a shared pair of models.
"""

from __future__ import annotations

import queue
import threading
from typing import Iterable, Iterator

from kvviz.results import HandoffRequest


class Cancelled(Exception):
    """Raised inside a token callback to stop a run the user left or cancelled."""


def stream_handoffs(pair_name: str, request: HandoffRequest, names: Iterable[str]) -> Iterator[tuple[str, str | None, object]]:
    """Run the handoffs one after another in a worker thread; yield ``(kind, name, data)`` events:
    ``status`` (a progress line), ``start``, ``token`` (answer so far), ``done`` (result dict),
    ``error`` (a message).

    Handoffs that cannot run on this pair or request are ``done`` at once, before any model runs,
    so that their columns never wait behind the others.

    Closing the generator (the user cancelled or left) stops the worker at its next token.
    """
    from kvviz.engine import load_pair, not_applicable, run_handoff

    names = list(names)
    events: queue.Queue = queue.Queue()
    cancel = threading.Event()

    def worker():
        try:
            events.put(("status", None, f"Loading the pair '{pair_name}' (once per server) ..."))
            pair = load_pair(pair_name, progress=lambda message: events.put(("status", None, str(message))))
            runnable = []
            for name in names:
                refused = not_applicable(name, pair, request)
                if refused is None:
                    runnable.append(name)
                else:
                    events.put(("done", name, refused.to_dict()))
            for name in runnable:
                if cancel.is_set():
                    return
                events.put(("start", name, None))

                def on_token(text, _name=name):
                    if cancel.is_set():
                        raise Cancelled()
                    events.put(("token", _name, text))

                result = run_handoff(name, pair, request, on_token=on_token)
                events.put(("done", name, result.to_dict()))
        except Cancelled:
            pass
        except Exception as error:  # shown to the user; the server keeps running
            events.put(("error", None, f"{type(error).__name__}: {error}"))
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
