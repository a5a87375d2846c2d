"""Real SIGKILLs of a ``fedtune run`` subprocess at chosen moments; the resumed run must work.

Kill points are either polled files (as a user's crash would land) or the
``FEDTUNE_TEST_KILL_AT`` hook (:mod:`fedtune.core.killpoints`).
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import yaml

from tests.integration.conftest import tiny_job_dict
from tests.integration.crash_helpers import kill_when, run, start


def mlflow_job(tmp_path: Path, **overrides: Any) -> Path:
    """A tiny 2-round job tracked in MLflow's default SQLite store inside its workdir."""
    job = tiny_job_dict(tmp_path / "w", **overrides)
    job["tracking"] = {"backend": "mlflow", "experiment": "itest"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    return path


def _size(path: Path) -> int:
    """Bytes of ``path``, 0 once gone (SQLite's journal comes and goes between list and stat)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _db_files(workdir: Path) -> list[Path]:
    try:
        return [p for p in workdir.iterdir() if "mlflow.db" in p.name]
    except OSError:
        return []


def registered_versions(workdir: Path, name: str = "itest") -> list[tuple[str, str]]:
    """(version, run id) of every registered version of ``name`` in the workdir's MLflow."""
    with sqlite3.connect(workdir / "mlflow.db") as db:
        return db.execute(
            "SELECT version, run_id FROM model_versions WHERE name = ? ORDER BY version", (name,)
        ).fetchall()


def test_kill_while_mlflow_creates_its_database_resumes(tmp_path: Path) -> None:
    job = mlflow_job(tmp_path)
    workdir = tmp_path / "w"
    proc = start(["run", str(job), "--no-progress"])
    # A database file that has grown past 100 KB is half-way through MLflow's migrations
    # (a complete one is about 950 KB).
    kill_when(proc, lambda: any(_size(p) > 100_000 for p in _db_files(workdir)))
    proc.wait()
    assert not (workdir / "mlflow.db").exists()  # only a temporary file was half-made
    resumed = run(["run", str(job), "--no-progress", "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert [p.name for p in _db_files(workdir)] == ["mlflow.db"]  # the leftover is gone
    assert len(registered_versions(workdir)) == 1
    summary = json.loads((workdir / "runs" / "itest" / "summary.json").read_text())
    assert summary["completed"] and len(summary["rounds"]) == 2


def aliases(workdir: Path, name: str = "itest") -> dict[str, str]:
    with sqlite3.connect(workdir / "mlflow.db") as db:
        rows = db.execute("SELECT alias, version FROM registered_model_aliases WHERE name = ?", (name,))
        return {alias: str(version) for alias, version in rows}


def runs_in_mlflow(workdir: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(workdir / "mlflow.db") as db:
        return db.execute("SELECT run_uuid, status FROM runs").fetchall()


def test_resume_of_a_finished_run_prints_it_and_registers_nothing(tmp_path: Path) -> None:
    job = mlflow_job(tmp_path)
    workdir = tmp_path / "w"
    first = run(["run", str(job), "--no-progress"])
    assert first.returncode == 0, first.stderr
    again = run(["run", str(job), "--no-progress", "--resume"])
    assert again.returncode == 0, again.stderr
    assert "registered version 1" in again.stdout and "already finished" in again.stderr
    assert len(registered_versions(workdir)) == 1 and aliases(workdir) == {"candidate": "1"}
    assert [status for _, status in runs_in_mlflow(workdir)] == ["FINISHED"]


def test_kill_after_registration_registers_once(tmp_path: Path) -> None:
    job = mlflow_job(tmp_path)
    workdir = tmp_path / "w"
    killed = run(["run", str(job), "--no-progress"], FEDTUNE_TEST_KILL_AT="model-registered")
    assert killed.returncode == -9
    assert len(registered_versions(workdir)) == 1
    resumed = run(["run", str(job), "--no-progress", "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    versions = registered_versions(workdir)
    assert len(versions) == 1 and aliases(workdir) == {"candidate": "1"}
    assert "registered version 1" in resumed.stdout


def _round_view(record: dict[str, Any]) -> dict[str, Any]:
    """What a round reports, minus timings."""
    keep = ("round", "sampled", "accepted", "rejected", "train_loss", "eval_loss", "server_metrics")
    tenants = {
        n: {k: v for k, v in t.items() if k in ("train_loss", "eval_loss", "num_samples")}
        for n, t in record["tenants"].items()
    }
    return {**{k: record[k] for k in keep}, "tenants": tenants}


def test_kill_after_state_before_round_summary_reports_the_round(tmp_path: Path) -> None:
    job = tiny_job_dict(tmp_path / "w")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    killed = run(["run", str(path), "--no-progress"], FEDTUNE_TEST_KILL_AT="state-saved:1")
    assert killed.returncode == -9
    provider = tmp_path / "w" / "provider" / "jobs" / "itest"
    assert (provider / "state" / "round-000001.json").exists()
    assert not (provider / "summary" / "round-000001.json").exists()
    resumed = run(["run", str(path), "--no-progress", "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    row = next(line for line in resumed.stdout.splitlines() if line.startswith("│     1 │"))
    assert "3/3" in row  # round 1's row of the table

    reference = tiny_job_dict(tmp_path / "ref")
    ref_path = tmp_path / "ref.yaml"
    ref_path.write_text(yaml.safe_dump(reference), encoding="utf-8")
    assert run(["run", str(ref_path), "--no-progress"]).returncode == 0
    got = json.loads((tmp_path / "w" / "runs" / "itest" / "summary.json").read_text())
    want = json.loads((tmp_path / "ref" / "runs" / "itest" / "summary.json").read_text())
    assert [_round_view(r) for r in got["rounds"]] == [_round_view(r) for r in want["rounds"]]
    assert got["rounds"][0]["accepted"] == ["tenant-a", "tenant-b", "tenant-c"]
    assert got["rounds"][0]["train_loss"] is not None


def test_sigterm_stops_at_a_safe_point_marks_the_run_killed_and_resumes(tmp_path: Path) -> None:
    job = mlflow_job(tmp_path)
    workdir = tmp_path / "w"
    state_1 = workdir / "provider" / "jobs" / "itest" / "state" / "round-000001.json"
    proc = start(["run", str(job), "--no-progress"])
    kill_when(proc, state_1.exists, sig=signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "SIGTERM" in err and f"fedtune run {job} --resume" in err and "Traceback" not in err
    assert [status for _, status in runs_in_mlflow(workdir)] == ["KILLED"]
    resumed = run(["run", str(job), "--no-progress", "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert [status for _, status in runs_in_mlflow(workdir)] == ["FINISHED"]
    assert len(registered_versions(workdir)) == 1


def test_sigint_stops_with_130_and_resumes(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(tiny_job_dict(tmp_path / "w")), encoding="utf-8")
    state_1 = tmp_path / "w" / "provider" / "jobs" / "itest" / "state" / "round-000001.json"
    proc = start(["run", str(path), "--no-progress"])
    kill_when(proc, state_1.exists, sig=signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "SIGINT" in err and "--resume" in err and "Traceback" not in err
    resumed = run(["run", str(path), "--no-progress", "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((tmp_path / "w" / "runs" / "itest" / "summary.json").read_text())
    assert summary["completed"] and [len(r["accepted"]) for r in summary["rounds"]] == [3, 3]
