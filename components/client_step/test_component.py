"""client_step: outside a cluster it trains in-process; a tenant's failure becomes its marker."""

from __future__ import annotations

from pathlib import Path

from fedtune.core.messages import Update
from fedtune.engines import layout
from fedtune.entrypoints import client_step
from tests.kfp.component_checks import assert_folder_consistent, initialised, marker
from tests.kfp.conftest import two_tenant_job


def test_spec_metadata_and_readme_agree() -> None:
    assert_folder_consistent("client_step")


def test_trains_in_process_and_stores_the_update(tmp_path: Path) -> None:
    job = two_tenant_job(tmp_path / "w")
    job_path = initialised(tmp_path, job, rounds_configured=1)
    b1 = str(tmp_path / "artifacts" / "b1")
    client_step.component(str(job_path), b1, "tenant-a", "run-1", str(tmp_path / "u"))
    got = marker(tmp_path / "u")
    assert got["ok"] and got["tenant"] == "tenant-a" and got["result"]["meta"]["num_samples"] > 0
    assert Update.stored(layout.JobStores(job).exchange("tenant-a"), layout.update_key(1))


def test_a_tenants_failure_is_recorded_not_raised(tmp_path: Path) -> None:
    job_path = initialised(tmp_path, two_tenant_job(tmp_path / "w"), rounds_configured=1)
    b1 = str(tmp_path / "artifacts" / "b1")
    client_step.component(str(job_path), b1, "tenant-z", "run-1", str(tmp_path / "u"))
    got = marker(tmp_path / "u")
    assert not got["ok"] and "ConfigError" in got["reason"]
