"""record_audit: pooled scores stored by the provider; a missing tenant result is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.engines import layout, steps
from fedtune.entrypoints import record_audit
from tests.kfp.component_checks import assert_folder_consistent, initialised, marker
from tests.kfp.conftest import two_tenant_job


def test_spec_metadata_and_readme_agree() -> None:
    assert_folder_consistent("record_audit")


def _audited_job(tmp_path: Path):  # type: ignore[no-untyped-def]
    job = two_tenant_job(tmp_path / "w")
    return job.model_copy(update={"audit": job.audit.model_copy(update={"enabled": True})})


def test_pools_what_the_tenants_wrote(tmp_path: Path) -> None:
    job = _audited_job(tmp_path)
    job_path = initialised(tmp_path, job)
    numbers = {"n": 4, "mean": 0.5, "p50": 0.5, "p90": 0.9, "max": 1.0, "num_at_or_above": 1,
               "threshold": 0.7}
    for name, n in (("tenant-a", 4), ("tenant-b", 12)):
        exchange = steps.TenantEnv.create(job, name).exchange
        exchange.put_json(layout.final_audit_key(job.rounds), {**numbers, "n": n})
    record_audit.component(str(job_path), [], str(tmp_path / "a"))
    pooled = marker(tmp_path / "a")["audit"]["pooled"]
    assert pooled["n"] == 16 and pooled["mean"] == 0.5 and pooled["num_at_or_above"] == 2
    stored = steps.ProviderEnv.create(job).store().get_json(layout.AUDIT_KEY)
    assert stored["pooled"] == pooled


def test_a_tenant_without_scores_is_named(tmp_path: Path) -> None:
    job_path = initialised(tmp_path, _audited_job(tmp_path))
    with pytest.raises(SystemExit) as done:
        record_audit.component(str(job_path), [], str(tmp_path / "a"))
    assert done.value.code == 3  # DataError: tenant-a delivered no scores
