"""The kill matrix: SIGKILL a 2-round MLflow-tracked job at every step boundary, then resume.

Each resumed run must end with the reference run's weights bit for bit, the same round
reports, exactly one MLflow run, exactly one logged model and one registered version, and the
same MLflow metric rows (keys, steps, values; each once) read from the tracking store itself.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.integration.crash_helpers import run
from tests.integration.test_crash_kills import _round_view, aliases, mlflow_job, registered_versions

KILL_POINTS = [
    "mlflow-db-created",  # tables made in the temporary file, not yet linked into place
    "stored:state/round-000000.json",  # initial state
    "stored:broadcast/round-000001.json",  # round 1 configured (provider's record)
    "stored:tenant-b/round-000001/update.json",  # mid-round: tenant-c has not trained yet
    "stored:state/round-000001.json",  # aggregated, no round summary yet
    "stored:summary/round-000001.json",
    "stored:state/round-000002.json",
    "stored:tenant-b/final-round-000002/eval.json",  # mid final evaluation
    "stored:summary/final-eval.json",
    "stored:artifacts/model/adapter/adapter_model.safetensors",  # mid export
    "model-uploaded",  # the logged model's files are up, it is still pending, not registered
    "model-registered",
    "stored:summary/run-round-000002.json",  # finished, CLI summary not yet written
]
PROVIDER = Path("provider") / "jobs" / "itest"
# Rows whose values differ between two uninterrupted runs: wall time, and the size of an
# update, whose metadata carries its step's wall time. They must be there once, all the same.
TIMED = ("round_seconds", "bytes_received/")


def metric_rows(db: sqlite3.Connection) -> list[tuple[str, int, float | None]]:
    """Every metric row MLflow holds, sorted; a duplicate row shows as a repeated tuple."""
    rows = db.execute("SELECT key, step, value FROM metrics").fetchall()
    return sorted((k, s, None if k.startswith(TIMED) else v) for k, s, v in rows)


def outcome(tmp_path: Path) -> dict[str, Any]:
    """What a finished run leaves: weights, exported adapter, round reports, registry state."""
    workdir = tmp_path / "w"
    provider = workdir / PROVIDER
    summary = json.loads((workdir / "runs" / "itest" / "summary.json").read_text())
    with sqlite3.connect(workdir / "mlflow.db") as db:
        statuses = [s for (s,) in db.execute("SELECT status FROM runs")]
        metrics = metric_rows(db)
        logged_models = db.execute("SELECT status FROM logged_models").fetchall()
    return {
        "state": (provider / "state" / "round-000002.safetensors").read_bytes(),
        "adapter": (provider / "artifacts" / "model" / "adapter" / "adapter_model.safetensors").read_bytes(),
        "rounds": [_round_view(r) for r in summary["rounds"]],
        "final_eval": summary["final_eval"],
        "versions": len(registered_versions(workdir)),
        "aliases": aliases(workdir),
        "mlflow_runs": statuses,
        "metrics": metrics,
        "logged_models": logged_models,
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp_path = tmp_path_factory.mktemp("reference")
    done = run(["run", str(mlflow_job(tmp_path)), "--no-progress"])
    assert done.returncode == 0, done.stderr
    return outcome(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
def test_every_kill_resumes_to_the_same_result(
    tmp_path: Path, reference: dict[str, Any], point: str
) -> None:
    job = mlflow_job(tmp_path)
    killed = run(["run", str(job), "--no-progress"], FEDTUNE_TEST_KILL_AT=point)
    assert killed.returncode == -9, f"{point} was never reached:\n{killed.stderr}"
    resumed = run(["run", str(job), "--no-progress", "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    got = outcome(tmp_path)
    assert got["state"] == reference["state"], "final weights differ"
    assert got["adapter"] == reference["adapter"], "exported adapter differs"
    assert got["rounds"] == reference["rounds"]
    assert got["final_eval"] == reference["final_eval"]
    assert got["versions"] == 1 and got["aliases"] == {"candidate": "1"}
    assert got["mlflow_runs"] == ["FINISHED"]
    assert got["logged_models"] == reference["logged_models"] == [(2,)]  # one, READY
    assert got["metrics"] == reference["metrics"], "MLflow's metric rows differ"
