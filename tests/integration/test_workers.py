"""Parallel tenants: spawned worker processes, bitwise equal to the sequential engine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fedtune.config import JobConfig, parse_job
from fedtune.core.errors import ConfigError
from fedtune.core.messages import ServerState
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.engines.workers import FAULT_ENV, resolve_workers, threads_per_worker
from fedtune.tracking.base import NullTracker
from tests.integration.conftest import DATA
from tests.integration.test_boundary import CLIENT_CASES
from tests.integration.test_fedbiot import provider_model_dir

# Every tenant step with one torch thread, in this process or a worker: float reductions split
# over a different number of threads round differently (measured: 3e-7 after 2 rounds).
PINNED = {"engine": {"name": "local", "step_threads": 1}}
SGD = {"local_steps": 2, "batch_size": 4, "lr": 0.01, "optimizer": "sgd", "max_seq_len": 160}


def _final(job: JobConfig, workers: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    summary = run_job(job, NullTracker(), RunOptions(progress=False, workers=workers))
    state = ServerState.load(layout.JobStores(job).provider(), layout.state_key(job.rounds))
    return state.tensors, summary


def _assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 3])
def test_fedavg_with_workers_equals_the_sequential_run_bitwise(
    make_job: Callable[..., JobConfig], workers: int
) -> None:
    sequential, expected = _final(make_job(rounds=2, **PINNED), 1)
    parallel, summary = _final(make_job(rounds=2, **PINNED), workers)
    _assert_bitwise(sequential, parallel)
    assert summary["final_eval"] == expected["final_eval"]
    assert [r["accepted"] for r in summary["rounds"]] == [r["accepted"] for r in expected["rounds"]]


@pytest.mark.slow
@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"algorithm": {"name": "scaffold"}, "training": SGD}, id="scaffold"),
        pytest.param({"clients_per_round": 2, "min_clients": 1}, id="fedavg-sampled"),
    ],
)
def test_other_algorithms_with_workers_stay_bitwise_equal(
    make_job: Callable[..., JobConfig], fields: dict[str, Any]
) -> None:
    sequential, _ = _final(make_job(rounds=2, **fields, **PINNED), 1)
    parallel, _ = _final(make_job(rounds=2, **fields, **PINNED), 2)
    _assert_bitwise(sequential, parallel)


@pytest.mark.slow
def test_fedbiot_with_workers_stays_bitwise_equal(
    make_job: Callable[..., JobConfig], tmp_path: Path
) -> None:
    model_dir = provider_model_dir(tmp_path / "model")
    fields = {
        "model": {"source": "pretrained", "uri": str(model_dir)},
        "algorithm": CLIENT_CASES["fedbiot"],
        "public_data_uri": str(DATA / "public.jsonl"),
        "rounds": 2,
    }
    sequential, _ = _final(make_job(**fields, **PINNED), 1)
    parallel, _ = _final(make_job(**fields, **PINNED), 2)
    _assert_bitwise(sequential, parallel)


@pytest.mark.slow
def test_a_worker_that_dies_costs_only_its_tenants_update(
    make_job: Callable[..., JobConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "client:1:tenant-b")  # SIGKILL while running tenant-b, round 1
    summary = run_job(make_job(rounds=2), NullTracker(), RunOptions(progress=False, workers=2))
    first, second = summary["rounds"]
    assert first["accepted"] == ["tenant-a", "tenant-c"]
    assert "worker process died" in first["rejected"]["tenant-b"]
    assert second["accepted"] == ["tenant-a", "tenant-b", "tenant-c"]  # a new worker took over
    assert summary["completed"]


def test_workers_auto_is_one_per_core_at_most() -> None:
    import os

    cores = len(os.sched_getaffinity(0))
    assert 1 <= resolve_workers("auto") <= cores
    assert threads_per_worker(1) == cores and threads_per_worker(cores * 4) == 1


@pytest.mark.parametrize("bad", [0, -1, "many"])
def test_a_bad_worker_count_is_a_config_error(bad: Any) -> None:
    with pytest.raises(ConfigError, match="workers"):
        resolve_workers(bad)


def test_the_job_file_takes_an_engine_name_or_an_object(tmp_path: Path) -> None:
    base = {
        "name": "w",
        "model": {"source": "tiny"},
        "algorithm": {"name": "fedavg"},
        "tenants": [{"name": "a", "data_uri": "a.jsonl"}],
    }
    assert parse_job({**base, "engine": "kfp-local"}).engine.name == "kfp-local"
    job = parse_job({**base, "engine": {"name": "local", "workers": "auto"}})
    assert (job.engine.name, job.engine.workers) == ("local", "auto")
    with pytest.raises(ConfigError, match="workers=0"):
        parse_job({**base, "engine": {"workers": 0}})
