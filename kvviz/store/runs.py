"""Saved runs: a page's state and results kept under a short id, so that ``/r/<id>`` reopens them
without a model. Anyone may save a run within ``policy.workshop_caps()``: how large one may be, how
many are kept and how many bytes all of them hold (counted under the store's write lock, so that
saves at once never pass them; when a new run does not fit, the oldest runs pinned to no class make
room), and how long one is kept (``saved_run_days``: an expired run is deleted at the next save). A
host may pin saved runs to its class, and the class's learners see them.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Callable

from sqlalchemy import Engine, delete, func, select
from sqlalchemy.orm import Session

from kvviz.core import limits
from kvviz.core.policy import WorkshopCaps, workshop_caps
from kvviz.store.classes import Workshop
from kvviz.store.database import free_key, locked, reading, writing
from kvviz.store.tables import Learner, SavedRun
from kvviz.store.values import Refused, cleaned, utc

ID_LETTERS = "abcdefghjkmnpqrstuvwxyz23456789"
ID_LENGTH = 7  # 31^7: about 27 billion ids; "/r/abc2345" is 10 characters
MAX_TITLE = 200
MAX_LINK = 20_000  # the page's state as its link's query string
RESULTS_NOT_TEXT = "The results hold an invalid character (a lone UTF-16 surrogate); they are not text."


class SavedRuns:
    def __init__(self, engine: Engine, caps: WorkshopCaps | None = None, clock: Callable[[], datetime] | None = None):
        self.engine = engine
        self.caps = caps or workshop_caps()
        self.clock = clock or (lambda: datetime.now(timezone.utc))

    def save(self, title: str, link: str, results: dict) -> str:
        """Keep a run; its short id. ``link``: the page's state as its link's query string."""
        title = cleaned(title, "The title", MAX_TITLE) or "kvviz run"
        link = cleaned(link, "The link", MAX_LINK)
        body = json.dumps(results, separators=(",", ":"), ensure_ascii=False)
        if limits.has_surrogate(body):
            raise Refused(RESULTS_NOT_TEXT)
        size = len(body.encode("utf-8")) + len(link.encode("utf-8"))
        if size > self.caps.max_saved_run_bytes:
            raise Refused(f"This run is {size / 1e6:.1f} MB; a saved run holds at most "
                          f"{self.caps.max_saved_run_bytes / 1e6:.1f} MB here.", 413)
        now = self.clock()
        with writing(self.engine, "saved_runs") as session:
            session.execute(delete(SavedRun).where(SavedRun.expires_at <= now))
            self._make_room(session, size)
            run_id = free_key(session, SavedRun.id, ID_LETTERS, ID_LENGTH)
            if run_id is None:
                raise Refused("No free id was found for this run; try again.", 503)
            session.add(SavedRun(id=run_id, created_at=now, expires_at=now + timedelta(days=self.caps.saved_run_days),
                                 title=title, link=link, results=results, size=size))
        return run_id

    def _make_room(self, session: Session, size: int) -> None:
        """Room for one more run of ``size`` bytes within the caps: the oldest runs pinned to no class go
        first; when the pinned ones alone fill the store, the run is refused."""
        count, held = session.execute(select(func.count(SavedRun.id), func.coalesce(func.sum(SavedRun.size), 0))).one()
        fits = lambda: count < self.caps.max_saved_runs and held + size <= self.caps.max_saved_bytes  # noqa: E731
        if fits():
            return
        oldest = session.execute(select(SavedRun.id, SavedRun.size).where(SavedRun.class_id.is_(None))
                                 .order_by(SavedRun.created_at)).yield_per(256)
        going = []
        for run_id, run_size in oldest:
            going.append(run_id)
            count, held = count - 1, held - run_size
            if fits():
                break
        if not fits():
            raise Refused(f"This server keeps at most {self.caps.max_saved_runs} saved runs and "
                          f"{self.caps.max_saved_bytes / 1e6:.0f} MB of them, pinned to classes; this one does not fit now.", 429)
        session.execute(delete(SavedRun).where(SavedRun.id.in_(going)))

    def _run(self, session: Session, run_id: str, lock: bool = False) -> SavedRun:
        run_id = cleaned(run_id, "The run's id", 16).lower()
        query = select(SavedRun).where(SavedRun.id == run_id)
        run = session.scalar(locked(query) if lock else query)
        if run is None or utc(run.expires_at) <= self.clock():
            raise Refused(f"No saved run has the id {run_id!r}.", 404)
        return run

    def get(self, run_id: str) -> dict:
        with reading(self.engine) as session:
            run = self._run(session, run_id)
            return {"id": run.id, "title": run.title, "link": run.link, "results": run.results,
                    "created_at": utc(run.created_at).isoformat(), "expires_at": utc(run.expires_at).isoformat()}

    def pin(self, workshop: Workshop, code: str, host_token: str, run_id: str) -> None:
        """The host pins a saved run to its class (one that no other class has pinned)."""
        with writing(self.engine) as session:
            klass = workshop.hosted(session, code, host_token, lock=True)
            run = self._run(session, run_id, lock=True)
            if run.class_id not in (None, klass.id):
                raise Refused("This run is pinned to another class: save it again to pin it here.", 409)
            run.class_id = klass.id

    def pinned(self, workshop: Workshop, learner_token: str) -> list[dict]:
        """The saved runs pinned to a learner's class: id and title."""
        with reading(self.engine) as session:
            learner: Learner = workshop.learner_of(session, learner_token)
            runs = session.scalars(select(SavedRun).where(SavedRun.class_id == learner.class_id,
                                                          SavedRun.expires_at > self.clock())
                                   .order_by(SavedRun.created_at)).all()
            return [{"id": run.id, "title": run.title} for run in runs]
