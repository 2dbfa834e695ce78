"""The store's Alembic migrations: ``env.py`` runs them on the connection ``kvviz.store.database``
hands it; ``versions/`` holds one file per schema change, oldest first."""
