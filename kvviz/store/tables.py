"""The workshop's tables, as SQLAlchemy 2 declarative classes (the migrations in ``migrations/``
create exactly these; tests/unit/test_workshop_store.py compares the two).

* ``classes``: a class's short code (for the projector), its host token's SHA-256 (the token is
  shown once and never stored) and its projector key's (a read-only key derived from the token),
  when it expires, its settings (JSON: the exercises in order, the pacing, what is open and
  revealed) and which host page holds it now;
* ``learners``: a display name per class and the SHA-256 of the learner's session token;
* ``predictions``: one per learner and exercise, with whether it was right;
* ``saved_runs``: a page state (its link's query) and results under a short id, its size and when it
  expires, maybe pinned to a class.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, DateTime, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class Base(DeclarativeBase):
    pass


class Class(Base):
    __tablename__ = "classes"
    __table_args__ = (UniqueConstraint("code", name="uq_classes_code"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    code: Mapped[str] = mapped_column(String(12))
    host_token_hash: Mapped[str] = mapped_column(String(64))
    projector_key_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    settings: Mapped[dict] = mapped_column(JSON)
    version: Mapped[int] = mapped_column(Integer, default=0)  # bumped by every host change of settings
    host_session: Mapped[str | None] = mapped_column(String(64), nullable=True)
    host_seen_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    learners: Mapped[list[Learner]] = relationship(back_populates="klass", cascade="all, delete-orphan",
                                                   passive_deletes=True)


class Learner(Base):
    __tablename__ = "learners"
    __table_args__ = (UniqueConstraint("class_id", "name", name="uq_learners_class_name"),
                      UniqueConstraint("token_hash", name="uq_learners_token_hash"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    class_id: Mapped[int] = mapped_column(ForeignKey("classes.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(40))
    token_hash: Mapped[str] = mapped_column(String(64))
    joined_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    window_start: Mapped[datetime] = mapped_column(DateTime(timezone=True))  # the flood check's minute
    window_count: Mapped[int] = mapped_column(Integer, default=0)

    klass: Mapped[Class] = relationship(back_populates="learners")


class Prediction(Base):
    __tablename__ = "predictions"
    __table_args__ = (UniqueConstraint("learner_id", "exercise", name="uq_predictions_learner_exercise"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    class_id: Mapped[int] = mapped_column(ForeignKey("classes.id", ondelete="CASCADE"), index=True)
    learner_id: Mapped[int] = mapped_column(ForeignKey("learners.id", ondelete="CASCADE"))
    exercise: Mapped[str] = mapped_column(String(64))
    value: Mapped[str] = mapped_column(String(80))
    right: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class SavedRun(Base):
    __tablename__ = "saved_runs"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    title: Mapped[str] = mapped_column(String(200))
    link: Mapped[str] = mapped_column(Text)  # the page's state as its link's query string
    results: Mapped[dict] = mapped_column(JSON)  # the page's results payload
    size: Mapped[int] = mapped_column(Integer)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    class_id: Mapped[int | None] = mapped_column(ForeignKey("classes.id", ondelete="SET NULL"), nullable=True,
                                                 index=True)
