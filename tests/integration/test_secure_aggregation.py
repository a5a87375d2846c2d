"""Secure aggregation in the in-process engine: same model, no individual update exposed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from fedtune.algorithms.fedavg import FedAvg
from fedtune.config import JobConfig
from fedtune.core.errors import SecureAggregationError
from fedtune.core.messages import Update
from fedtune.engines import layout, steps
from fedtune.engines.local import RunOptions, run_job
from fedtune.engines.tenant import secagg as secagg_steps
from fedtune.tracking.base import NullTracker
from tests.integration.test_fedit_reference import final_adapter

QUIET = RunOptions(progress=False)
SECURE = {"enabled": True, "threshold": 2}


def _plain_updates(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, torch.Tensor]]:
    """Record every update FedAvg's client step produces (before masking)."""
    seen: list[dict[str, torch.Tensor]] = []
    original = FedAvg.client_step

    def step(self, ctx, broadcast, data, client_state):  # type: ignore[no-untyped-def]
        update, state = original(self, ctx, broadcast, data, client_state)
        seen.append({k: v.clone() for k, v in update.tensors.items()})
        return update, state

    monkeypatch.setattr(FedAvg, "client_step", step)
    return seen


def _stored_arrays(root: Path) -> list[np.ndarray]:
    """Every tensor of every message the provider can read (its store and the exchange)."""
    from safetensors.numpy import load_file

    out = []
    for path in root.rglob("*.safetensors"):
        if "tenants" in path.relative_to(root).parts[:1]:
            continue  # tenant-private stores
        out.extend(load_file(str(path)).values())
    return out


def test_secure_fedavg_gives_the_plain_model_and_hides_every_update(
    make_job: Callable[..., JobConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = make_job()
    run_job(plain, NullTracker(), QUIET)
    seen = _plain_updates(monkeypatch)
    secure = make_job(secure_aggregation=SECURE)
    summary = run_job(secure, NullTracker(), QUIET)
    assert summary["completed"]
    a, b = final_adapter(plain), final_adapter(secure)
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-6, rtol=0), key
    # No stored object the provider reads equals (or contains) an individual update.
    stored = _stored_arrays(Path(secure.workdir))
    assert seen and stored
    for update in seen:
        for name, tensor in update.items():
            flat = tensor.reshape(-1).numpy()
            for array in stored:
                if array.size == flat.size:
                    assert not np.allclose(array.reshape(-1).astype(np.float64), flat, atol=1e-6), name
    exchange = layout.JobStores(secure).exchange("tenant-a")
    upload = Update.load(exchange, layout.update_key(1))
    assert list(upload.tensors) == ["secagg/masked"] and upload.tensors["secagg/masked"].dtype == torch.int64
    metrics = summary["rounds"][0]["server_metrics"]
    assert metrics["secagg/protocol_bytes"] > 0 and metrics["secagg/masked_update_bytes"] > 0


def test_a_tenant_dropping_after_key_sharing_leaves_the_survivors_mean(
    make_job: Callable[..., JobConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    original = FedAvg.client_step

    def b_dies(self, ctx, broadcast, data, client_state):  # type: ignore[no-untyped-def]
        if data.tenant == "tenant-b":
            raise SecureAggregationError("tenant-b lost its connection", fix="none")
        return original(self, ctx, broadcast, data, client_state)

    monkeypatch.setattr(FedAvg, "client_step", b_dies)
    job = make_job(rounds=1, secure_aggregation=SECURE)
    summary = run_job(job, NullTracker(), QUIET)
    record = summary["rounds"][0]
    assert record["accepted"] == ["tenant-a", "tenant-c"]
    assert "tenant-b" in record["rejected"]
    # Same as a plain round whose tenant-b update was rejected.
    monkeypatch.setattr(FedAvg, "client_step", b_dies)
    plain = make_job(rounds=1)

    def b_rejected(self, ctx, broadcast, data, client_state):  # type: ignore[no-untyped-def]
        update, state = original(self, ctx, broadcast, data, client_state)
        if data.tenant == "tenant-b":
            update.tensors = {k: v * float("nan") for k, v in update.tensors.items()}
        return update, state

    monkeypatch.setattr(FedAvg, "client_step", b_rejected)
    run_job(plain, NullTracker(), QUIET)
    a, b = final_adapter(plain), final_adapter(job)
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-6, rtol=0), key


def test_a_nan_update_is_refused_by_its_own_tenant(
    make_job: Callable[..., JobConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    original = FedAvg.client_step

    def b_diverges(self, ctx, broadcast, data, client_state):  # type: ignore[no-untyped-def]
        update, state = original(self, ctx, broadcast, data, client_state)
        if data.tenant == "tenant-b":
            next(iter(update.tensors.values()))[0] = float("nan")
        return update, state

    monkeypatch.setattr(FedAvg, "client_step", b_diverges)
    job = make_job(rounds=1, secure_aggregation=SECURE)
    record = run_job(job, NullTracker(), QUIET)["rounds"][0]
    assert record["accepted"] == ["tenant-a", "tenant-c"]
    assert "tenant-b" in record["rejected"]
    assert not layout.JobStores(job).exchange("tenant-b").exists(f"{layout.update_key(1)}.json")


def test_below_threshold_the_round_fails_listing_every_tenant(
    make_job: Callable[..., JobConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    original = FedAvg.client_step

    def only_a(self, ctx, broadcast, data, client_state):  # type: ignore[no-untyped-def]
        if data.tenant != "tenant-a":
            raise SecureAggregationError(f"{data.tenant} is offline", fix="none")
        return original(self, ctx, broadcast, data, client_state)

    monkeypatch.setattr(FedAvg, "client_step", only_a)
    job = make_job(rounds=1, min_clients=1, secure_aggregation={"enabled": True, "threshold": 3})
    with pytest.raises(SecureAggregationError) as info:
        run_job(job, NullTracker(), QUIET)
    text = str(info.value)
    assert "1 masked upload(s) ['tenant-a'], threshold is 3" in text
    assert "secure_aggregation.threshold" in info.value.fix


@pytest.mark.parametrize("algorithm", [{"name": "fedprox", "mu": 0.01}, {"name": "fedadam"}])
def test_other_weighted_mean_algorithms_match_too(
    make_job: Callable[..., JobConfig], algorithm: dict
) -> None:
    plain = make_job(algorithm=algorithm)
    secure = make_job(algorithm=algorithm, secure_aggregation=SECURE)
    run_job(plain, NullTracker(), QUIET)
    run_job(secure, NullTracker(), QUIET)
    a, b = final_adapter(plain), final_adapter(secure)
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-5, rtol=0), key


def test_an_update_over_the_norm_bound_is_refused_by_its_tenant_as_the_provider_would(
    make_job: Callable[..., JobConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """limits.max_update_norm: the provider's check in a plain round, the tenant's own under
    secure aggregation; the two rounds leave the same model."""
    original = FedAvg.client_step

    def b_explodes(self, ctx, broadcast, data, client_state):  # type: ignore[no-untyped-def]
        update, state = original(self, ctx, broadcast, data, client_state)
        if data.tenant == "tenant-b":
            start = broadcast.tensors
            update.tensors = {k: start[k] + (v - start[k]) * 1e4 for k, v in update.tensors.items()}
        return update, state

    monkeypatch.setattr(FedAvg, "client_step", b_explodes)
    limits = {"max_update_norm": 5.0}
    plain = make_job(rounds=1, limits=limits)
    secure = make_job(rounds=1, limits=limits, secure_aggregation=SECURE)
    plain_record = run_job(plain, NullTracker(), QUIET)["rounds"][0]
    secure_record = run_job(secure, NullTracker(), QUIET)["rounds"][0]
    assert "exceeds limits.max_update_norm=5" in plain_record["rejected"]["tenant-b"]
    assert secure_record["accepted"] == ["tenant-a", "tenant-c"] and "tenant-b" in secure_record["rejected"]
    assert not layout.JobStores(secure).exchange("tenant-b").exists(f"{layout.update_key(1)}.json")
    a, b = final_adapter(plain), final_adapter(secure)
    assert all(torch.allclose(a[k], b[k], atol=1e-6, rtol=0) for k in a)


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "secure"])
def test_a_retried_client_step_reports_the_sizes_of_the_upload_it_finds(
    make_job: Callable[..., JobConfig], secure: bool
) -> None:
    """A pod retried after its upload (kfp's retry of a task whose process died at exit) skips
    the work and reports what the first attempt did, so the round's byte metrics do not depend
    on retries (they once halved ``secagg/plain_update_bytes`` on kfp-local)."""
    job = make_job(rounds=1, **({"secure_aggregation": SECURE} if secure else {}))
    first = run_job(job, NullTracker(), QUIET)["rounds"][0]["tenants"]["tenant-a"]
    step = secagg_steps.client_step if secure else steps.client_step
    again = step(steps.TenantEnv.create(job, "tenant-a"), 1)
    assert again["skipped"]
    assert again["raw_bytes"] > 0
    assert (again["bytes"], again["raw_bytes"]) == (first["bytes_received"], first["raw_update_bytes"])
