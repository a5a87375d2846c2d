"""A project folder copied or moved elsewhere resumes; a changed job names what changed.

The fingerprint a stored run is pinned to used to hold absolute paths, so moving the folder
made ``--resume`` refuse, and the refusal never said which field differed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from fedtune.cli.main import main
from fedtune.config import load_job
from fedtune.engines.fingerprint import config_fingerprint, legacy_fingerprint
from tests.integration.conftest import DATA, tiny_job_dict

STATE = Path(".fedtune/provider/jobs/itest/state/round-000002.safetensors")


def make_project(root: Path) -> Path:
    """A project folder: the job file, its data, and (once run) its workdir, all relative."""
    shutil.copytree(DATA, root / "data")
    job = tiny_job_dict(Path("unused"), rounds=2)
    job["workdir"] = ".fedtune"  # beside the job file
    for tenant in job["tenants"]:
        tenant["data_uri"] = f"data/{Path(tenant['data_uri']).name}"
    (root / "job.yaml").write_text(yaml.safe_dump(job), encoding="utf-8")
    return root / "job.yaml"


def test_a_copied_project_resumes_to_the_same_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    straight = make_project(tmp_path / "straight")
    assert main(["run", str(straight), "--no-progress"]) == 0
    first = make_project(tmp_path / "here" / "project")
    assert main(["run", str(first), "--no-progress", "--until-round", "1"]) == 0
    moved = tmp_path / "elsewhere" / "deeper" / "project"
    shutil.copytree(first.parent, moved)
    shutil.rmtree(first.parent)  # moved, not copied: the old place is gone
    capsys.readouterr()
    assert main(["run", str(moved / "job.yaml"), "--no-progress", "--resume"]) == 0, capsys.readouterr().err
    assert (moved / STATE).read_bytes() == (straight.parent / STATE).read_bytes()
    summary = json.loads((moved / ".fedtune" / "runs" / "itest" / "summary.json").read_text())
    assert summary["completed"] and [r["round"] for r in summary["rounds"]] == [1, 2]


def test_a_changed_field_is_named_with_both_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_project(tmp_path / "project")
    assert main(["run", str(path), "--no-progress", "--until-round", "1"]) == 0
    job = yaml.safe_load(path.read_text())
    job["training"]["lr"] = 0.02
    job["tenants"][2]["data_uri"] = "data/tenant-a.jsonl"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    capsys.readouterr()
    assert main(["run", str(path), "--no-progress", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "training.lr: 0.01 -> 0.02" in err
    assert 'tenants.2.data_uri: "<project>/data/tenant-c.jsonl" -> "<project>/data/tenant-a.jsonl"' in err
    assert "rounds" not in err.split("changed:")[1]  # only what changed is listed


def test_a_run_stored_before_resumes_and_is_brought_up_to_date(tmp_path: Path) -> None:
    path = make_project(tmp_path / "project")
    assert main(["run", str(path), "--no-progress", "--until-round", "1"]) == 0
    record = tmp_path / "project" / ".fedtune" / "provider" / "jobs" / "itest" / "run.json"
    job = load_job(path)
    # What an earlier fedtune stored: the absolute-path fingerprint, no recorded config.
    old = {"fingerprint": legacy_fingerprint(job), "job": "itest", "run_id": None}
    record.write_text(json.dumps(old), encoding="utf-8")
    (record.parent / "run.json.sha256").unlink()
    from fedtune.storage import open_store

    open_store(str(record.parent)).put_json("run.json", old)
    assert main(["run", str(path), "--no-progress", "--resume"]) == 0
    assert json.loads(record.read_text())["fingerprint"] == config_fingerprint(job)


def test_a_moved_project_keeps_its_mlflow_artifacts_in_the_new_place(tmp_path: Path) -> None:
    from tests.integration.crash_helpers import run
    from tests.integration.test_crash_kills import registered_versions

    first = make_project(tmp_path / "here" / "project")
    job = yaml.safe_load(first.read_text())
    job["tracking"] = {"backend": "mlflow", "experiment": "itest"}
    first.write_text(yaml.safe_dump(job), encoding="utf-8")
    done = run(["run", str(first), "--no-progress", "--until-round", "1"])
    assert done.returncode == 0, done.stderr
    moved = tmp_path / "elsewhere" / "project"
    shutil.move(first.parent, moved)
    done = run(["run", str(moved / "job.yaml"), "--no-progress", "--resume"])
    assert done.returncode == 0, done.stderr
    assert not first.parent.exists()  # nothing written back into the old place
    assert len(registered_versions(moved / ".fedtune")) == 1
    import sqlite3

    with sqlite3.connect(moved / ".fedtune" / "mlflow.db") as db:
        (location,) = db.execute("SELECT storage_location FROM model_versions").fetchone()
    assert str(moved / ".fedtune" / "mlartifacts") in location
