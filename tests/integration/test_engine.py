"""The in-process engine: resume, quorum, rejected updates, summary, stored layout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fedtune.algorithms.fedavg import FedAvg
from fedtune.config import JobConfig, parse_job
from fedtune.core.errors import ConfigError, FedtuneError, QuorumError
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.tracking.base import NullTracker
from tests.integration.conftest import copy_data, tiny_job_dict
from tests.integration.test_fedit_reference import final_adapter

QUIET = RunOptions(progress=False)


def test_resume_after_stop_is_bitwise_equal(make_job: Callable[..., JobConfig]) -> None:
    straight = make_job(rounds=4)
    run_job(straight, NullTracker(), QUIET)

    chained = make_job(rounds=4)
    first = run_job(chained, NullTracker(), RunOptions(progress=False, until_round=2))
    assert not first["completed"] and len(first["rounds"]) == 2
    second = run_job(chained, NullTracker(), RunOptions(progress=False, resume=True))
    assert second["completed"] and [r["round"] for r in second["rounds"]] == [1, 2, 3, 4]
    a, b = final_adapter(straight), final_adapter(chained)
    for key in a:
        assert torch.equal(a[key], b[key]), key


class Crash(BaseException):
    """Stands for the process being killed: not an error the engine may handle."""


def test_resume_after_crash_mid_round_is_bitwise_equal(
    make_job: Callable[..., JobConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    straight = make_job(rounds=4)
    run_job(straight, NullTracker(), QUIET)

    crashed = make_job(rounds=4)
    original = FedAvg.client_step

    def dies_in_round_3(self, ctx, broadcast, data, client_state):  # type: ignore[no-untyped-def]
        if broadcast.meta["round"] == 3 and data.tenant == "tenant-b":
            raise Crash()
        return original(self, ctx, broadcast, data, client_state)

    monkeypatch.setattr(FedAvg, "client_step", dies_in_round_3)
    with pytest.raises(Crash):
        run_job(crashed, NullTracker(), QUIET)
    store = layout.JobStores(crashed).provider()
    exchange = layout.JobStores(crashed).exchange("tenant-a")
    assert exchange.exists(f"{layout.update_key(3)}.json")  # finished step kept
    assert not store.exists(f"{layout.state_key(3)}.json")
    monkeypatch.setattr(FedAvg, "client_step", original)
    run_job(crashed, NullTracker(), RunOptions(progress=False, resume=True))
    a, b = final_adapter(straight), final_adapter(crashed)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_rerun_without_resume_or_fresh_is_refused(make_job: Callable[..., JobConfig]) -> None:
    job = make_job(rounds=1)
    run_job(job, NullTracker(), QUIET)
    with pytest.raises(ConfigError, match="already has stored state"):
        run_job(job, NullTracker(), QUIET)
    summary = run_job(job, NullTracker(), RunOptions(progress=False, fresh=True))
    assert summary["completed"]


def test_resume_with_changed_config_is_refused(tmp_path: Path) -> None:
    job = parse_job(tiny_job_dict(tmp_path / "w", rounds=1))
    run_job(job, NullTracker(), QUIET)
    changed = parse_job(tiny_job_dict(tmp_path / "w", rounds=1, seed=99))
    with pytest.raises(ConfigError, match=r"changed since its stored run .*changed:\n  seed: 7 -> 99"):
        run_job(changed, NullTracker(), RunOptions(progress=False, resume=True))


def _tamper(tenant: str, change):  # type: ignore[no-untyped-def]
    """FedAvg's client step, with ``change(update)`` applied to ``tenant``'s update."""
    original = FedAvg.client_step

    def step(self, ctx, broadcast, data, client_state):  # type: ignore[no-untyped-def]
        update, state = original(self, ctx, broadcast, data, client_state)
        if data.tenant == tenant:
            change(update)
        return update, state

    return step


def _meta(**fields):  # type: ignore[no-untyped-def]
    return lambda update: update.meta.update(fields)


def _poison(tenant: str):  # type: ignore[no-untyped-def]
    """NaN in ``tenant``'s first tensor (the table of rejected updates is
    tests/integration/test_planted_updates.py)."""

    def apply(update):  # type: ignore[no-untyped-def]
        name = sorted(update.tensors)[0]
        update.tensors[name] = update.tensors[name].clone().fill_(float("nan"))

    return _tamper(tenant, apply)


def test_an_update_over_the_byte_bound_is_rejected(
    make_job: Callable[..., JobConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    def bloat(update):  # type: ignore[no-untyped-def]
        update.tensors["adapter/ballast"] = torch.zeros(64 * 1024)  # 256 KiB

    monkeypatch.setattr(FedAvg, "client_step", _tamper("tenant-b", bloat))
    job = make_job(rounds=1, min_clients=2, limits={"max_update_bytes": 64 * 1024})
    record = run_job(job, NullTracker(), QUIET)["rounds"][0]
    assert record["accepted"] == ["tenant-a", "tenant-c"]
    assert "exceeds the bound of 65536 bytes" in record["rejected"]["tenant-b"]


def test_a_tenants_declared_bound_caps_its_sample_claim(
    make_job: Callable[..., JobConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    job_dict = make_job().model_dump(mode="json")
    job_dict["tenants"][1]["max_samples"] = 5  # tenant-b declares at most 5 records
    monkeypatch.setattr(FedAvg, "client_step", _tamper("tenant-b", _meta(num_samples=6)))
    job = parse_job({**job_dict, "rounds": 1, "min_clients": 2})
    record = run_job(job, NullTracker(), QUIET)["rounds"][0]
    assert "num_samples=6 exceeds its cap of 5" in record["rejected"]["tenant-b"]


def test_quorum_failure_leaves_stored_state_untouched(
    make_job: Callable[..., JobConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = make_job(rounds=2, min_clients=3)
    run_job(job, NullTracker(), RunOptions(progress=False, until_round=1))
    store = layout.JobStores(job).provider()
    before = store.get_bytes(f"{layout.state_key(1)}.safetensors")
    monkeypatch.setattr(FedAvg, "client_step", _poison("tenant-c"))
    with pytest.raises(QuorumError) as info:
        run_job(job, NullTracker(), RunOptions(progress=False, resume=True))
    assert "tenant-c" in str(info.value) and "min_clients=3" in str(info.value)
    assert not store.exists(f"{layout.state_key(2)}.json")
    assert store.get_bytes(f"{layout.state_key(1)}.safetensors") == before


def test_bad_tenant_data_fails_before_training(tmp_path: Path) -> None:
    data = copy_data(tmp_path / "data")
    lines = (data / "tenant-b.jsonl").read_text().splitlines()
    lines[4] = '{"instruction": "no response here"}'
    (data / "tenant-b.jsonl").write_text("\n".join(lines) + "\n")
    job = parse_job(tiny_job_dict(tmp_path / "w", data))
    with pytest.raises(FedtuneError) as info:
        run_job(job, NullTracker(), QUIET)
    message = str(info.value)
    assert "tenant-b" in message and "line 5" in message
    assert not layout.JobStores(job).provider().exists(f"{layout.state_key(0)}.json")


def test_missing_data_uri_is_named(tmp_path: Path) -> None:
    job = parse_job(tiny_job_dict(tmp_path / "w"))
    missing = tmp_path / "nope.jsonl"
    job = job.model_copy(
        update={"tenants": [job.tenants[0].model_copy(update={"data_uri": str(missing)}), *job.tenants[1:]]}
    )
    with pytest.raises(FedtuneError, match="tenant tenant-a: StoreError") as info:
        run_job(job, NullTracker(), QUIET)
    details = str(info.value).split("details: file://")[1].strip()
    assert "nope.jsonl" in Path(details).read_text()  # named where the tenant reads it


def test_summary_has_rounds_tenants_bytes_and_timings(make_job: Callable[..., JobConfig]) -> None:
    summary = run_job(make_job(rounds=2), NullTracker(), QUIET)
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    for record in summary["rounds"]:
        assert set(record["tenants"]) == {"tenant-a", "tenant-b", "tenant-c"}
        for values in record["tenants"].values():
            assert values["train_loss"] > 0 and values["eval_loss"] > 0
            assert values["bytes_sent"] > 0 and values["bytes_received"] > 0
        assert set(record["wall_time"]) >= {"configure", "clients", "aggregate", "total"}
    assert summary["artifacts"]["model"]["uri"].endswith("artifacts/model")
    assert set(summary["final_eval"]) == {"tenant-a", "tenant-b", "tenant-c"}
    assert summary["mlflow_run_id"] == "null"


def test_clients_per_round_sampling_is_seeded(make_job: Callable[..., JobConfig]) -> None:
    a = run_job(make_job(rounds=3, clients_per_round=2, min_clients=1), NullTracker(), QUIET)
    b = run_job(make_job(rounds=3, clients_per_round=2, min_clients=1), NullTracker(), QUIET)
    assert [r["sampled"] for r in a["rounds"]] == [r["sampled"] for r in b["rounds"]]
    assert all(len(r["sampled"]) == 2 for r in a["rounds"])


def test_no_held_out_data_gives_null_eval_not_a_crash(make_job: Callable[..., JobConfig]) -> None:
    job = make_job(
        rounds=1,
        training={"local_steps": 1, "batch_size": 4, "lr": 0.01, "max_seq_len": 160, "eval_fraction": 0.0},
    )
    summary = run_job(job, NullTracker(), QUIET)
    assert summary["rounds"][0]["eval_loss"] is None
    assert summary["final_eval"] == {"tenant-a": {}, "tenant-b": {}, "tenant-c": {}}
