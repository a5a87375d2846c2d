"""A federated round on tenants that bring Parquet, chat JSON and save_to_disk data."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from fedtune.config import parse_job
from fedtune.data.jsonl import read_jsonl
from fedtune.engines.local import RunOptions, run_job
from fedtune.engines.steps import TenantEnvs
from fedtune.tracking.base import NullTracker
from tests.integration.conftest import DATA, tiny_job_dict


@pytest.mark.slow  # a whole job (about 20 s on a busy 2-core machine)
def test_one_round_on_parquet_chat_and_folder_tenants(tmp_path: Path) -> None:
    records = {t: read_jsonl(DATA / f"tenant-{t}.jsonl")[:40] for t in "abc"}
    datasets.Dataset.from_list(records["a"]).to_parquet(str(tmp_path / "a.parquet"))
    chats = [
        {"messages": [{"role": "user", "content": r["instruction"] + "\n" + r["context"]},
                      {"role": "assistant", "content": r["response"]}]}
        for r in records["b"]
    ]
    (tmp_path / "b.json").write_text(json.dumps(chats), encoding="utf-8")
    datasets.Dataset.from_list(records["c"]).save_to_disk(str(tmp_path / "c"))
    job = parse_job(tiny_job_dict(tmp_path / "w", rounds=1))
    uris = {"tenant-a": "a.parquet", "tenant-b": "b.json", "tenant-c": "c"}
    job = job.model_copy(update={"tenants": [
        t.model_copy(update={"data_uri": str(tmp_path / uris[t.name])}) for t in job.tenants
    ]})
    chat = TenantEnvs(job)["tenant-b"].data()
    assert all(e.messages for e in [*chat.train, *chat.eval])
    summary = run_job(job, NullTracker(), RunOptions(progress=False))
    assert summary["completed"] and len(summary["rounds"]) == 1
    losses = [t["train_loss"] for t in summary["rounds"][0]["tenants"].values()]
    assert len(losses) == 3 and all(0 < loss < 20 for loss in losses), losses
