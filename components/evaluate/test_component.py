"""evaluate: the final model's metrics on the tenant's held-out split, outside a cluster in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.engines import steps
from fedtune.entrypoints import evaluate, final_broadcast
from tests.kfp.component_checks import assert_folder_consistent, initialised, marker
from tests.kfp.conftest import two_tenant_job


def test_spec_metadata_and_readme_agree() -> None:
    assert_folder_consistent("evaluate")


def test_reports_the_final_models_metrics(tmp_path: Path) -> None:
    job = two_tenant_job(tmp_path / "w")
    job_path = initialised(tmp_path, job, rounds_configured=1)
    env = steps.ProviderEnv.create(job)
    for tenant in ("tenant-a", "tenant-b"):
        steps.client_step(steps.TenantEnv.create(env.job, tenant), 1)
    steps.aggregate_step(env, 1, ["tenant-a", "tenant-b"])
    final_broadcast.component(str(job_path), str(tmp_path / "closed"), str(tmp_path / "fb"))
    evaluate.component(str(job_path), "tenant-b", "run", str(tmp_path / "m"))
    got = marker(tmp_path / "m")
    tenant_env = steps.TenantEnv.create(env.job, "tenant-b")
    assert got["tenant"] == "tenant-b" and got["metrics"] == steps.evaluate_step(tenant_env)


def test_before_the_last_round_there_is_nothing_to_evaluate(tmp_path: Path) -> None:
    job_path = initialised(tmp_path, two_tenant_job(tmp_path / "w"))
    with pytest.raises(SystemExit) as done:
        evaluate.component(str(job_path), "tenant-a", "run", str(tmp_path / "m"))
    assert done.value.code == 4  # the final state is not stored yet


def test_without_the_final_broadcast_it_publishes_nothing_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = two_tenant_job(tmp_path / "w")
    job_path = initialised(tmp_path, job, rounds_configured=1)
    env = steps.ProviderEnv.create(job)
    for tenant in ("tenant-a", "tenant-b"):
        steps.client_step(steps.TenantEnv.create(env.job, tenant), 1)
    steps.aggregate_step(env, 1, ["tenant-a", "tenant-b"])
    with pytest.raises(SystemExit) as done:
        evaluate.component(str(job_path), "tenant-a", "run", str(tmp_path / "m"))
    assert done.value.code == 4
    assert "final-broadcast" in capsys.readouterr().err
    # The tenant task did no provider work: nothing was published for anyone.
    assert not any(steps.final_broadcast_published(job, t) for t in ("tenant-a", "tenant-b"))
