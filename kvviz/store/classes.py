"""Classes and who may do what in them: the host, its learners, their predictions.

``Workshop(engine)`` is everything the app may do with a class, and it checks who asks:

* **the host** makes a class (``create_class``: a short code for the projector and a secret host
  token, returned once and stored as its SHA-256) and, with that token, opens exercises one by one
  or lets the class go at its own pace, reveals them, reads the board with names, exports the
  answers as CSV and deletes the class. Host changes also name the host page's session: a second
  host page on the same class is refused until the first has been quiet for the lease
  (``policy.workshop_caps().host_lease_seconds``) or it takes over;
* **a learner** joins with the code and a display name (no account) and gets a session token; with
  it they predict (once per exercise, while it is open), read their own answers and, after the
  reveal, the room's counts. Nothing a learner can call returns another learner's name or answers;
* **the projector** reads the board without names, with the class's read-only key.

Every refusal is a ``Refused`` (``values``) with one line for the person and an HTTP status for the
API. Caps (classes alive, learners per class, predictions per minute per session, class lifetime and
an empty class's shorter one) come from ``kvviz.core.policy.workshop_caps()``, and are counted under
the store's write lock (``kvviz.store.database.writing``).
"""

from __future__ import annotations

import csv
import hmac
import io
import secrets
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable

from sqlalchemy import Engine, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kvviz.core.policy import WorkshopCaps, workshop_caps
from kvviz.store.database import free_key, locked, reading, writing
from kvviz.store.tables import Class, Learner, Prediction
from kvviz.store.values import Refused, class_code, digest, display_name, prediction_value, projector_key, spreadsheet_cell, utc

CODE_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: read off a projector
CODE_LENGTH = 6
MODES = ("paced", "self")  # the host opens exercises one by one, or the class goes at its own pace
NOT_JOINED = "This session has not joined a class: join with the class code and a name."
ALREADY_PREDICTED = "You already predicted on this exercise."


def expired(code: str) -> Refused:
    return Refused(f"Class {code} has expired; ask the host for a new code.", 410)


def no_exercise(key: str) -> Refused:
    return Refused(f"This class has no exercise {key!r}.", 404)


def checked_mode(mode: str) -> str:
    if mode not in MODES:
        raise Refused(f"mode must be one of {', '.join(MODES)}")
    return mode


@dataclass(frozen=True)
class NewClass:
    code: str
    host_token: str  # shown once to the host; only its digest is stored
    expires_at: datetime


@dataclass(frozen=True)
class Seat:
    code: str
    name: str
    token: str  # the learner's session token: only its digest is stored


def tally(predictions: list[Prediction]) -> dict:
    """Counts per choice, how many predicted and how many were right."""
    graded = [p for p in predictions if p.right is not None]
    return {"counts": dict(Counter(p.value for p in predictions)), "total": len(predictions),
            "right": sum(1 for p in graded if p.right), "graded": len(graded)}


class Workshop:
    """Every change runs in the store's one write discipline (``kvviz.store.database.writing``): the
    class row it reads is locked, and a cap is counted under that lock."""

    def __init__(self, engine: Engine, caps: WorkshopCaps | None = None, clock: Callable[[], datetime] | None = None):
        self.engine = engine
        self.caps = caps or workshop_caps()
        self.clock = clock or (lambda: datetime.now(timezone.utc))

    # --- lookups ---------------------------------------------------------------------------------

    def _class(self, session: Session, code: str, lock: bool = False) -> Class:
        code = class_code(code)
        query = select(Class).where(Class.code == code)
        found = session.scalar(locked(query) if lock else query)
        if found is None:
            raise Refused(f"No class has the code {code or '(empty)'}: check the code on the screen.", 404)
        if utc(found.expires_at) <= self.clock():
            raise expired(found.code)
        return found

    def hosted(self, session: Session, code: str, host_token: str, lock: bool = False) -> Class:
        """The class whose host token this is (its row locked for a change when ``lock``)."""
        found = self._class(session, code, lock)
        if not host_token or not hmac.compare_digest(digest(host_token), found.host_token_hash):
            raise Refused("That host link does not control this class: the host token is wrong.", 403)
        return found

    def projected(self, session: Session, code: str, key: str) -> Class:
        found = self._class(session, code)
        if not key or not found.projector_key_hash or not hmac.compare_digest(digest(key), found.projector_key_hash):
            raise Refused("That projector link does not show this class: open it again from the host page.", 403)
        return found

    def learner_of(self, session: Session, token: str) -> Learner:
        learner = session.scalar(select(Learner).where(Learner.token_hash == digest(token or "")))
        if learner is None:
            raise Refused(NOT_JOINED, 401)
        self._class(session, learner.klass.code)  # refuses an expired class
        return learner

    def _hold(self, klass: Class, host_session: str, take_over: bool) -> None:
        """The host page ``host_session`` holds the class, unless another one does and was seen lately."""
        now, seen = self.clock(), utc(klass.host_seen_at)
        others = klass.host_session not in (None, host_session)
        if others and not take_over and seen is not None and (now - seen).total_seconds() < self.caps.host_lease_seconds:
            raise Refused("This class is open on another host page: close it there, or take over from here.", 409)
        klass.host_session, klass.host_seen_at = host_session, now

    # --- the host --------------------------------------------------------------------------------

    def create_class(self, exercises: list[str], mode: str = "paced", hours: float | None = None) -> NewClass:
        """A new class; it lives ``hours`` (at most the cap), but only ``empty_class_hours`` while no
        learner has joined it (a host change renews that), so that classes nobody uses go early."""
        checked_mode(mode)
        if not exercises:
            raise Refused("A class needs at least one exercise.")
        self.purge_expired()  # an expired class's data goes when the next class is made
        now = self.clock()
        hours = min(hours or self.caps.class_hours, self.caps.class_hours)
        token = secrets.token_urlsafe(24)
        with writing(self.engine, "classes") as session:
            alive = session.scalar(select(func.count(Class.id)).where(Class.expires_at > now))
            if alive >= self.caps.max_classes and not self._drop_an_idle_class(session, now):
                raise Refused(f"This server already holds {self.caps.max_classes} classes, its most; try again later.", 429)
            code = free_key(session, Class.code, CODE_LETTERS, CODE_LENGTH)
            if code is None:
                raise Refused("No free class code was found; try again.", 503)
            settings = {"exercises": list(exercises), "mode": mode, "open": [], "revealed": [], "hours": hours}
            expires = now + timedelta(hours=min(hours, self.caps.empty_class_hours))
            session.add(Class(code=code, host_token_hash=digest(token), projector_key_hash=digest(projector_key(token, code)),
                              created_at=now, expires_at=expires, settings=settings, version=0))
        return NewClass(code, token, expires)

    def _drop_an_idle_class(self, session: Session, now: datetime) -> bool:
        """Make room in a full server: delete the oldest class that no learner has joined and whose host
        has been quiet for ``idle_class_minutes`` (a flood of empty classes cannot keep a host out)."""
        quiet_since = func.coalesce(Class.host_seen_at, Class.created_at)
        idle = session.scalar(select(Class.id).where(
            Class.expires_at > now, quiet_since <= now - timedelta(minutes=self.caps.idle_class_minutes),
            ~select(Learner.id).where(Learner.class_id == Class.id).exists()).order_by(quiet_since).limit(1))
        if idle is not None:
            session.execute(delete(Class).where(Class.id == idle))
        return idle is not None

    def _lifetime(self, klass: Class) -> datetime:
        """When the class expires once someone has joined it."""
        hours = klass.settings.get("hours", self.caps.class_hours)
        return utc(klass.created_at) + timedelta(hours=min(hours, self.caps.class_hours))

    def host_settings(self, code: str, host_token: str, host_session: str, take_over: bool = False, *,
                      open_exercise: str | None = None, reveal: str | None = None, mode: str | None = None) -> dict:
        """The host page ``host_session`` changes the class (or only claims it when nothing is given):
        opens an exercise (in paced mode, the one learners answer now), reveals one, or sets the pacing."""
        with writing(self.engine) as session:
            klass = self.hosted(session, code, host_token, lock=True)
            self._hold(klass, host_session, take_over)
            renewed = min(self.clock() + timedelta(hours=self.caps.empty_class_hours), self._lifetime(klass))
            if renewed > utc(klass.expires_at):  # an empty class lives on while its host works on it
                klass.expires_at = renewed
            settings = dict(klass.settings)
            for key in (open_exercise, reveal):
                if key is not None and key not in settings["exercises"]:
                    raise no_exercise(key)
            if mode is not None:
                settings["mode"] = checked_mode(mode)
            if open_exercise is not None and open_exercise not in settings["open"]:
                settings["open"] = [*settings["open"], open_exercise]
            if reveal is not None and reveal not in settings["revealed"]:
                if settings["mode"] == "paced" and reveal not in settings["open"]:
                    raise Refused("Open this exercise before you reveal it.", 409)
                settings["revealed"] = [*settings["revealed"], reveal]
            if settings != klass.settings:
                klass.settings, klass.version = settings, klass.version + 1
            return {**self._shown(settings), "code": klass.code, "version": klass.version}

    @staticmethod
    def _shown(settings: dict) -> dict:
        return {key: settings[key] for key in ("exercises", "mode", "open", "revealed")}

    def board(self, code: str, host_token: str) -> dict:
        """The host's view: settings, the learners' names, per exercise the counts and share right, and
        the projector's read-only key."""
        with reading(self.engine) as session:
            klass = self.hosted(session, code, host_token)
            names = session.scalars(select(Learner.name).where(Learner.class_id == klass.id).order_by(Learner.joined_at)).all()
            return {**self._room_board(session, klass), "names": list(names),
                    "projector_key": projector_key(host_token, klass.code)}

    def projector_board(self, code: str, key: str) -> dict:
        """What the projector shows: the board without the learners' names (how many joined)."""
        with reading(self.engine) as session:
            return self._room_board(session, self.projected(session, code, key))

    def _room_board(self, session: Session, klass: Class) -> dict:
        joined = session.scalar(select(func.count(Learner.id)).where(Learner.class_id == klass.id))
        predictions = session.scalars(select(Prediction).where(Prediction.class_id == klass.id)).all()
        by_exercise = {key: tally([p for p in predictions if p.exercise == key]) for key in klass.settings["exercises"]}
        return {**self._shown(klass.settings), "code": klass.code, "version": klass.version, "joined": joined,
                "expires_at": utc(klass.expires_at).isoformat(), "exercises_board": by_exercise}

    def export_csv(self, code: str, host_token: str) -> str:
        """Every answer with its learner, as CSV; a cell a spreadsheet would run as a formula starts with '."""
        with reading(self.engine) as session:
            klass = self.hosted(session, code, host_token)
            rows = session.execute(select(Learner.name, Prediction.exercise, Prediction.value, Prediction.right,
                                          Prediction.created_at).join(Learner, Prediction.learner_id == Learner.id)
                                   .where(Prediction.class_id == klass.id).order_by(Prediction.id)).all()
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["class", "learner", "exercise", "prediction", "right", "at"])
        for name, exercise, value, right, at in rows:
            writer.writerow([klass.code, spreadsheet_cell(name), exercise, spreadsheet_cell(value),
                             "" if right is None else ("yes" if right else "no"), utc(at).isoformat()])
        return out.getvalue()

    def delete_class(self, code: str, host_token: str) -> None:
        with writing(self.engine) as session:
            klass = self.hosted(session, code, host_token, lock=True)
            session.execute(delete(Prediction).where(Prediction.class_id == klass.id))
            session.execute(delete(Learner).where(Learner.class_id == klass.id))
            session.delete(klass)

    def purge_expired(self) -> int:
        """Delete every expired class with its learners and predictions; how many classes went."""
        with writing(self.engine) as session:
            ids = session.scalars(select(Class.id).where(Class.expires_at <= self.clock())).all()
            if ids:
                session.execute(delete(Prediction).where(Prediction.class_id.in_(ids)))
                session.execute(delete(Learner).where(Learner.class_id.in_(ids)))
                session.execute(delete(Class).where(Class.id.in_(ids)))
            return len(ids)

    # --- learners --------------------------------------------------------------------------------

    def join(self, code: str, name: str) -> Seat:
        """A learner joins: the class row is locked while its learners are counted against the cap; the
        first learner gives the class its whole lifetime."""
        name = display_name(name)
        token, now = secrets.token_urlsafe(24), self.clock()
        try:
            with writing(self.engine) as session:
                klass = self._class(session, code, lock=True)
                count = session.scalar(select(func.count(Learner.id)).where(Learner.class_id == klass.id))
                if count >= self.caps.max_learners:
                    raise Refused(f"Class {klass.code} is full ({self.caps.max_learners} learners).", 429)
                if count == 0:
                    klass.expires_at = max(utc(klass.expires_at), self._lifetime(klass))
                session.add(Learner(class_id=klass.id, name=name, token_hash=digest(token), joined_at=now,
                                    window_start=now, window_count=0))
                klass_code = klass.code
        except IntegrityError:
            raise Refused("Someone in this class already uses that name: pick another.", 409) from None
        return Seat(klass_code, name, token)

    def learner_view(self, token: str) -> dict:
        """What a learner's page shows: their class's pacing and their own answers, nothing of others'."""
        with reading(self.engine) as session:
            learner = self.learner_of(session, token)
            mine = session.scalars(select(Prediction).where(Prediction.learner_id == learner.id)).all()
            settings = learner.klass.settings
            return {"code": learner.klass.code, "name": learner.name, "mode": settings["mode"],
                    "exercises": settings["exercises"], "open": settings["open"], "revealed": settings["revealed"],
                    "mine": {p.exercise: {"value": p.value, "right": p.right} for p in mine}}

    @staticmethod
    def _prediction_problem(connection, seat, exercise: str) -> Refused | None:
        settings = seat.settings
        if exercise not in settings["exercises"]:
            return no_exercise(exercise)
        if settings["mode"] == "paced" and exercise not in settings["open"]:
            return Refused("The host has not opened this exercise yet.", 409)
        if exercise in settings["revealed"]:
            return Refused("This exercise has been revealed: predictions on it are closed.", 409)
        taken = connection.execute(select(Prediction.id).where(Prediction.learner_id == seat.id,
                                                              Prediction.exercise == exercise)).first()
        if taken is not None:  # (and two at once: the unique constraint)
            return Refused(ALREADY_PREDICTED, 409)
        return None

    def predict(self, token: str, exercise: str, value: str, right: bool | None) -> None:
        """A learner's one prediction on an exercise (graded by the caller against the run: ``right``).
        One transaction, in SQLAlchemy Core statements (the busiest request of a class: a few
        statements, no ORM bookkeeping), the learner's row locked: the attempt counts in the session's
        minute (the flood check) even when the prediction is refused, and the prediction is stored at
        most once (a unique constraint)."""
        value = prediction_value(value)
        learners, classes = Learner.__table__, Class.__table__
        try:
            with writing(self.engine) as connection:
                seat = connection.execute(
                    select(learners.c.id, learners.c.class_id, learners.c.window_start, learners.c.window_count,
                           classes.c.code, classes.c.expires_at, classes.c.settings)
                    .join(classes, classes.c.id == learners.c.class_id)
                    .where(learners.c.token_hash == digest(token or "")).with_for_update(of=learners)).first()
                if seat is None:
                    raise Refused(NOT_JOINED, 401)
                now = self.clock()
                if utc(seat.expires_at) <= now:
                    raise expired(seat.code)
                fresh = (now - utc(seat.window_start)).total_seconds() >= 60
                window_start, count = (now, 1) if fresh else (seat.window_start, seat.window_count + 1)
                connection.execute(update(learners).where(learners.c.id == seat.id)
                                   .values(window_start=window_start, window_count=count))
                if count > self.caps.predictions_per_minute:
                    problem = Refused("Too many predictions from this session: wait a minute and try again.", 429)
                else:
                    problem = self._prediction_problem(connection, seat, exercise)
                if problem is None:
                    connection.execute(insert(Prediction.__table__).values(
                        class_id=seat.class_id, learner_id=seat.id, exercise=exercise, value=value, right=right,
                        created_at=now))
        except IntegrityError:
            raise Refused(ALREADY_PREDICTED, 409) from None
        if problem is not None:  # raised after the commit, so that the attempt counts
            raise problem

    def may_reveal(self, token: str, exercise: str) -> bool:
        """Whether this learner may see the run: the host revealed it, or (self-paced) they predicted."""
        view = self.learner_view(token)
        return exercise in view["revealed"] or (view["mode"] == "self" and exercise in view["mine"])

    def room(self, token: str, exercise: str) -> dict:
        """The room's counts on one exercise, for a learner who may see its reveal (no names)."""
        if not self.may_reveal(token, exercise):
            raise Refused("The room's answers show after the reveal.", 403)
        with reading(self.engine) as session:
            learner = self.learner_of(session, token)
            predictions = session.scalars(select(Prediction).where(Prediction.class_id == learner.class_id,
                                                                   Prediction.exercise == exercise)).all()
            return tally(predictions)
