"""The workshop's pages: plain HTML over the JSON API (``api``), so that they load fast on a phone and
on a projector. The HTML, CSS and JavaScript are files in ``static/`` (served at
``/workshop/static/``); a page's template gets only its class code and the server's limits. Every
text that comes from the server or a person is put in the page with ``textContent`` (never as HTML),
and what a person typed sits in ``<bdi>``. The host board and the learner's page poll the API, so a
prediction shows on the board within a second of being made.

Pages: ``/workshop`` (join a class or make one), ``/workshop/class/<code>`` (a learner's),
``/workshop/host/<code>`` (the host's board; the host token in this tab's session storage) and
``/workshop/projector/<code>`` (the board in large type, read with the read-only projector key).
"""

from __future__ import annotations

import html
from functools import lru_cache
from pathlib import Path
from string import Template

from kvviz.store.values import MAX_CODE, MAX_NAME, MAX_VALUE

STATIC = Path(__file__).resolve().parent / "static"
# the pages run only their own files: no inline script or style, nothing from elsewhere
HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; frame-ancestors 'self'",
           "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff"}


@lru_cache(maxsize=None)
def _template(name: str) -> Template:
    return Template((STATIC / f"{name}.html").read_text(encoding="utf-8"))


def _page(name: str, **values) -> str:
    limits = {"max_code": MAX_CODE, "max_name": MAX_NAME, "max_value": MAX_VALUE}
    return _template(name).substitute({key: html.escape(str(value)) for key, value in {**limits, **values}.items()})


def page_code(code: str) -> str:
    """A class code from a page's address, as the store spells codes (letters and digits, upper case)."""
    return "".join(ch for ch in code.upper() if ch.isascii() and ch.isalnum())[:MAX_CODE]


def landing() -> str:
    return _page("landing")


def learner(code: str) -> str:
    return _page("learner", code=page_code(code))


def host(code: str) -> str:
    return _page("host", code=page_code(code))


def projector(code: str) -> str:
    return _page("projector", code=page_code(code))
