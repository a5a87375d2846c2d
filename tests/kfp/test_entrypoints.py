"""The entrypoints a pod or component runs: markers, exit codes, and the checks they make."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedtune.core.errors import ConfigError
from fedtune.engines import layout, steps
from fedtune.entrypoints import (
    aggregate,
    client_step,
    common,
    configure_round,
    evaluate,
    export_and_register,
    final_broadcast,
    server_init,
)
from fedtune.pipelines.run_form import JOB_SCOPE, RunForm
from tests.integration.conftest import copy_data
from tests.kfp.conftest import two_tenant_dict, two_tenant_job


def test_a_job_file_error_becomes_exit_code_2_with_message_and_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        configure_round.main(["--job", str(tmp_path / "absent.yaml"), "--round", "1"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "error: job file" in err and "absent.yaml" in err and "fix:" in err


def test_steps_chain_through_markers_like_the_pipeline(tmp_path: Path) -> None:
    job = two_tenant_job(tmp_path / "w")
    job_path = tmp_path / "artifacts" / "job"
    paths = {
        n: tmp_path / "artifacts" / n for n in ("state0", "b1", "ua", "ub", "s1", "fb", "ma", "mb", "x")
    }
    form = RunForm(job_config=json.dumps(job.model_dump(mode="json")), resume_run_id=JOB_SCOPE)
    assert server_init.component(form, "fedit", str(job_path), str(paths["state0"])) == [1]
    assert common.read_job_artifact(job_path) == job
    sampled = configure_round.component(str(job_path), 1, str(paths["b1"]))
    assert sampled == ["tenant-a", "tenant-b"]
    client_step.component(str(job_path), str(paths["b1"]), "tenant-a", "run", str(paths["ua"]))
    client_step.component(str(job_path), str(paths["b1"]), "tenant-b", "run", str(paths["ub"]))
    marker = common.read_marker(paths["ua"])
    assert marker["ok"] and marker["result"]["meta"]["num_samples"] > 0
    aggregate.component(
        str(job_path), str(paths["b1"]), [str(paths["ua"]), str(paths["ub"])], str(paths["s1"])
    )
    store = layout.JobStores(job).provider()
    record = store.get_json(layout.summary_key(1))
    assert record["accepted"] == ["tenant-a", "tenant-b"] and record["wall_time"]["total"] > 0
    assert record["tenants"]["tenant-a"]["bytes_received"] == marker["result"]["bytes"]
    final_broadcast.component(str(job_path), str(paths["s1"]), str(paths["fb"]))
    evaluate.component(str(job_path), "tenant-a", "run", str(paths["ma"]))
    evaluate.component(str(job_path), "tenant-b", "run", str(paths["mb"]))
    export_and_register.component(
        str(job_path), [str(paths["ma"]), str(paths["mb"])], str(paths["x"])
    )
    done = common.read_marker(paths["x"])
    assert set(done["final_eval"]) == {"tenant-a", "tenant-b"}
    assert store.get_json(export_and_register.ARTIFACTS_KEY) == done["artifacts"]
    assert store.get_json(layout.FINAL_EVAL_KEY) == done["final_eval"]


def test_a_tenants_failure_costs_its_update_and_the_quorum_decides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = copy_data(tmp_path / "data")
    (data / "tenant-b.jsonl").write_text("{not json\n")
    raw = two_tenant_dict(tmp_path / "w", min_clients=2)
    raw["tenants"][1]["data_uri"] = str(data / "tenant-b.jsonl")
    job = common.job_from_json(json.dumps(raw), source="test")
    env = steps.ProviderEnv.create(job)
    steps.init_step(env)
    broadcast = configure_round.run(job, 1)
    good = client_step.run(job, 1, "tenant-a")
    bad = client_step.run(job, 1, "tenant-b")
    assert good["ok"] and not bad["ok"]
    assert bad["reason"].startswith("client step failed: DataError at line 1")
    assert "tenant-b.jsonl" not in bad["reason"]  # redacted: the kind and the line only
    job_path = tmp_path / "job.json"
    common.write_job_artifact(job_path, job)
    markers = []
    for name, marker in (("a", good), ("b", bad)):
        common.write_marker(tmp_path / name, marker)
        markers.append(str(tmp_path / name))
    common.write_marker(tmp_path / "b1", broadcast)
    with pytest.raises(SystemExit) as done:
        aggregate.component(str(job_path), str(tmp_path / "b1"), markers, str(tmp_path / "s1"))
    assert done.value.code == 7
    err = capsys.readouterr().err
    assert "fewer than min_clients=2" in err and "tenant-b: client step failed" in err


def test_resuming_with_a_changed_job_is_refused(tmp_path: Path) -> None:
    server_init.run(two_tenant_job(tmp_path / "w"))
    changed = two_tenant_job(tmp_path / "w", training={"local_steps": 3, "batch_size": 4})
    with pytest.raises(ConfigError, match="changed since its stored run") as info:
        server_init.run(changed)
    assert "training.local_steps: 2 -> 3" in str(info.value)


def test_a_non_json_job_config_parameter_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        common.job_from_json("{name: x", source="job_config parameter")


@pytest.mark.parametrize("recorded", [None, {"job": "kfp"}], ids=["no-run-record", "no-run-id"])
def test_a_step_that_logs_to_the_run_refuses_to_start_another_run(
    tmp_path: Path, recorded: dict[str, str] | None
) -> None:
    """Aggregate, export and the audit attach to the run server-init recorded. Without that
    record they fail with the fix, and MLflow gets no new run (one per round would scatter
    the job's metrics)."""
    from mlflow.tracking import MlflowClient

    from fedtune.core.errors import StoreError

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    job = two_tenant_job(tmp_path / "w", tracking={"backend": "mlflow", "tracking_uri": uri})
    store = layout.JobStores(job).provider()
    if recorded is not None:
        store.put_json(layout.RUN_KEY, recorded)
    with pytest.raises(StoreError, match="holds no tracking run of job 'kfp'") as err:
        common.resume_tracker(job, store)
    assert "server-init" in err.value.fix
    assert (layout.RUN_KEY in str(err.value)) and ("no run_id" in str(err.value)) == (recorded is not None)
    client = MlflowClient(uri)
    assert all(not client.search_runs([e.experiment_id]) for e in client.search_experiments())


def test_with_tracking_off_a_step_needs_no_recorded_run(tmp_path: Path) -> None:
    from fedtune.tracking.base import NullTracker

    job = two_tenant_job(tmp_path / "w")  # tracking: none
    store = layout.JobStores(job).provider()
    assert isinstance(common.resume_tracker(job, store), NullTracker)
