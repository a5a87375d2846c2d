"""Every registered algorithm runs one round on a tiny model and round-trips its state.

Adding an algorithm means adding a row here (house-style habit 5); the first test fails until
the row exists.
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
from tests.integration.conftest import DATA

TABLE: dict[str, dict[str, Any]] = {
    "fedavg": {"name": "fedavg"},
    "fedprox": {"name": "fedprox", "mu": 0.1},
    # The table tests machinery with the default AdamW clients, so it opts in explicitly.
    "scaffold": {"name": "scaffold", "allow_non_sgd_optimizer": True},
    "fedopt": {"name": "fedopt", "server_optimizer": "sgd", "eta": 1.0},
    "fedadagrad": {"name": "fedadagrad"},
    "fedadam": {"name": "fedadam"},
    "fedyogi": {"name": "fedyogi"},
    "fedbiot": {"name": "fedbiot", "adapter_size": 1, "dropout": 0.5, "pre_distill_steps": 1,
                "align_steps": 1, "eval_every": 100},
    "fedot": {"name": "fedot", "dropout": 0.5, "pre_distill_steps": 1, "eval_every": 100},
    "offsite-tuning": {"name": "offsite-tuning", "dropout": 0.5, "pre_distill_steps": 1,
                       "eval_every": 100},
    "fedpt": {"name": "fedpt", "large_model": {"source": "tiny", "hidden_size": 48,
              "num_layers": 3, "num_heads": 2, "intermediate_size": 96}, "kd_size": 8,
              "kd_batch_size": 4, "kd_steps": 2, "max_generation_examples": 2, "max_new_tokens": 4},
    "fedavg-pt": {"name": "fedavg-pt", "large_model": {"source": "tiny", "hidden_size": 48,
                  "num_layers": 3, "num_heads": 2, "intermediate_size": 96},
                  "max_generation_examples": 2, "max_new_tokens": 4},
    "fewfedpit": {"name": "fewfedpit", "candidates": 2, "keep": 1, "max_new_tokens": 4},
    "fedmkt": {"name": "fedmkt", "top_k": 4, "public_size": 4},
}

# Job fields a row needs beyond the default tiny job (2-layer model, 3 tenants, no public data).
_OFFSITE_JOB = {
    "model": {"source": "tiny", "arch": "llama", "hidden_size": 32, "num_layers": 6,
              "num_heads": 2, "intermediate_size": 64, "max_position_embeddings": 160},
    "public_data_uri": str(DATA / "public.jsonl"),
}
# FedMKT: every tenant brings its own small model (a GPT-2 shape beside the provider's Llama).
_FEDMKT_SMALL = {"source": "tiny", "arch": "gpt2", "hidden_size": 16, "num_layers": 1,
                 "num_heads": 2, "intermediate_size": 32, "max_position_embeddings": 256}
JOB_OVERRIDES: dict[str, dict[str, Any]] = {
    "fedmkt": {
        "public_data_uri": str(DATA / "public.jsonl"),
        "tenants": [
            {"name": f"tenant-{x}", "data_uri": str(DATA / f"tenant-{x}.jsonl"),
             "model": _FEDMKT_SMALL, "tokenizer": "builtin"}
            for x in "abc"
        ],
    },
    "fedpt": {"public_data_uri": str(DATA / "public.jsonl")},
    "fedavg-pt": {"public_data_uri": str(DATA / "public.jsonl")},
    "fedbiot": _OFFSITE_JOB,
    "fedot": _OFFSITE_JOB,
    "offsite-tuning": {
        **_OFFSITE_JOB,
        "tenants": [{"name": "all", "data_uri": str(DATA / "all.jsonl")}],
        "min_clients": 1,
    },
}


def test_every_registered_algorithm_is_in_the_table() -> None:
    missing = sorted(set(algorithm_names()) - set(TABLE))
    assert not missing, f"add a row to TABLE for: {missing}"


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
