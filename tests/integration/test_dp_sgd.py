"""A tenant's own DP-SGD in whole jobs: applied to it alone, accounted, refused past its budget,
resumed bitwise, and insisted on by the tenant where the job is silent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fedtune.config import JobConfig, parse_job
from fedtune.config.capabilities import dp_sgd_algorithms
from fedtune.core.messages import Update
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.engines.steps import TenantEnv
from fedtune.engines.tenant import dp_sgd as dp_sgd_steps
from fedtune.privacy.example_level import epsilon
from fedtune.tracking.base import NullTracker
from tests.integration.conftest import tiny_job_dict
from tests.integration.test_algorithm_table import JOB_OVERRIDES, TABLE
from tests.integration.test_fedit_reference import final_adapter

pytestmark = pytest.mark.slow  # whole jobs

QUIET = RunOptions(progress=False)
DP = {"noise_multiplier": 1.0, "max_grad_norm": 0.5}


def _job(tmp_path: Path, name: str, dp: dict[str, Any] | None = DP, **overrides: Any) -> JobConfig:
    d = tiny_job_dict(tmp_path / name, **overrides)
    if dp is not None:
        d["tenants"][0]["dp_sgd"] = dp
    return parse_job(d)


def _update(job: JobConfig, tenant: str, round_index: int) -> Update:
    return Update.load(layout.JobStores(job).exchange(tenant), layout.update_key(round_index))


def _own(job: JobConfig, tenant: str = "tenant-a") -> Any:
    return TenantEnv.create(job, tenant).own


def _same_secret(*jobs: JobConfig) -> None:
    """Give tenant-a the same secret seed in every job (bitwise comparisons across runs)."""
    for job in jobs:
        _own(job).put_json(dp_sgd_steps.SECRET_KEY, {"seed": 12345})


def test_one_tenants_dp_sgd_leaves_the_others_alone_and_reports_its_epsilon(tmp_path: Path) -> None:
    plain = _job(tmp_path, "plain", dp=None)
    private = _job(tmp_path, "private")
    run_job(plain, NullTracker(), QUIET)
    summary = run_job(private, NullTracker(), QUIET)

    for tenant in ("tenant-b", "tenant-c"):  # same broadcast in round 1: bit for bit the same update
        a, b = _update(plain, tenant, 1), _update(private, tenant, 1)
        assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors), tenant
    a, b = _update(plain, "tenant-a", 1), _update(private, "tenant-a", 1)
    assert not all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)

    book = dp_sgd_steps.ledger(TenantEnv.create(private, "tenant-a"))
    assert sorted(book["rounds"]) == ["1", "2"]
    q = 4 / len(TenantEnv.create(private, "tenant-a").ctx.encode(TenantEnv.create(private, "tenant-a").data().train))
    for r in (1, 2):
        entry = book["rounds"][str(r)]
        assert entry["sample_rate"] == pytest.approx(q) and entry["steps"] == 2
        assert entry["epsilon"] == pytest.approx(epsilon([(1.0, q, 2)] * r, 1e-5))
        assert isinstance(entry["train_loss"], float)  # the tenant keeps its losses ...
        shown = summary["rounds"][r - 1]["tenants"]
        assert shown["tenant-a"]["metrics"]["dp_sgd/epsilon"] == entry["epsilon"]
        assert shown["tenant-a"]["train_loss"] is None  # ... the provider does not get them
        assert shown["tenant-b"]["metrics"] == {} and shown["tenant-b"]["train_loss"] is not None
    assert book["rounds"]["2"]["epsilon"] > book["rounds"]["1"]["epsilon"]


def test_target_epsilon_stops_the_tenant_and_the_rounds_go_on(tmp_path: Path) -> None:
    probe = _job(tmp_path, "probe")
    env = TenantEnv.create(probe, "tenant-a")
    q = 4 / len(env.ctx.encode(env.data().train))
    target = (epsilon([(1.0, q, 2)], 1e-5) + epsilon([(1.0, q, 2)] * 2, 1e-5)) / 2
    job = _job(tmp_path, "target", dp={**DP, "target_epsilon": target}, rounds=3)
    summary = run_job(job, NullTracker(), QUIET)

    assert summary["completed"]
    assert summary["rounds"][0]["accepted"] == ["tenant-a", "tenant-b", "tenant-c"]
    for record in summary["rounds"][1:]:
        assert record["accepted"] == ["tenant-b", "tenant-c"]
        assert "differential-privacy" in record["rejected"]["tenant-a"]  # redacted for the provider
    own = _own(job)
    assert sorted(dp_sgd_steps.ledger(TenantEnv.create(job, "tenant-a"))["rounds"]) == ["1"]
    details = "".join(own.get_bytes(k).decode() for k in own.list("errors/"))
    assert "refuses to train" in details and f"target_epsilon={target:g}" in details


def test_resume_after_a_crash_is_bitwise_equal_and_accounts_each_round_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    straight, crashed = _job(tmp_path, "straight", rounds=3), _job(tmp_path, "crashed", rounds=3)
    _same_secret(straight, crashed)
    run_job(straight, NullTracker(), QUIET)

    class Crash(BaseException):
        """The process killed after the tenant's ledger is written, before its update is."""

    original = dp_sgd_steps.finish

    def dies_in_round_2(env, round_index, run, update):  # type: ignore[no-untyped-def]
        out = original(env, round_index, run, update)
        if round_index == 2:
            raise Crash()
        return out

    monkeypatch.setattr(dp_sgd_steps, "finish", dies_in_round_2)
    with pytest.raises(Crash):
        run_job(crashed, NullTracker(), QUIET)
    monkeypatch.setattr(dp_sgd_steps, "finish", original)
    run_job(crashed, NullTracker(), RunOptions(progress=False, resume=True))

    a, b = final_adapter(straight), final_adapter(crashed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    books = [dp_sgd_steps.ledger(TenantEnv.create(j, "tenant-a")) for j in (straight, crashed)]
    assert books[0] == books[1] and sorted(books[1]["rounds"]) == ["1", "2", "3"]


def test_the_tenant_insists_through_its_own_store(tmp_path: Path) -> None:
    job = _job(tmp_path, "silent", dp=None, rounds=1)  # the provider's job says nothing
    policy = Path(_own(job).uri.removeprefix("file://")) / dp_sgd_steps.POLICY_KEY
    policy.parent.mkdir(parents=True, exist_ok=True)
    policy.write_text(json.dumps({**DP, "share_epsilon": False}))
    summary = run_job(job, NullTracker(), QUIET)

    book = dp_sgd_steps.ledger(TenantEnv.create(job, "tenant-a"))
    assert book["rounds"]["1"]["source"] == "tenant" and book["rounds"]["1"]["epsilon"] > 0
    shown = summary["rounds"][0]["tenants"]["tenant-a"]
    assert shown["metrics"] == {}  # the tenant keeps its epsilon to itself
    assert shown["notes"] == ["example-level DP-SGD applied (the tenant keeps its epsilon to itself)"]


@pytest.mark.parametrize("algorithm", dp_sgd_algorithms())
def test_dp_sgd_runs_in_every_algorithm_that_trains_through_the_loop(
    tmp_path: Path, algorithm: str
) -> None:
    overrides: dict[str, Any] = {"algorithm": TABLE[algorithm], "rounds": 1, **JOB_OVERRIDES.get(algorithm, {})}
    if algorithm == "scaffold":
        overrides["training"] = {"local_steps": 2, "batch_size": 4, "lr": 0.01, "max_seq_len": 160,
                                 "optimizer": "sgd"}
    job = _job(tmp_path, algorithm, **overrides)
    summary = run_job(job, NullTracker(), QUIET)
    assert summary["completed"]
    first = job.tenants[0].name  # the one with dp_sgd ("all" for a single-tenant algorithm)
    assert summary["rounds"][0]["tenants"][first]["metrics"]["dp_sgd/epsilon"] > 0
    assert first in summary["rounds"][0]["accepted"]


def test_dp_sgd_composes_with_dp_fedavg_and_secure_aggregation(tmp_path: Path) -> None:
    job = _job(
        tmp_path, "layered", rounds=1,
        algorithm={"name": "fedavg", "aggregation_weights": "uniform"},
        differential_privacy={"noise_multiplier": 1.0, "clipping": {"norm": 0.05}, "placement": "distributed"},
        secure_aggregation={"enabled": True, "threshold": 2},
    )
    summary = run_job(job, NullTracker(), QUIET)
    assert summary["completed"] and summary["rounds"][0]["accepted"] == ["tenant-a", "tenant-b", "tenant-c"]
    assert summary["rounds"][0]["tenants"]["tenant-a"]["metrics"]["dp_sgd/epsilon"] > 0
    assert summary["privacy"]["epsilon"] > 0  # the provider's client-level epsilon beside it


def test_a_tenant_with_its_own_mlflow_gets_every_round_there(tmp_path: Path) -> None:
    import mlflow

    uri = f"sqlite:///{tmp_path / 'tenant-a-mlflow.db'}"
    d = tiny_job_dict(tmp_path / "tracked")
    d["tenants"][0].update(dp_sgd=DP, tracking={"tracking_uri": uri})
    job = parse_job(d)
    run_job(job, NullTracker(), QUIET)
    book = dp_sgd_steps.ledger(TenantEnv.create(job, "tenant-a"))
    client = mlflow.MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(book["mlflow_run_id"], "dp_sgd/epsilon")
    assert [(m.step, m.value) for m in history] == [(r, book["rounds"][str(r)]["epsilon"]) for r in (1, 2)]
    assert [m.step for m in client.get_metric_history(book["mlflow_run_id"], "dp_sgd/train_loss")] == [1, 2]
