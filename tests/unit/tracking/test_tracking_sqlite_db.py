"""MLflow's SQLite database is created atomically; a half-made one is named with its fix."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from fedtune.core.errors import StoreError
from fedtune.tracking.sqlite_db import ensure_database, sqlite_path


def test_creates_a_complete_database_and_no_leftovers(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ensure_database(uri)
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchone()
    assert [p.name for p in tmp_path.iterdir()] == ["mlflow.db"]
    ensure_database(uri)  # a second call leaves the complete database alone


def test_half_made_database_is_refused_with_its_fix(tmp_path: Path) -> None:
    path = tmp_path / "mlflow.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE experiments (experiment_id INTEGER)")
    with pytest.raises(StoreError) as info:
        ensure_database(f"sqlite:///{path}")
    assert str(path) in str(info.value) and "incomplete" in str(info.value)
    assert "mv " in info.value.fix and info.value.exit_code == 4


def test_only_sqlite_uris_have_a_file() -> None:
    assert sqlite_path("http://mlflow:5000") is None
    assert sqlite_path("sqlite:////abs/x.db") == Path("/abs/x.db")
