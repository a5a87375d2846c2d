"""audit: a tenant's memorization scores of the final model, outside a cluster in-process."""

from __future__ import annotations

from pathlib import Path

from fedtune.engines import layout, steps
from fedtune.entrypoints import audit, final_broadcast
from tests.kfp.component_checks import assert_folder_consistent, initialised, marker
from tests.kfp.conftest import two_tenant_job


def test_spec_metadata_and_readme_agree() -> None:
    assert_folder_consistent("audit")


def test_only_numbers_reach_the_exchange_and_the_details_stay_with_the_tenant(
    tmp_path: Path,
) -> None:
    job = two_tenant_job(tmp_path / "w")
    job = job.model_copy(update={"audit": job.audit.model_copy(
        update={"enabled": True, "records": 2, "max_new_tokens": 4})})
    job_path = initialised(tmp_path, job, rounds_configured=1)
    env = steps.ProviderEnv.create(job)
    for tenant in ("tenant-a", "tenant-b"):
        steps.client_step(steps.TenantEnv.create(env.job, tenant), 1)
    steps.aggregate_step(env, 1, ["tenant-a", "tenant-b"])
    final_broadcast.component(str(job_path), str(tmp_path / "closed"), str(tmp_path / "fb"))
    audit.component(str(job_path), "tenant-b", "run", str(tmp_path / "s"))
    got = marker(tmp_path / "s")
    assert got["tenant"] == "tenant-b" and got["scores"]["n"] == 2
    tenant = steps.TenantEnv.create(env.job, "tenant-b")
    assert tenant.exchange.get_json(layout.final_audit_key(job.rounds)) == got["scores"]
    assert len(tenant.own.get_json(layout.audit_report_key(job.rounds))["records"]) == 2
