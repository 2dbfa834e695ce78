"""Who is calling and what a request may do before a workshop route runs, and the one way every
refusal is answered: ``{"error": one line}`` with its HTTP status.

* **Who is calling** (``caller``, the routes' one dependency): the credentials a request carries in
  its headers and its client's address.
* **Every POST is JSON from the workshop's own pages** (``json_from_this_site``): a body sent as
  anything but ``Content-Type: application/json`` gets 415, and one from another site (the
  browser's ``Sec-Fetch-Site``, else its ``Origin``) 403, so that a page elsewhere cannot make
  classes or runs through its visitors' browsers.
* **Bodies are bounded before they are read** (``BodyLimit``: ``BODY_BYTES``, a saved run up to its
  cap): a body that declares a larger length gets 413 before a byte of it is read, one that streams
  past the limit gets 413 there; a body that does not fit its typed model gets 400 with one line
  that never repeats what was sent.
* **One client's allowance** (``Allowance``, the ``limits`` package's moving windows in the server's
  memory): how many classes and saved runs an address may make (``policy.workshop_caps()``), taken
  only after the request's form was accepted. The address is the connection's, or, behind a
  trusted proxy, the one it forwards: uvicorn reads ``X-Forwarded-For`` from the proxies named in
  ``FORWARDED_ALLOW_IPS`` (default: this machine, 127.0.0.1 and ::1) and from no one else.
* **A store that cannot be written** (read-only, full, gone) answers 503 in one line; where the
  store is goes to the server's log, never to the page. The rest of the app keeps serving.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from limits import parse_many
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvviz.core.policy import WorkshopCaps
from kvviz.store.database import UNWRITABLE
from kvviz.store.values import Refused

LOG = logging.getLogger("kvviz.app.workshop")
BODY_BYTES = 16_384  # every workshop request but a saved run
HOST_SESSION_CHARS = 64
WORKSHOP_PATHS = ("/workshop", "/r/")
STORE_DOWN = UNWRITABLE  # the one line of a store that cannot be written
HTTP_LINES = {404: "There is no such workshop page or route.", 405: "This workshop route does not take that method."}


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def refusal(line: str, status: int) -> JSONResponse:
    return JSONResponse({"error": one_line(line)}, status_code=status)


def too_large(limit: int) -> str:
    return f"This request's body is over {limit / 1024:.0f} kB, the most this workshop route takes."


class BodyTooLarge(HTTPException):
    """A body that streamed past its limit (FastAPI passes an HTTPException raised while it reads the
    body on to the handlers)."""

    def __init__(self, limit: int):
        super().__init__(413, too_large(limit))


class BodyLimit:
    """ASGI middleware: a workshop request's body is at most ``limit_of(path)`` bytes (None: no limit),
    refused with 413 as soon as its declared length, or the bytes read so far, pass it."""

    def __init__(self, app: ASGIApp, limit_of: Callable[[str], int | None]):
        self.app, self.limit_of = app, limit_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.limit_of(scope["path"]) if scope["type"] == "http" else None
        if limit is None:
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"").decode("latin-1").strip()
        if declared.isdigit() and int(declared) > limit:
            response = refusal(too_large(limit), 413)
            response.headers["Connection"] = "close"  # the rest of the body is not read
            return await response(scope, receive, send)
        read = 0

        async def counted() -> Message:
            nonlocal read
            message = await receive()
            read += len(message.get("body", b""))
            if read > limit:
                raise BodyTooLarge(limit)
            return message

        await self.app(scope, counted, send)


def json_from_this_site(request: Request) -> None:
    """A route's dependency: its POST is JSON, sent from a page of this server. A browser says where a
    request comes from in ``Sec-Fetch-Site`` (no page can set it; it holds behind a proxy that
    rewrites ``Host``); without it (an older browser, a script), the ``Origin`` must name this host."""
    site, origin = request.headers.get("sec-fetch-site"), request.headers.get("origin")
    if site is not None:
        foreign = site not in ("same-origin", "none")
    else:
        foreign = origin is not None and urlsplit(origin).netloc.lower() != request.headers.get("host", "").lower()
    if foreign:
        raise Refused("The workshop takes requests from its own pages only; this one came from another site.", 403)
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise Refused("Send the body as JSON (Content-Type: application/json).", 415)


@dataclass(frozen=True)
class Caller:
    """Who is calling: the credentials a request carries (each empty when absent) and its client's
    address. The store decides what each may do."""

    address: str
    host_token: str  # header X-Host-Token: the host page's, from its tab's session storage
    host_session: str  # header X-Host-Session: which host page (one at a time holds a class)
    projector_key: str  # header X-Projector-Key: the class's read-only key
    learner_token: str  # header X-Learner-Token: a learner's session


async def caller(request: Request) -> Caller:
    """The routes' one dependency for who is calling."""
    headers = request.headers
    return Caller(request.client.host if request.client else "unknown", headers.get("x-host-token", ""),
                  headers.get("x-host-session", "")[:HOST_SESSION_CHARS], headers.get("x-projector-key", ""),
                  headers.get("x-learner-token", ""))


class Allowance:
    """What one client may make: classes (``creates_per_client``) and saved runs (``saves_per_client``)."""

    WHAT = {"create": "new classes", "save": "saved runs"}

    def __init__(self, caps: WorkshopCaps):
        self.limiter = MovingWindowRateLimiter(MemoryStorage())
        self.rates = {"create": parse_many(caps.creates_per_client), "save": parse_many(caps.saves_per_client)}

    def take(self, kind: str, caller: Caller) -> None:
        """Count one of ``kind`` for this caller's address, or refuse it (429) saying when to try again."""
        who = caller.address
        for rate in self.rates[kind]:
            if not self.limiter.hit(rate, kind, who):
                wait = math.ceil(self.limiter.get_window_stats(rate, kind, who).reset_time - time.time())
                when = f"{wait} s" if wait < 120 else f"{math.ceil(wait / 60)} minutes"
                raise Refused(f"Too many {self.WHAT[kind]} from your address (at most {rate}): try again in {when}.", 429)


def validation_line(errors: list[dict]) -> str:
    """One line for a body (or a path) that does not fit its model, without what was sent."""
    first = errors[0] if errors else {}
    kind, where, message = first.get("type", ""), tuple(first.get("loc", ())), first.get("msg", "")
    field = ascii(".".join(str(part) for part in where[1:]))[1:-1][:40] or "the body"
    if kind == "json_invalid":
        return f"The body is not valid JSON ({(first.get('ctx') or {}).get('error', 'unreadable')}, at character {where[-1]})."
    if where == ("body",):
        return "This request needs a JSON object as its body." if kind == "missing" else "The body must be a JSON object."
    if message.startswith("Value error, "):
        return message[len("Value error, "):]
    if kind == "extra_forbidden":  # its name is what was sent: not repeated
        return "This request holds a field it does not take."
    if kind == "missing":
        return f"The field {field!r} is missing."
    return f"{field}: {message}."


def on_workshop(request: Request) -> bool:
    return request.url.path.startswith(WORKSHOP_PATHS)


def handlers(store_label: str) -> dict:
    """The exception handlers for ``FastAPI(exception_handlers=...)`` (Gradio's ``app_kwargs``): the
    workshop's routes answer one line; the rest of the app keeps FastAPI's own answers."""

    async def refused(_request: Request, error: Refused) -> JSONResponse:
        return refusal(error.line, error.status)

    async def invalid(request: Request, error: RequestValidationError):
        if not on_workshop(request):
            return await request_validation_exception_handler(request, error)
        return refusal(validation_line(list(error.errors())), 400)

    async def http_error(request: Request, error: HTTPException):
        if not on_workshop(request):
            return await http_exception_handler(request, error)
        line = error.detail if isinstance(error, BodyTooLarge) else HTTP_LINES.get(error.status_code, error.detail)
        return refusal(str(line), error.status_code)

    async def store_down(request: Request, error: Exception):
        if not on_workshop(request):
            raise error
        cause = getattr(error, "orig", None) or error  # the driver's own error, without the statement and its values
        LOG.error("The workshop's store (%s) failed on %s %s: %s: %s", store_label, request.method, request.url.path,
                  type(cause).__name__, one_line(str(cause))[:300])
        return refusal(STORE_DOWN, 503)

    return {Refused: refused, RequestValidationError: invalid, HTTPException: http_error,
            SQLAlchemyError: store_down, OSError: store_down}
