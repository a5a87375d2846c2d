"""A federated round whose provider and tenants load the base model by hub id, offline."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedtune.config import load_job
from fedtune.engines.local import RunOptions, run_job
from fedtune.tracking.base import NullTracker
from tests.helpers.hub_cache import REPO, build_hub_cache
from tests.integration.conftest import tiny_job_dict


@pytest.mark.slow  # a whole job (about 20 s on a busy 2-core machine)
def test_one_round_on_a_hub_model_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_hub_cache(tmp_path / "hf", monkeypatch)
    job = tiny_job_dict(tmp_path / "w", rounds=1)
    job["model"] = {"source": "pretrained", "uri": REPO, "tenant_uri": REPO}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    config = load_job(path)
    assert config.model.uri == f"hf://{REPO}"  # type: ignore[union-attr]
    summary = run_job(config, NullTracker(), RunOptions(progress=False))
    assert summary["completed"] and len(summary["rounds"][0]["tenants"]) == 3
