"""Tiny end-to-end jobs on the shipped quickstart data, run by the in-process engine."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedtune.config import JobConfig, parse_job

DATA = Path(__file__).resolve().parents[2] / "examples" / "data" / "quickstart"


def tiny_job_dict(workdir: Path, data_dir: Path = DATA, **overrides: Any) -> dict[str, Any]:
    """A 2-layer hidden-32 Llama, 3 tenants, 2 local steps: a round takes well under a second.

    The dict owns everything in it: the overrides are copied, so a test that edits the result
    (``d["tenants"][0]["dp_sgd"] = ...``) never edits a table shared with later tests.
    """
    job: dict[str, Any] = {
        "name": "itest",
        "seed": 7,
        "workdir": str(workdir),
        "model": {
            "source": "tiny",
            "arch": "llama",
            "hidden_size": 32,
            "num_layers": 2,
            "num_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 128,
        },
        "algorithm": {"name": "fedavg"},
        "rounds": 2,
        "min_clients": 2,
        "training": {"local_steps": 2, "batch_size": 4, "lr": 0.01, "max_seq_len": 160},
        "lora": {"r": 4, "alpha": 8},
        "tenants": [
            {"name": f"tenant-{x}", "data_uri": str(data_dir / f"tenant-{x}.jsonl")}
            for x in "abc"
        ],
        "tracking": {"backend": "none"},
    }
    job.update(copy.deepcopy(overrides))
    return job


@pytest.fixture
def make_job(tmp_path: Path) -> Callable[..., JobConfig]:
    """Build a tiny job in a fresh work directory; keyword arguments override fields."""
    counter = iter(range(1000))

    def build(**overrides: Any) -> JobConfig:
        workdir = tmp_path / f"run{next(counter)}"
        return parse_job(tiny_job_dict(workdir, **overrides))

    return build


@pytest.fixture
def equal_size_data(tmp_path: Path) -> Path:
    """Three tenant files with the same number of records (SCAFFOLD == FedAvg needs it)."""
    out = tmp_path / "equal"
    out.mkdir()
    sizes = []
    for x in "abc":
        lines = (DATA / f"tenant-{x}.jsonl").read_text().splitlines()
        sizes.append(len(lines))
    n = min(sizes)
    for x in "abc":
        lines = (DATA / f"tenant-{x}.jsonl").read_text().splitlines()[:n]
        (out / f"tenant-{x}.jsonl").write_text("\n".join(lines) + "\n")
    return out


def copy_data(dst: Path) -> Path:
    """A writable copy of the quickstart data (tests that corrupt a tenant's file)."""
    shutil.copytree(DATA, dst)
    return dst
