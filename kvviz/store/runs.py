"""Saved runs: a page's state and results kept under a short id, so that ``/r/<id>`` reopens them
without a model. Anyone may save a run (within ``policy.workshop_caps()``: how many are kept, how
large one may be); a host may pin saved runs to its class, and the class's learners see them."""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timezone

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from kvviz.core.policy import WorkshopCaps, workshop_caps
from kvviz.store.classes import Refused, Workshop
from kvviz.store.tables import Learner, SavedRun

ID_LETTERS = "abcdefghjkmnpqrstuvwxyz23456789"
ID_LENGTH = 7  # 31^7: about 27 billion ids; "/r/abc2345" is 10 characters


class SavedRuns:
    def __init__(self, engine: Engine, caps: WorkshopCaps | None = None):
        self.engine = engine
        self.caps = caps or workshop_caps()

    def save(self, title: str, link: str, results: dict) -> str:
        """Keep a run; its short id. ``link``: the page's state as its link's query string."""
        body = json.dumps(results, separators=(",", ":"))
        size = len(body.encode("utf-8")) + len(link.encode("utf-8"))
        if size > self.caps.max_saved_run_bytes:
            raise Refused(f"This run is {size / 1e6:.1f} MB; a saved run holds at most "
                          f"{self.caps.max_saved_run_bytes / 1e6:.1f} MB here.", 413)
        with Session(self.engine) as session, session.begin():
            if session.scalar(select(func.count(SavedRun.id))) >= self.caps.max_saved_runs:
                raise Refused(f"This server keeps at most {self.caps.max_saved_runs} saved runs; none can be added now.", 429)
            run_id = self._free_id(session)
            session.add(SavedRun(id=run_id, created_at=datetime.now(timezone.utc), title=(title or "kvviz run")[:200],
                                 link=link, results=results, size=size))
        return run_id

    def _free_id(self, session: Session) -> str:
        for _ in range(50):
            run_id = "".join(secrets.choice(ID_LETTERS) for _ in range(ID_LENGTH))
            if session.get(SavedRun, run_id) is None:
                return run_id
        raise Refused("No free id was found for this run; try again.", 503)

    def get(self, run_id: str) -> dict:
        with Session(self.engine) as session:
            run = session.get(SavedRun, (run_id or "").strip().lower())
            if run is None:
                raise Refused(f"No saved run has the id {run_id!r}.", 404)
            return {"id": run.id, "title": run.title, "link": run.link, "results": run.results,
                    "created_at": run.created_at.isoformat()}

    def pin(self, workshop: Workshop, code: str, host_token: str, run_id: str) -> None:
        """The host pins a saved run to its class."""
        with Session(self.engine) as session, session.begin():
            klass = workshop.hosted(session, code, host_token)
            run = session.get(SavedRun, run_id)
            if run is None:
                raise Refused(f"No saved run has the id {run_id!r}.", 404)
            run.class_id = klass.id

    def pinned(self, workshop: Workshop, learner_token: str) -> list[dict]:
        """The saved runs pinned to a learner's class: id and title."""
        with Session(self.engine) as session:
            learner: Learner = workshop.learner_of(session, learner_token)
            runs = session.scalars(select(SavedRun).where(SavedRun.class_id == learner.class_id)
                                   .order_by(SavedRun.created_at)).all()
            return [{"id": run.id, "title": run.title} for run in runs]
