"""Bring MLflow's PostgreSQL databases to the schema of the installed MLflow, one pod at a time.

The init container of the MLflow Deployment when ``mlflow.backend.type=postgresql``. Without
it, every ``mlflow server`` creates the tables of an empty database as it starts, so replicas
of a fresh install race and all but one crash (a duplicate ``alembic_version`` table); and no
server upgrades an existing database after an MLflow upgrade, it refuses to start ("out-of-date
database schema"). Here a PostgreSQL advisory lock lets one pod at a time run ``mlflow db
upgrade``; the others then find nothing to do. With auth on, the users database
(``MLFLOW_AUTH_DATABASE_URI``) is migrated under the same lock.

The URIs come only from the environment (``MLFLOW_BACKEND_STORE_URI``, from the Secret) and
are never printed or passed as arguments.

Usage: ``python migrate_mlflow_db.py``
"""

from __future__ import annotations

import logging
import os
import sys

LOG = logging.getLogger("migrate_mlflow_db")
# Any fixed 64-bit key; only these init containers take it ("mlflowdb" in ASCII).
LOCK_KEY = 0x6D6C666C6F776462


def migrate(store_uri: str, auth_uri: str | None) -> None:
    """Hold the advisory lock on the tracking database while both databases are migrated."""
    import sqlalchemy
    from mlflow.db import upgrade
    from mlflow.store.db.utils import create_sqlalchemy_engine_with_retry

    engine = create_sqlalchemy_engine_with_retry(store_uri)
    with engine.connect() as lock:
        lock.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": LOCK_KEY})
        try:
            LOG.info("lock held; upgrading the tracking database")
            # The `mlflow db upgrade` command, called in-process so the URI stays out of argv.
            upgrade.main([store_uri], standalone_mode=False)
            if auth_uri:
                from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

                LOG.info("upgrading the auth database")
                SqlAlchemyStore().init_db(auth_uri)
        finally:
            lock.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": LOCK_KEY})
    engine.dispose()


def main() -> int:
    """Command-line entry point; returns the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    store_uri = os.environ.get("MLFLOW_BACKEND_STORE_URI", "")
    if not store_uri.startswith("postgresql"):
        LOG.error(
            "MLFLOW_BACKEND_STORE_URI is %s\nfix: put postgresql://USER:PASSWORD@HOST:5432/mlflow "
            "under the uri key of mlflow.backend.postgresql.existingSecret.",
            "empty" if not store_uri else "not a postgresql:// URI",
        )
        return 2
    try:
        migrate(store_uri, os.environ.get("MLFLOW_AUTH_DATABASE_URI") or None)
    except Exception as exc:  # the database's refusal: say which, never the URI
        LOG.error(
            "%s: %s\nfix: check that the database exists, the URI's user may create tables in "
            "it, and the server is reachable from the provider namespace.",
            type(exc).__name__,
            str(exc).replace(store_uri, "<uri>").splitlines()[0] if str(exc) else "",
        )
        return 4
    LOG.info("MLflow databases are at the installed MLflow's schema")
    return 0


if __name__ == "__main__":
    sys.exit(main())
