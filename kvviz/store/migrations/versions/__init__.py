"""One Alembic revision per file (``alembic revision`` writes them from ``script.py.mako``)."""
