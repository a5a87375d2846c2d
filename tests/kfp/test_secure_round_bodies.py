"""A secure round through the KFP component bodies, in this process: the tasks of
``fedtune-secure-round`` in the pipeline's order, their markers passed as the pipeline passes
them. DP-FedAvg with distributed noise composes with it: every tenant adds its noise share
before masking, and the round is accounted like the local engine's."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.config import parse_job
from fedtune.core.errors import FedtuneError
from fedtune.core.messages import ServerState
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.entrypoints import secagg_round
from fedtune.tracking.base import NullTracker
from tests.integration.conftest import tiny_job_dict
from tests.kfp.component_checks import initialised, marker

SECURE = {"enabled": True, "threshold": 2}
DISTRIBUTED = {"noise_multiplier": 0.5, "clipping": {"norm": 0.05}, "placement": "distributed"}


def _secure_round(tmp_path: Path, job_path: Path, tenants: list[str]) -> dict:  # type: ignore[type-arg]
    """Run round 1's secure tasks (configure already ran); return the aggregate's marker."""
    art = tmp_path / "artifacts"
    previous = art / "b1"
    names = tenants
    for phase, step in (("secagg-advertise", "route-keys"), ("secagg-share", "route-shares"),
                        ("client", "request-unmask")):
        outs = []
        for name in names:
            out = art / f"{phase}-{name}"
            secagg_round.tenant_component(phase, str(job_path), str(previous), name, "run", str(out))  # type: ignore[arg-type]
            outs.append(str(out))
        log = art / f"{step}.json"
        names = secagg_round.provider_component(step, str(job_path), str(previous), outs, str(log))
        previous = log
    answers = []
    for name in names:
        out = art / f"unmask-{name}"
        secagg_round.tenant_component("secagg-unmask", str(job_path), str(previous), name, "run", str(out))
        answers.append(str(out))
    secagg_round.aggregate_component(str(job_path), str(previous), answers, str(art / "state-1"))
    return marker(art / "state-1")


def test_a_secure_round_with_distributed_noise_through_the_component_bodies_is_accounted_alike(
    tmp_path: Path,
) -> None:
    settings = {
        "rounds": 1,
        "algorithm": {"name": "fedavg", "aggregation_weights": "uniform"},
        "secure_aggregation": SECURE,
        "differential_privacy": DISTRIBUTED,
    }
    local = parse_job(tiny_job_dict(tmp_path / "local", **settings))
    expected = run_job(local, NullTracker(), RunOptions(progress=False))
    job = parse_job(tiny_job_dict(tmp_path / "kfp", **settings))
    job_path = initialised(tmp_path, job, rounds_configured=1)
    got = _secure_round(tmp_path, job_path, ["tenant-a", "tenant-b", "tenant-c"])
    assert got["accepted"] == ["tenant-a", "tenant-b", "tenant-c"]
    record = ServerState.load(layout.JobStores(job).provider(), layout.state_key(1)).meta["privacy"]
    # Noise multiplier, clip norm, contributors and epsilon: the local engine's, exactly.
    assert record == {k: v for k, v in expected["privacy"]["rounds"][0].items() if k != "round"}
    assert got["metrics"]["server/dp/epsilon"] == record["epsilon"] > 0
    assert got["metrics"]["server/secagg/protocol_bytes"] > 0


def test_a_provider_step_refuses_markers_of_another_step(tmp_path: Path) -> None:
    job = parse_job(tiny_job_dict(tmp_path / "w", rounds=1, secure_aggregation=SECURE))
    initialised(tmp_path, job, rounds_configured=1)
    client_marker = {"round": 1, "tenant": "tenant-a", "kind": "client", "ok": True, "result": {}}
    with pytest.raises(FedtuneError, match="'client' marker of round 1 where the 'secagg-advertise'"):
        secagg_round.provider_run(job, "route-keys", marker(tmp_path / "artifacts" / "b1"), [client_marker])
