"""Alembic's environment: runs the migrations on the connection kvviz.store.database passes in
(``config.attributes["connection"]``), or on ``sqlalchemy.url`` for the ``alembic`` command."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from kvviz.store.tables import Base


def run() -> None:
    config = context.config
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = engine_from_config(config.get_section(config.config_ini_section) or {}, prefix="sqlalchemy.",
                                poolclass=pool.NullPool)
    with engine.connect() as opened:
        context.configure(connection=opened, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


run()
