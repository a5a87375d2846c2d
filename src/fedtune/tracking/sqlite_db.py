"""Create MLflow's local SQLite database once and atomically.

MLflow creates its tables in place, in about 3 s of migrations; a process killed meanwhile
leaves a database that neither MLflow nor a fresh run can open. Here the tables are created
in a temporary file beside the database, which is then linked into place: the database
either does not exist or is complete.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

from fedtune.core import killpoints
from fedtune.core.errors import StoreError

log = logging.getLogger(__name__)

_PREFIX = "sqlite:///"


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, or None for any other URI."""
    if not tracking_uri.startswith(_PREFIX) or tracking_uri == _PREFIX + ":memory:":
        return None
    return Path(tracking_uri.removeprefix(_PREFIX))


def ensure_database(tracking_uri: str) -> None:
    """Create the SQLite database of ``tracking_uri`` if missing; check it is complete if not.

    Raises:
        StoreError: An existing database lacks MLflow's schema (left half-made by an older
            fedtune or another tool).
    """
    path = sqlite_path(tracking_uri)
    if path is None:
        return
    if path.exists():
        check_complete(path)
        relocate_if_moved(path)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.creating")
    tmp.unlink(missing_ok=True)
    try:
        _create_tables(tmp, path.parent)
        killpoints.reached("mlflow-db-created")
        try:
            os.link(tmp, path)  # fails if another process got there first: theirs is complete too
        except FileExistsError:
            log.debug("another process created %s first", path)
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-journal")):
            leftover.unlink(missing_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.creating*"):
        _remove_if_abandoned(stale, stale.name.removeprefix(f".{path.name}."))


def _create_tables(tmp: Path, folder: Path) -> None:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    log.debug("creating MLflow tables in %s", tmp)
    store = SqlAlchemyStore(f"{_PREFIX}{tmp}", (folder / "mlartifacts").resolve().as_uri())
    store.engine.dispose()


def _remove_if_abandoned(stale: Path, rest: str) -> None:
    """Delete another process's temporary database (``rest``: ``PID.creating...``) if it died."""
    try:
        pid = int(rest.split(".", 1)[0])
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        stale.unlink(missing_ok=True)
    except PermissionError:
        pass


#: Columns of MLflow's schema that hold artifact locations (file URIs or paths).
_LOCATION_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
)


def relocate_if_moved(path: Path) -> None:
    """Point the artifact locations of a moved (or copied) database at its new folder.

    MLflow records absolute artifact locations; fedtune keeps them in ``mlartifacts/`` beside
    the database. A project folder that was moved would otherwise write its next artifacts
    back into the old place (re-creating it) and read registered models from there.
    """
    root = (path.parent / "mlartifacts").resolve()
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT artifact_location FROM experiments WHERE experiment_id = 0").fetchone()
        recorded = str(row[0]) if row else ""
        if not recorded.endswith("/mlartifacts/0"):
            return  # not the layout fedtune created: leave it as its maker set it
        old = recorded.removesuffix("/0")
        if old == root.as_uri():
            return
        old_path = old.removeprefix("file://")
        log.info("MLflow database moved from %s to %s; updating its artifact paths", old_path, root)
        for table, column in _LOCATION_COLUMNS:
            for before, after in ((old, root.as_uri()), (old_path, str(root))):
                db.execute(
                    f"UPDATE {table} SET {column} = ? || substr({column}, ?) "  # noqa: S608
                    f"WHERE substr({column}, 1, ?) = ? "
                    f"AND substr({column}, ?, 1) IN ('/', '')",
                    (after, len(before) + 1, len(before), before, len(before) + 1),
                )


def check_complete(path: Path) -> None:
    """Refuse a database that lacks MLflow's schema version (left half-made)."""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            row = db.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error as exc:
        row, reason = None, str(exc)
    else:
        reason = "its schema version is missing"
    if row is None:
        raise StoreError(
            f"the MLflow database {str(path)!r} is incomplete ({reason}); it was left half-made "
            "by an interrupted run of an older fedtune or by another tool",
            fix=f"Move it aside (mv {path} {path}.broken) and run again: fedtune creates a "
            "new one atomically. Runs already logged in it cannot be read by MLflow.",
        )
