"""The workshop's first tables: classes, learners, predictions, saved runs.

Revision ID: v0001
Revises:
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "v0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "classes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("code", sa.String(12), nullable=False),
        sa.Column("host_token_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("host_session", sa.String(64), nullable=True),
        sa.Column("host_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("code", name="uq_classes_code"),
    )
    op.create_index("ix_classes_expires_at", "classes", ["expires_at"])
    op.create_table(
        "learners",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("class_id", sa.Integer(), sa.ForeignKey("classes.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(40), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_count", sa.Integer(), nullable=False),
        sa.UniqueConstraint("class_id", "name", name="uq_learners_class_name"),
        sa.UniqueConstraint("token_hash", name="uq_learners_token_hash"),
    )
    op.create_index("ix_learners_class_id", "learners", ["class_id"])
    op.create_table(
        "predictions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("class_id", sa.Integer(), sa.ForeignKey("classes.id", ondelete="CASCADE"), nullable=False),
        sa.Column("learner_id", sa.Integer(), sa.ForeignKey("learners.id", ondelete="CASCADE"), nullable=False),
        sa.Column("exercise", sa.String(64), nullable=False),
        sa.Column("value", sa.String(80), nullable=False),
        sa.Column("right", sa.Boolean(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("learner_id", "exercise", name="uq_predictions_learner_exercise"),
    )
    op.create_index("ix_predictions_class_id", "predictions", ["class_id"])
    op.create_table(
        "saved_runs",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("title", sa.String(200), nullable=False),
        sa.Column("link", sa.Text(), nullable=False),
        sa.Column("results", sa.JSON(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("class_id", sa.Integer(), sa.ForeignKey("classes.id", ondelete="SET NULL"), nullable=True),
    )
    op.create_index("ix_saved_runs_class_id", "saved_runs", ["class_id"])


def downgrade() -> None:
    op.drop_table("saved_runs")
    op.drop_table("predictions")
    op.drop_table("learners")
    op.drop_table("classes")
