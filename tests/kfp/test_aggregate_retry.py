"""A KFP retry of the aggregate step after a crash between storing the round's record and
logging its metrics logs them, once: a retry never loses a round's metrics nor doubles them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from fedtune.engines import layout
from fedtune.engines.summary import RoundRecord
from fedtune.entrypoints import aggregate, client_step, configure_round, server_init
from tests.kfp.conftest import two_tenant_job

TENANTS = ("tenant-a", "tenant-b")
pytestmark = pytest.mark.slow  # four steps of a job and an MLflow database: ~10 s


def test_a_retried_aggregate_logs_the_metrics_a_crash_cut_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "mlflow.db"
    tracking = {"backend": "mlflow", "experiment": "retry", "tracking_uri": f"sqlite:///{db}"}
    job = two_tenant_job(tmp_path / "w", tracking=tracking)
    server_init.run(job)
    configure_round.run(job, 1)
    for tenant in TENANTS:
        client_step.run(job, 1, tenant)
    markers = [{"round": 1, "tenant": t, "ok": True} for t in TENANTS]

    def crash(*_: object) -> None:  # the process dies right after the record is stored
        raise SystemExit(137)

    monkeypatch.setattr(aggregate.retention, "prune", crash)
    with pytest.raises(SystemExit):
        aggregate.run(job, 1, {}, markers)
    monkeypatch.undo()
    store = layout.JobStores(job).provider()
    record = RoundRecord.from_json(store.get_json(layout.summary_key(1)))
    for _ in range(2):  # KFP retries the step; a second retry logs nothing again
        assert aggregate.run(job, 1, {}, markers)["skipped"]
    with sqlite3.connect(db) as conn:
        rows = sorted(conn.execute("SELECT key, value FROM metrics WHERE step = 1").fetchall())
    assert rows == sorted(record.metrics().items())
