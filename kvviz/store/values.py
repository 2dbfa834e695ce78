"""What the store keeps of what people send, and how it says no: the one-line refusal (``Refused``),
class codes, display names and predictions cleaned by kvviz's one text rule
(``kvviz.core.limits.clean_line``), the digests of tokens (only those are stored), the projector's
read-only key, and a CSV cell a spreadsheet shows as text."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from datetime import datetime, timezone

from kvviz.core import limits

MAX_CODE = 12
MAX_NAME = 24
MAX_VALUE = 80
# markup or a link in a display name: it is shown to the room, so it is refused, not escaped and kept
_MARKUP = re.compile(r"[<>&\"`{}\[\]\\|=*_#~$]|://|^\s*[-+@]")
# a spreadsheet reads a cell that starts so as a formula; a plain number ("-3", "+0.5") stays a number
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?")


class Refused(Exception):
    """A request the store will not do: ``line`` says why in one line, ``status`` for HTTP."""

    def __init__(self, line: str, status: int = 400):
        super().__init__(line)
        self.line = line
        self.status = status


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def utc(moment: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes: they were written in UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=timezone.utc)


def cleaned(text: str | None, field: str, limit: int) -> str:
    """A one-line text by kvviz's one rule (``kvviz.core.limits.clean_line``), or a Refused in one line."""
    try:
        return limits.clean_line(text, field, limit)
    except ValueError as error:
        raise Refused(str(error)) from None


def class_code(code: str | None) -> str:
    """A class code as typed (any case, spaces around it), as the store keeps it."""
    return cleaned(code, "The class code", MAX_CODE).upper()


def display_name(name: str | None) -> str:
    """A learner's display name, cleaned, or a Refused saying what is wrong with it."""
    name = cleaned(name, "The name", MAX_NAME)
    if not name:
        raise Refused("Type a display name to join.")
    if _MARKUP.search(name) or any(not ch.isprintable() for ch in name):
        raise Refused("Use letters, digits, spaces and simple punctuation in the name: no markup or links.")
    return name


def prediction_value(value: str | None) -> str:
    value = cleaned(value, "A prediction", MAX_VALUE)
    if not value:
        raise Refused(f"A prediction is 1 to {MAX_VALUE} characters.")
    return value


def spreadsheet_cell(value: str) -> str:
    """A CSV cell that a spreadsheet shows as text: one that would start a formula gets a leading quote."""
    if value.startswith(_FORMULA_START) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


def projector_key(host_token: str, code: str) -> str:
    """The class's read-only key for the projector, derived from the host token (so a host link opened
    anywhere gives the same one) and never the token itself."""
    mac = hmac.new(host_token.encode("utf-8"), f"projector:{code}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac[:18]).decode()
