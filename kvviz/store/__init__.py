"""The workshop's store: classes, their learners and predictions, and saved runs, in a database.

SQLite (one file in ``kvviz.core.paths.state_dir()``, WAL) by default; PostgreSQL when
``KVVIZ_DB_URL`` names one, so that several app servers can share a class. SQLAlchemy 2 over
Alembic migrations (``migrations/``): ``tables`` declares the schema, ``database`` opens and
migrates it, ``classes`` and ``runs`` are what the app may do with it (who may do what is checked
there, not in the page).
"""
