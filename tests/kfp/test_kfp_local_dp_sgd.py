"""A tenant's DP-SGD under kfp.local: the compiled pipeline's tenant task applies it as the
local engine does (the same noise from the same secret, so bit for bit the same state)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.config import parse_job
from fedtune.engines.steps import TenantEnv
from fedtune.engines.tenant import dp_sgd as dp_sgd_steps
from tests.kfp.conftest import two_tenant_dict
from tests.kfp.test_kfp_local import run_both


@pytest.mark.slow
def test_kfp_local_applies_a_tenants_dp_sgd_as_the_local_engine_does(tmp_path: Path) -> None:
    jobs = []
    for name in ("local", "kfp"):
        d = two_tenant_dict(tmp_path / name)
        d["tenants"][0]["dp_sgd"] = {"noise_multiplier": 1.0, "max_grad_norm": 0.5}
        job = parse_job(d)
        TenantEnv.create(job, "tenant-a").own.put_json(dp_sgd_steps.SECRET_KEY, {"seed": 99})
        jobs.append(job)
    expected, got = run_both(*jobs)
    for summary in (expected, got):
        metrics = summary["rounds"][0]["tenants"]["tenant-a"]["metrics"]
        assert metrics["dp_sgd/epsilon"] > 0
    books = [dp_sgd_steps.ledger(TenantEnv.create(j, "tenant-a")) for j in jobs]
    assert books[0] == books[1] and sorted(books[1]["rounds"]) == ["1"]
