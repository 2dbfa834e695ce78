"""One client's allowance: how many classes and saved runs one address may make in a while
(``policy.workshop_caps()``: ``creates_per_client``, ``saves_per_client``), counted in the ``limits``
package's moving windows in this server's memory. The workshop's routes and the lab page's *Save run*
each take from one; a refusal is a ``Refused`` (429) that says when to try again."""

from __future__ import annotations

import math
import time

from limits import parse_many
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from kvviz.core.policy import WorkshopCaps
from kvviz.store.values import Refused


class Allowance:
    """What one client may make: classes (``creates_per_client``) and saved runs (``saves_per_client``)."""

    WHAT = {"create": "new classes", "save": "saved runs"}

    def __init__(self, caps: WorkshopCaps):
        self.limiter = MovingWindowRateLimiter(MemoryStorage())
        self.rates = {"create": parse_many(caps.creates_per_client), "save": parse_many(caps.saves_per_client)}

    def take(self, kind: str, address: str) -> None:
        """Count one of ``kind`` for this client's address, or refuse it (429) saying when to try again."""
        for rate in self.rates[kind]:
            if not self.limiter.hit(rate, kind, address):
                wait = math.ceil(self.limiter.get_window_stats(rate, kind, address).reset_time - time.time())
                when = f"{wait} s" if wait < 120 else f"{math.ceil(wait / 60)} minutes"
                raise Refused(f"Too many {self.WHAT[kind]} from your address (at most {rate}): try again in {when}.", 429)
