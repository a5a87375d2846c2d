"""Secure aggregation and DP-FedAvg through the compiled pipelines under kfp.local, against the
local engine: same model (bitwise under secure aggregation), same privacy accounting, same stop.

Three tenants, a 2-layer model: a secure round is 5 + 4 x 3 tasks, each a fresh Python
process, so these are slow tests (3 to 14 minutes each on a shared 2-core machine).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedtune.cli.kfp_commands import run_kfp_local
from fedtune.config import JobConfig, parse_job
from fedtune.core.messages import ServerState, Update
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.tracking.base import NullTracker
from tests.integration.conftest import tiny_job_dict

pytestmark = pytest.mark.slow

QUIET = RunOptions(progress=False)
UNIFORM = {"name": "fedavg", "aggregation_weights": "uniform"}


def _job(workdir: Path, **overrides: Any) -> JobConfig:
    return parse_job(tiny_job_dict(workdir, **overrides))


def _state(job: JobConfig, round_index: int) -> dict[str, torch.Tensor]:
    return ServerState.load(layout.JobStores(job).provider(), layout.state_key(round_index)).tensors


def test_secure_aggregation_on_kfp_local_equals_the_local_engine_bitwise_with_a_dropout(
    tmp_path: Path,
) -> None:
    """tenant-b trains, then refuses its own update (its sample cap) after sharing its keys:
    the round unmasks the survivors' sum from b's key shares, in both engines alike."""
    settings: dict[str, Any] = {
        "rounds": 1,  # 17 tasks per secure round, each a fresh process: one round keeps it minutes
        "secure_aggregation": {"enabled": True, "threshold": 2},
        "tenants": [
            {"name": f"tenant-{x}", "data_uri": tiny_job_dict(tmp_path)["tenants"][i]["data_uri"],
             **({"max_samples": 1} if x == "b" else {})}
            for i, x in enumerate("abc")
        ],
    }
    local_job = _job(tmp_path / "local", **settings)
    kfp_job = _job(tmp_path / "kfp", **settings)
    expected = run_job(local_job, NullTracker(), QUIET)
    got = run_kfp_local(kfp_job, QUIET)

    a, b = _state(local_job, 1), _state(kfp_job, 1)
    assert a.keys() == b.keys() and any(k.startswith("adapter/") for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert got["completed"] and got.keys() == expected.keys()
    for mine, theirs in zip(got["rounds"], expected["rounds"], strict=True):
        assert mine["accepted"] == theirs["accepted"] == ["tenant-a", "tenant-c"]
        assert mine["rejected"].keys() == theirs["rejected"].keys() == {"tenant-b"}
        # The provider learns only the redacted kind; the details stay in tenant-b's store.
        assert "UpdateRejected" in mine["rejected"]["tenant-b"] and "UpdateRejected" in theirs["rejected"]["tenant-b"]
        # Masked bytes are left out: the update's JSON carries timings of varying length.
        for name in ("secagg/plain_update_bytes", "secagg/rejected_shares"):
            assert mine["server_metrics"][name] == theirs["server_metrics"][name], name
        assert mine["server_metrics"]["secagg/protocol_bytes"] > 0
        assert mine["server_metrics"]["secagg/masked_update_bytes"] > mine["server_metrics"]["secagg/plain_update_bytes"]
    assert got["final_eval"] == expected["final_eval"]
    # The provider's exchange holds only the masked upload of each survivor.
    upload = Update.load(layout.JobStores(kfp_job).exchange("tenant-a"), layout.update_key(1))
    assert list(upload.tensors) == ["secagg/masked"]


def test_central_dp_on_kfp_local_accounts_and_stops_like_the_local_engine(tmp_path: Path) -> None:
    """DP-FedAvg with central noise: the same clip norm, noise and epsilon per round, and a
    target epsilon that allows 2 of the 3 rounds stops the pipeline's round loop after 2."""
    from fedtune.engines.privacy_steps import sampling
    from fedtune.privacy.accountant import epsilon

    dp: dict[str, Any] = {"noise_multiplier": 0.8, "clipping": {"norm": 0.05}, "delta": 1e-5}
    probe = _job(tmp_path / "probe", algorithm=UNIFORM, differential_privacy=dp)
    two, three = (epsilon(sampling(probe), [0.8] * n, 1e-5) for n in (2, 3))
    dp["target_epsilon"] = (two + three) / 2
    local_job = _job(tmp_path / "local", rounds=3, algorithm=UNIFORM, differential_privacy=dp)
    kfp_job = _job(tmp_path / "kfp", rounds=3, algorithm=UNIFORM, differential_privacy=dp)
    expected = run_job(local_job, NullTracker(), QUIET)
    got = run_kfp_local(kfp_job, QUIET)

    assert got["completed"] and [r["round"] for r in got["rounds"]] == [1, 2]
    assert got["privacy"] == expected["privacy"]  # per-round epsilon, noise, clip norm, the stop
    assert got["privacy"]["stopped_before_round"] == 3
    assert got["privacy"]["epsilon"] == pytest.approx(two) and two <= dp["target_epsilon"]
    for mine, theirs in zip(got["rounds"], expected["rounds"], strict=True):
        assert mine["server_metrics"]["dp/epsilon"] == theirs["server_metrics"]["dp/epsilon"]
    assert not ServerState.stored(layout.JobStores(kfp_job).provider(), layout.state_key(3))
    assert got["artifacts"].keys() == expected["artifacts"].keys()
