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
from fedtune.engines.workers import (
    FAULT_ENV,
    device_plan,
    resolve_workers,
    visible_devices,
)
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
    # Each worker reports the device it was given (CPU here) and its peak resident memory.
    assert [w["worker"] for w in summary["workers"]] == list(range(workers))
    devices = "cuda" if torch.cuda.is_available() else "cpu"
    assert all(w["device"].startswith(devices) for w in summary["workers"])
    assert all(w["peak_rss_mib"] > 100 for w in summary["workers"])  # torch alone is more
    assert "workers" not in expected  # one worker runs in this process


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
    from fedtune.core.cpu import usable_cpus

    assert 1 <= resolve_workers("auto") <= usable_cpus()


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


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({}, id="fedavg-adamw"),
        pytest.param({"algorithm": {"name": "scaffold"}, "training": {**SGD, "local_steps": 3}}, id="scaffold"),
        pytest.param({"algorithm": {"name": "fedprox", "mu": 0.1}}, id="fedprox"),
    ],
)
def test_a_client_step_cut_in_parts_equals_the_whole_step_bitwise(
    make_job: Callable[..., JobConfig], fields: dict[str, Any]
) -> None:
    # What the pool does to share 3 tenants over 2 workers: one tenant's steps run in two
    # processes one after the other, through a checkpoint in the tenant's own store.
    from fedtune.core.messages import Update
    from fedtune.engines import steps

    # LoRA dropout draws from torch's RNG: the checkpoint must carry it too.
    fields = {
        "training": {**SGD, "optimizer": "adamw", "local_steps": 3},
        "lora": {"r": 4, "alpha": 8, "dropout": 0.1},
    } | fields
    updates = []
    for cuts in [(), (1,), (1, 2)]:
        job = make_job(**fields)
        provider = steps.ProviderEnv.create(job)
        steps.init_step(provider)
        steps.configure_step(provider, 1)
        env = steps.TenantEnvs(job)["tenant-b"]  # a fresh env: a worker has only the store
        bounds = [0, *cuts, None]
        for start, stop in zip(bounds, bounds[1:], strict=False):
            out = steps.client_step_part(steps.TenantEnvs(job)["tenant-b"], 1, start, stop)
            assert ("suspended" in out) == (stop is not None)
        assert not env.own.list("partial-step/")  # the checkpoint is gone once continued
        updates.append(Update.load(env.exchange, layout.update_key(1)))
    whole, *parts = updates
    for part in parts:
        _assert_bitwise(whole.tensors, part.tensors)
        for key in ("train_loss", "eval_loss", "steps", "tokens", "num_samples"):
            assert part.meta[key] == whole.meta[key], key
    assert whole.meta["eval_loss"] is not None and whole.meta["steps"] == 3


def test_three_tenants_on_two_workers_share_the_steps_evenly() -> None:
    from fedtune.engines.workers import Task, share_steps

    tasks = [Task("client", 1, name) for name in "abc"]
    first, second = share_steps(tasks, 2, 30)
    # 45 steps each: tenant b's first 15 steps open the second queue, its last 15 close the first.
    assert first == [tasks[0], Task("client", 1, "b", start=15)]
    assert second == [Task("client", 1, "b", stop=15), tasks[2]]
    assert share_steps(tasks, 3, 30) == [[t] for t in tasks]  # nothing to cut
    assert share_steps(tasks, 2, None) == [tasks, []]  # not splittable: one shared queue


@pytest.mark.slow
def test_the_cli_starts_its_workers_before_the_engine_and_stays_bitwise_equal(
    make_job: Callable[..., JobConfig], tmp_path: Path
) -> None:
    import yaml

    from fedtune.cli.main import main
    from fedtune.engines import workers

    finals = []
    for count in ("1", "2"):
        job = make_job(rounds=1, **PINNED)
        path = tmp_path / f"job-{count}.yaml"
        path.write_text(yaml.safe_dump(job.model_dump(mode="json")), encoding="utf-8")
        assert main(["run", str(path), "--no-progress", "--workers", count]) == 0
        finals.append(ServerState.load(layout.JobStores(job).provider(), layout.state_key(1)).tensors)
    _assert_bitwise(*finals)
    assert not workers._prestarted  # the pool started early was the one the run used


def test_workers_are_pinned_one_per_device_or_several_sharing_one() -> None:
    assert device_plan("auto", 3, 1, 0) == ["cpu"] * 3  # no GPU: nothing changes
    assert device_plan("cpu", 2, 1, 4) == ["cpu", "cpu"]
    assert device_plan("auto", 2, 1, 2) == ["cuda:0", "cuda:1"]
    assert device_plan([1, 3], 4, 2, 4) == ["cuda:1", "cuda:1", "cuda:3", "cuda:3"]
    assert device_plan([2], 1, 3, 4) == ["cuda:2"]


def test_a_worker_sees_only_its_device_counted_as_the_engine_counted_it() -> None:
    assert visible_devices("cuda:1", None) == "1"
    assert visible_devices("cuda:1", "4,6") == "6"  # the engine saw physical 4 and 6 as 0 and 1


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="a process that already initialised CUDA cannot hide it; workers pin before any CUDA work",
)
def test_a_cpu_worker_hides_the_gpus_so_it_trains_on_its_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from fedtune.config.job import TrainingConfig
    from fedtune.engines.workers import _pin_device
    from fedtune.training.precision import Runtime

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # restored afterwards
    _pin_device("cpu", 1)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert Runtime.of(TrainingConfig()).device == torch.device("cpu")


@pytest.mark.parametrize(
    ("setting", "workers", "per_device", "count", "message"),
    [
        ([0, 2], 2, 1, 2, r"names CUDA device\(s\) \[2\], but CUDA reports 2 device"),
        ([0], 1, 1, 0, r"but CUDA reports 0 device"),
        ("auto", 3, 1, 2, r"3 workers do not fit on CUDA device\(s\) \[0, 1\]"),
        ([0], 3, 2, 1, r"workers_per_device=2 \(2 slot"),
    ],
)
def test_devices_that_do_not_exist_or_do_not_fit_are_config_errors(
    setting: Any, workers: int, per_device: int, count: int, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        device_plan(setting, workers, per_device, count)


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"worker_devices": []}, "non-empty list"),
        ({"worker_devices": [0, 0]}, "distinct"),
        ({"worker_devices": [-1]}, "CUDA device indices"),
        ({"worker_devices": "gpu"}, "worker_devices"),
        ({"workers_per_device": 0}, "workers_per_device"),
    ],
)
def test_bad_worker_devices_in_the_job_file_are_config_errors(
    engine: dict[str, Any], message: str
) -> None:
    base = {
        "name": "w",
        "model": {"source": "tiny"},
        "algorithm": {"name": "fedavg"},
        "tenants": [{"name": "a", "data_uri": "a.jsonl"}],
    }
    with pytest.raises(ConfigError, match=message):
        parse_job({**base, "engine": engine})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_a_run_on_devices_cuda_does_not_see_fails_before_storing_anything(
    make_job: Callable[..., JobConfig]
) -> None:
    job = make_job(engine={"name": "local", "worker_devices": [0]})
    with pytest.raises(ConfigError, match="CUDA reports 0 device"):
        run_job(job, NullTracker(), RunOptions(progress=False, workers=2))
    assert not layout.JobStores(job).provider().exists(layout.RUN_KEY)


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_workers_sharing_a_gpu_report_it_and_stay_bitwise_equal(
    make_job: Callable[..., JobConfig]
) -> None:
    engine = {"name": "local", "step_threads": 1, "worker_devices": [0], "workers_per_device": 2}
    sequential, _ = _final(make_job(rounds=1, engine=engine), 1)
    parallel, summary = _final(make_job(rounds=1, engine=engine), 2)
    _assert_bitwise(sequential, parallel)
    assert [w["device"] for w in summary["workers"]] == ["cuda:0", "cuda:0"]
    assert all("peak_cuda_mib" in w for w in summary["workers"])
