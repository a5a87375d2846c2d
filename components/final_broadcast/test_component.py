"""final_broadcast: the provider publishes the final broadcast to every tenant, once."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.core.messages import Broadcast
from fedtune.engines import layout, steps
from fedtune.entrypoints import final_broadcast
from tests.kfp.component_checks import assert_folder_consistent, initialised, marker
from tests.kfp.conftest import two_tenant_job


def test_spec_metadata_and_readme_agree() -> None:
    assert_folder_consistent("final_broadcast")


def test_publishes_the_final_broadcast_to_every_tenant_once(tmp_path: Path) -> None:
    job = two_tenant_job(tmp_path / "w")
    job_path = initialised(tmp_path, job, rounds_configured=1)
    env = steps.ProviderEnv.create(job)
    for tenant in ("tenant-a", "tenant-b"):
        steps.client_step(steps.TenantEnv.create(env.job, tenant), 1)
    steps.aggregate_step(env, 1, ["tenant-a", "tenant-b"])
    final_broadcast.component(str(job_path), str(tmp_path / "closed"), str(tmp_path / "fb"))
    got = marker(tmp_path / "fb")
    assert got["tenants"] == ["tenant-a", "tenant-b"] and got["bytes"] > 0
    stores = layout.JobStores(env.job)
    key = layout.final_tenant_broadcast_key(job.rounds)
    record = Broadcast.load(stores.provider(), layout.final_broadcast_key(job.rounds))
    expected = env.algorithm.final_broadcast(env.ctx, steps.final_state(env))
    for tenant in ("tenant-a", "tenant-b"):
        sent = Broadcast.load(stores.exchange(tenant), key)
        assert sent.tensors.keys() == expected.tensors.keys() == record.tensors.keys()
    # Run again (a retried task): it finds what it published and writes the same bytes.
    before = stores.exchange("tenant-a").get_bytes(key + ".safetensors")
    final_broadcast.component(str(job_path), str(tmp_path / "closed"), str(tmp_path / "fb2"))
    assert stores.exchange("tenant-a").get_bytes(key + ".safetensors") == before


def test_before_the_last_round_there_is_nothing_to_publish(tmp_path: Path) -> None:
    job_path = initialised(tmp_path, two_tenant_job(tmp_path / "w"))
    with pytest.raises(SystemExit) as done:
        final_broadcast.component(str(job_path), str(tmp_path / "closed"), str(tmp_path / "fb"))
    assert done.value.code == 4  # the final state is not stored yet
    assert not (tmp_path / "fb").exists()
