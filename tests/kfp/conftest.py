"""Tiny jobs for the KFP tests: two tenants of the shipped quickstart data, one or two rounds."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from fedtune.config import JobConfig, parse_job
from tests.integration.conftest import DATA, tiny_job_dict


def two_tenant_dict(workdir: Path, **overrides: Any) -> dict[str, Any]:
    """A 2-layer Llama, tenants a and b, 1 round, no tracking: each step takes about a second."""
    job = tiny_job_dict(
        workdir,
        name="kfp",
        rounds=1,
        min_clients=1,
        tenants=[
            {"name": f"tenant-{x}", "data_uri": str(DATA / f"tenant-{x}.jsonl")} for x in "ab"
        ],
    )
    job.update(copy.deepcopy(overrides))
    return job


def two_tenant_job(workdir: Path, **overrides: Any) -> JobConfig:
    """:func:`two_tenant_dict`, validated."""
    return parse_job(two_tenant_dict(workdir, **overrides))


def cluster_job_dict(**overrides: Any) -> dict[str, Any]:
    """A job that can run on a cluster (network URIs everywhere); never executed here."""
    job: dict[str, Any] = {
        "name": "fedit",
        "workdir": "/tmp/fedtune",
        "model": {"source": "tiny", "hidden_size": 32, "num_layers": 2, "num_heads": 2},
        "algorithm": {"name": "fedavg"},
        "rounds": 2,
        "exchange_uri": "s3://exchange/runs",
        "provider_store_uri": "s3://provider/runs",
        "tenants": [
            {
                "name": f"tenant-{x}",
                "namespace": f"fedtune-tenant-{x}",
                "data_uri": f"s3://tenant-{x}-data/train.jsonl",
                "store_uri": f"s3://tenant-{x}-data/state",
            }
            for x in "ab"
        ],
        "tracking": {"backend": "mlflow", "tracking_uri": "http://mlflow.fedtune:5000"},
    }
    job.update(copy.deepcopy(overrides))
    return job
