"""Reference equivalences of the FedIT family, on whole runs of the in-process engine.

FedProx with mu=0, SCAFFOLD's first round with zero control variates and FedOPT with plain
server SGD (eta=1, beta1=0) must all reduce to FedAvg (house-style habit 10).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fedtune.config import JobConfig, parse_job
from fedtune.core.messages import ServerState
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.tracking.base import NullTracker
from tests.integration.conftest import tiny_job_dict

QUIET = RunOptions(progress=False)


def final_adapter(job: JobConfig, round_index: int | None = None) -> dict[str, torch.Tensor]:
    store = layout.JobStores(job).provider()
    state = ServerState.load(store, layout.state_key(round_index or job.rounds))
    return state.group("adapter")


def run(job: JobConfig) -> dict:
    return run_job(job, NullTracker(), QUIET)


def test_fedprox_with_mu_zero_equals_fedavg(make_job: Callable[..., JobConfig]) -> None:
    fedavg = make_job()
    fedprox = make_job(algorithm={"name": "fedprox", "mu": 0.0})
    run(fedavg)
    run(fedprox)
    a, b = final_adapter(fedavg), final_adapter(fedprox)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_fedprox_with_positive_mu_differs(make_job: Callable[..., JobConfig]) -> None:
    fedavg = make_job()
    fedprox = make_job(algorithm={"name": "fedprox", "mu": 10.0})
    run(fedavg)
    run(fedprox)
    a, b = final_adapter(fedavg), final_adapter(fedprox)
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_scaffold_first_round_equals_fedavg(tmp_path: Path, equal_size_data: Path) -> None:
    common = {"rounds": 1, "training": {"local_steps": 2, "batch_size": 4, "lr": 0.01,
                                         "optimizer": "sgd", "max_seq_len": 160}}
    fedavg = parse_job(tiny_job_dict(tmp_path / "avg", equal_size_data, **common))
    scaffold = parse_job(
        tiny_job_dict(tmp_path / "scaf", equal_size_data, algorithm={"name": "scaffold"}, **common)
    )
    run(fedavg)
    run(scaffold)
    a, b = final_adapter(fedavg), final_adapter(scaffold)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-7)


def test_scaffold_keeps_client_control_variate_in_tenant_store(
    make_job: Callable[..., JobConfig],
) -> None:
    job = make_job(algorithm={"name": "scaffold"}, training={"local_steps": 2, "batch_size": 4, "lr": 0.01, "optimizer": "sgd", "max_seq_len": 160})
    run(job)
    stores = layout.JobStores(job)
    exchange_keys = stores.exchange_root().list()
    assert not any(k.startswith("client-state/") for k in exchange_keys)
    for tenant in job.tenants:
        own = stores.tenant(tenant).list("client-state/")
        assert own, f"{tenant.name} kept no control variate"
    # The control variate itself never travels: updates carry only its delta.
    update = stores.exchange("tenant-a").get_tensors(f"{layout.update_key(1)}.safetensors")
    assert any(k.startswith("control_delta/") for k in update)
    assert not any(k.startswith("control/") for k in update)


@pytest.mark.parametrize("weights", ["samples", "uniform"])
def test_fedopt_server_sgd_equals_fedavg(make_job: Callable[..., JobConfig], weights: str) -> None:
    """With the same client weights (FedOPT's default is uniform, FedAvg's samples)."""
    fedavg = make_job(algorithm={"name": "fedavg", "aggregation_weights": weights})
    fedopt = make_job(
        algorithm={
            "name": "fedopt",
            "server_optimizer": "sgd",
            "eta": 1.0,
            "beta1": 0.0,
            "aggregation_weights": weights,
        }
    )
    run(fedavg)
    run(fedopt)
    a, b = final_adapter(fedavg), final_adapter(fedopt)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-7)


def test_adaptive_fedopt_moves_away_from_fedavg(make_job: Callable[..., JobConfig]) -> None:
    fedavg = make_job(rounds=1)
    fedadam = make_job(rounds=1, algorithm={"name": "fedadam", "eta": 0.01})
    run(fedavg)
    run(fedadam)
    a, b = final_adapter(fedavg), final_adapter(fedadam)
    assert any(not torch.allclose(a[k], b[k]) for k in a)


def test_tenant_store_keeps_only_the_states_a_rerun_needs(
    make_job: Callable[..., JobConfig],
) -> None:
    job = make_job(rounds=3, algorithm={"name": "scaffold"}, training={"local_steps": 2, "batch_size": 4, "lr": 0.01, "optimizer": "sgd", "max_seq_len": 160})
    run(job)
    own = layout.JobStores(job).tenant(job.tenants[0])
    kept = sorted({k.rsplit(".", 1)[0] for k in own.list("client-state/")})
    assert kept == [layout.client_state_key(2), layout.client_state_key(3)]
