"""Saved runs expire; a class has a read-only projector key.

Revision ID: v0002
Revises: v0001
Create Date: 2026-12-10
"""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa
from alembic import op

revision = "v0002"
down_revision = "v0001"
branch_labels = None
depends_on = None

KEPT_DAYS = 30  # saved runs already kept expire as a new one would locally (kvviz.core.policy.LOCAL_WORKSHOP)


def upgrade() -> None:
    with op.batch_alter_table("classes") as batch:
        batch.add_column(sa.Column("projector_key_hash", sa.String(64), nullable=True))
    with op.batch_alter_table("saved_runs") as batch:
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    runs = sa.table("saved_runs", sa.column("id", sa.String), sa.column("created_at", sa.DateTime(timezone=True)),
                    sa.column("expires_at", sa.DateTime(timezone=True)))
    connection = op.get_bind()
    for run_id, created in connection.execute(sa.select(runs.c.id, runs.c.created_at)).all():
        connection.execute(runs.update().where(runs.c.id == run_id).values(expires_at=created + timedelta(days=KEPT_DAYS)))
    with op.batch_alter_table("saved_runs") as batch:
        batch.alter_column("expires_at", existing_type=sa.DateTime(timezone=True), nullable=False)
        batch.create_index("ix_saved_runs_expires_at", ["expires_at"])


def downgrade() -> None:
    with op.batch_alter_table("saved_runs") as batch:
        batch.drop_index("ix_saved_runs_expires_at")
        batch.drop_column("expires_at")
    with op.batch_alter_table("classes") as batch:
        batch.drop_column("projector_key_hash")
