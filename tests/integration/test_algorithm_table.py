"""Every registered algorithm runs one round on a tiny model and round-trips its state.

The rows are the smoke settings each algorithm package declares (``ALGORITHM.smoke`` in its
``config.py``): adding a package adds its rows, deleting it removes them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from fedtune.algorithms.registry import algorithm_names
from fedtune.config import JobConfig
from fedtune.core.messages import ServerState
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.tracking.base import NullTracker
from tests.helpers.algorithms import SMOKE, job_overrides

#: Every registered algorithm's quickest settings, declared in its package (``Smoke``).
TABLE: dict[str, dict[str, Any]] = SMOKE
JOB_OVERRIDES: dict[str, dict[str, Any]] = {name: job_overrides(name) for name in TABLE}


def test_every_registered_algorithm_has_a_row_that_validates(
    make_job: Callable[..., JobConfig],
) -> None:
    assert sorted(TABLE) == algorithm_names() and TABLE
    for name, row in TABLE.items():
        assert make_job(algorithm=row, **JOB_OVERRIDES[name]).algorithm.name == name


@pytest.mark.parametrize("name", sorted(TABLE))
def test_algorithm_runs_and_state_round_trips(
    name: str, make_job: Callable[..., JobConfig], tmp_path: Any
) -> None:
    job = make_job(rounds=1, algorithm=TABLE[name], **JOB_OVERRIDES.get(name, {}))
    summary = run_job(job, NullTracker(), RunOptions(progress=False))
    assert summary["completed"] and summary["rounds"][0]["accepted"]
    store = layout.JobStores(job).provider()
    state = ServerState.load(store, layout.state_key(1))
    assert state.tensors and all(torch.isfinite(t).all() for t in state.tensors.values())
    # Explicit, serializable state: saving and loading again changes nothing.
    state.save(store, "roundtrip")
    again = ServerState.load(store, "roundtrip")
    assert again.meta == state.meta
    assert all(torch.equal(again.tensors[k], v) for k, v in state.tensors.items())


@pytest.mark.parametrize("name", sorted(TABLE))
def test_algorithm_runs_in_bf16_and_stores_fp32_adapters(
    name: str, make_job: Callable[..., JobConfig], caplog: pytest.LogCaptureFixture
) -> None:
    training = {"local_steps": 2, "batch_size": 4, "lr": 0.01, "max_seq_len": 160,
                "precision": "bf16", "device": "cpu"}
    job = make_job(rounds=1, algorithm=TABLE[name], training=training, **JOB_OVERRIDES.get(name, {}))
    with caplog.at_level("INFO", logger="fedtune.training.context"):
        summary = run_job(job, NullTracker(), RunOptions(progress=False))
    assert summary["completed"] and summary["rounds"][0]["accepted"]
    # The models really ran in bf16: every base model was loaded (not cast) in it.
    ready = [r.getMessage() for r in caplog.records if " ready: " in r.getMessage()]
    assert ready and all(m.split(" ready: ")[1].startswith("bfloat16 on cpu") for m in ready)
    state = ServerState.load(layout.JobStores(job).provider(), layout.state_key(1))
    adapter = state.group("adapter")
    assert adapter and {t.dtype for t in adapter.values()} == {torch.float32}
    assert all(torch.isfinite(t).all() for t in adapter.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", algorithm_names())
def test_the_audit_runs_end_to_end_or_is_refused_at_validation(
    name: str, make_job: Callable[..., JobConfig]
) -> None:
    """With ``audit.enabled`` a job either audits every audited tenant after training (its
    scores reach the provider's record) or is refused before it trains, saying why: never
    trained, then failed in the tenants' audit steps (FedMKT did, issue 29)."""
    audit = {"enabled": True, "records": 2, "max_new_tokens": 2}
    try:
        job = make_job(rounds=1, algorithm=TABLE[name], audit=audit, **JOB_OVERRIDES.get(name, {}))
    except ValueError as exc:  # pydantic's ValidationError
        assert f"algorithm {name!r} cannot be audited" in str(exc) and "audit.enabled: false" in str(exc)
        return
    summary = run_job(job, NullTracker(), RunOptions(progress=False))
    assert summary["completed"]
    record = summary["audit"]
    assert sorted(record["tenants"]) == job.audited_tenants
    assert record["pooled"]["n"] >= len(job.audited_tenants) and 0.0 <= record["pooled"]["mean"] <= 1.0
