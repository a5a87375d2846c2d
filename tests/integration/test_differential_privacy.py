"""Differential privacy in the in-process engine: bounded contributions, epsilon, the budget stop."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dp_accounting
import pytest
import torch
import yaml
from dp_accounting.rdp import RdpAccountant
from mlflow.tracking import MlflowClient

from fedtune.algorithms.fedavg import FedAvg
from fedtune.cli.main import main
from fedtune.config import JobConfig
from fedtune.core.errors import PrivacyBudgetError, UpdateRejected
from fedtune.core.messages import Broadcast, ServerState, Update
from fedtune.engines import layout, privacy_steps
from fedtune.engines.local import RunOptions, run_job
from fedtune.privacy.clipping import l2_norm
from fedtune.tracking.base import NullTracker
from fedtune.tracking.factory import make_tracker
from fedtune.tracking.mlflow_tracker import local_tracking_uri
from tests.integration.conftest import tiny_job_dict

pytestmark = pytest.mark.slow  # whole jobs (about 25 s each on a busy 2-core machine)

QUIET = RunOptions(progress=False)
UNIFORM = {"name": "fedavg", "aggregation_weights": "uniform"}


def _library_epsilon(noise_multipliers: list[float], delta: float) -> float:
    """Every tenant every round: composed Gaussian mechanisms, add/remove adjacency."""
    accountant = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    for z in noise_multipliers:
        accountant.compose(dp_accounting.GaussianDpEvent(z))
    return float(accountant.get_epsilon(delta))


def _dp_job(make_job: Callable[..., JobConfig], dp: dict[str, Any], **overrides: Any) -> JobConfig:
    overrides.setdefault("algorithm", UNIFORM)
    return make_job(differential_privacy=dp, **overrides)


def _adapter(job: JobConfig, round_index: int) -> dict[str, torch.Tensor]:
    state = ServerState.load(layout.JobStores(job).provider(), layout.state_key(round_index))
    return state.group("adapter")


def _delta_norm(after: dict[str, torch.Tensor], before: dict[str, torch.Tensor]) -> float:
    return l2_norm({k: after[k].double() - before[k].double() for k in before})


def _huge_update_for(tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    original = FedAvg.client_step

    def step(self, ctx, broadcast, data, client_state):  # type: ignore[no-untyped-def]
        update, state = original(self, ctx, broadcast, data, client_state)
        if data.tenant == tenant:
            update.tensors = {k: v + 1e4 for k, v in update.tensors.items()}
        return update, state

    monkeypatch.setattr(FedAvg, "client_step", step)


def test_a_huge_update_is_clipped_on_the_tenant_and_again_by_the_provider(
    make_job: Callable[..., JobConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    _huge_update_for("tenant-b", monkeypatch)
    clip_norm = 0.01
    job = _dp_job(make_job, {"noise_multiplier": 1e-6, "clipping": {"norm": clip_norm}}, rounds=1)
    run_job(job, NullTracker(), QUIET)
    stores = layout.JobStores(job)
    reference = Broadcast.load(stores.provider(), layout.broadcast_key(1)).group("adapter")
    for tenant in ("tenant-a", "tenant-b", "tenant-c"):
        uploaded = Update.load(stores.exchange(tenant), layout.update_key(1)).group("adapter")
        assert _delta_norm(uploaded, reference) <= clip_norm * (1 + 1e-4), tenant
    # The global step is the mean of three deltas of norm <= C (plus 1e-6 C noise).
    assert _delta_norm(_adapter(job, 1), _adapter(job, 0)) <= clip_norm * (1 + 1e-3)

    # A tenant that skips its clipping is clipped by the provider all the same (central noise);
    # the default bound on an update's norm (which would reject this one first) is off here.
    monkeypatch.setattr(privacy_steps, "privatize_update", lambda env, r, update: update)
    skipping = _dp_job(make_job, {"noise_multiplier": 1e-6, "clipping": {"norm": clip_norm}}, rounds=1,
                       limits={"max_update_norm_ratio": None})
    assert run_job(skipping, NullTracker(), QUIET)["rounds"][0]["accepted"] == ["tenant-a", "tenant-b", "tenant-c"]
    raw = Update.load(layout.JobStores(skipping).exchange("tenant-b"), layout.update_key(1)).group("adapter")
    assert _delta_norm(raw, reference) > 1e3  # it did upload the huge update
    step = _delta_norm(_adapter(skipping, 1), _adapter(skipping, 0))
    assert step <= clip_norm * (1 + 1e-3)


def test_epsilon_per_round_matches_the_library_and_reaches_mlflow(make_job: Callable[..., JobConfig]) -> None:
    dp = {"noise_multiplier": 0.8, "clipping": {"norm": 0.05}, "delta": 1e-6}
    job = _dp_job(make_job, dp, rounds=2, tracking={"backend": "mlflow"})
    summary = run_job(job, make_tracker(job), QUIET)
    expected = [_library_epsilon([0.8] * r, 1e-6) for r in (1, 2)]
    privacy = summary["privacy"]
    assert [r["epsilon"] for r in privacy["rounds"]] == pytest.approx(expected, rel=1e-9)
    assert privacy["epsilon"] == pytest.approx(expected[-1], rel=1e-9)
    assert privacy["adjacency"] == "add/remove one tenant"
    client = MlflowClient(tracking_uri=local_tracking_uri(job.workdir))
    history = client.get_metric_history(summary["mlflow_run_id"], "server/dp/epsilon")
    assert [(h.step, h.value) for h in sorted(history, key=lambda h: h.step)] == [
        (1, pytest.approx(expected[0])),
        (2, pytest.approx(expected[1])),
    ]


def test_a_target_epsilon_stops_the_run_before_the_round_that_would_exceed_it(
    make_job: Callable[..., JobConfig],
) -> None:
    z = 1.0
    target = (_library_epsilon([z] * 2, 1e-5) + _library_epsilon([z] * 3, 1e-5)) / 2
    dp = {"noise_multiplier": z, "clipping": {"norm": 0.05}, "target_epsilon": target}
    job = _dp_job(make_job, dp, rounds=5)
    summary = run_job(job, NullTracker(), QUIET)
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    privacy = summary["privacy"]
    assert privacy["stopped_before_round"] == 3 and privacy["rounds_requested"] == 5
    assert privacy["epsilon"] <= target < privacy["epsilon_if_continued"]
    assert summary["completed"] and "model" in summary["artifacts"]  # round 2's model, exported
    store = layout.JobStores(job).provider()
    assert not store.exists(f"{layout.state_key(3)}.json")


def test_distributed_noise_lost_with_a_dropout_is_accounted_and_stops_the_run_in_time(
    make_job: Callable[..., JobConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    original = FedAvg.client_step

    def b_dies_in_round_1(self, ctx, broadcast, data, client_state):  # type: ignore[no-untyped-def]
        if data.tenant == "tenant-b" and int(broadcast.meta["round"]) == 1:
            raise UpdateRejected("tenant-b lost its connection")
        return original(self, ctx, broadcast, data, client_state)

    monkeypatch.setattr(FedAvg, "client_step", b_dies_in_round_1)
    z = 1.0
    # Three full rounds fit the target; with round 1's lost share (z * sqrt(2/3)) they do not.
    target = _library_epsilon([z] * 3, 1e-5) * 1.001
    lost = z * math.sqrt(2 / 3)
    assert _library_epsilon([lost, z, z], 1e-5) > target
    dp = {"noise_multiplier": z, "clipping": {"norm": 0.05}, "placement": "distributed", "target_epsilon": target}
    job = _dp_job(make_job, dp, rounds=3, secure_aggregation={"enabled": True, "threshold": 2})
    with pytest.raises(PrivacyBudgetError, match="round 3 would raise epsilon") as info:
        run_job(job, NullTracker(), QUIET)
    assert "--resume" in info.value.fix
    records = privacy_steps.history(layout.JobStores(job).provider())
    assert [r["noise_multiplier"] for r in records] == pytest.approx([lost, z])
    assert records[-1]["epsilon"] == pytest.approx(_library_epsilon([lost, z], 1e-5), rel=1e-9)
    # Resuming evaluates and exports round 2's model.
    summary = run_job(job, NullTracker(), RunOptions(progress=False, resume=True))
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    assert summary["privacy"]["stopped_before_round"] == 3 and "model" in summary["artifacts"]


def test_the_cli_prints_epsilon_and_refuses_a_target_no_round_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dp = {"noise_multiplier": 1.0, "clipping": {"norm": 0.05}}
    job = tiny_job_dict(tmp_path / "w", rounds=1, algorithm=UNIFORM, differential_privacy=dp)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    assert main(["run", str(path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"differential privacy: epsilon {_library_epsilon([1.0], 1e-5):.4g} at delta 1e-05" in out

    job = tiny_job_dict(tmp_path / "w2", rounds=3, algorithm=UNIFORM, differential_privacy={**dp, "target_epsilon": 1.0})
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    assert main(["run", str(path), "--no-progress"]) == PrivacyBudgetError.exit_code
    err = capsys.readouterr().err
    assert "one round already gives epsilon=4.729" in err and "target_epsilon=1" in err
    assert not (tmp_path / "w2" / "provider" / "jobs" / "itest" / "state").exists()


@pytest.mark.parametrize(
    "algorithm",
    [UNIFORM, {"name": "fedprox", "mu": 0.01, "aggregation_weights": "uniform"},
     {"name": "fedadam", "aggregation_weights": "uniform"}],
    ids=["fedavg", "fedprox", "fedadam"],
)
def test_with_clipping_that_never_binds_and_negligible_noise_dp_is_the_plain_algorithm(
    make_job: Callable[..., JobConfig], algorithm: dict[str, Any]
) -> None:
    # One round: later rounds train from states that differ in the last float32 bits, and
    # training amplifies that (FedProx's proximal term most).
    plain = make_job(rounds=1, algorithm=algorithm)
    run_job(plain, NullTracker(), QUIET)
    private = _dp_job(make_job, {"noise_multiplier": 1e-9, "clipping": {"norm": 100.0}}, rounds=1, algorithm=algorithm)
    run_job(private, NullTracker(), QUIET)
    a, b = _adapter(plain, 1), _adapter(private, 1)
    assert any(not torch.equal(a[k], _adapter(plain, 0)[k]) for k in a)  # the round moved the adapter
    for key in a:  # noise std 1e-7 on the sum; float32 rounding of theta + delta
        assert torch.allclose(a[key], b[key], atol=1e-6, rtol=0), key
