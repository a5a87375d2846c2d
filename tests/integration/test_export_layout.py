"""The FedIT export: the base once plus ``adapter/``; ``export.merged: true`` adds one merged copy."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fedtune.config import JobConfig
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.tracking.base import NullTracker

QUIET = RunOptions(progress=False)


def exported(job: JobConfig) -> dict[str, int]:
    """Bytes of each weights file of the exported model in the provider store."""
    store = layout.JobStores(job).provider()
    prefix = f"{layout.ARTIFACTS_PREFIX}/model/"
    return {
        k.removeprefix(prefix): len(store.get_bytes(k))
        for k in store.list(f"{layout.ARTIFACTS_PREFIX}/model")
        if k.endswith(".safetensors")
    }


@pytest.mark.slow
def test_the_export_writes_the_base_once_and_merged_only_when_asked(
    make_job: Callable[..., JobConfig],
) -> None:
    plain = make_job(rounds=1)
    run_job(plain, NullTracker(), QUIET)
    merged = make_job(rounds=1, export={"merged": True})
    run_job(merged, NullTracker(), QUIET)
    base_only, with_merged = exported(plain), exported(merged)
    assert sorted(base_only) == ["adapter/adapter_model.safetensors", "model.safetensors"]
    assert sorted(with_merged) == sorted([*base_only, "merged/model.safetensors"])
    full = base_only["model.safetensors"]
    assert with_merged["merged/model.safetensors"] == full  # exactly one more full copy
    assert sum(base_only.values()) < 1.5 * full  # base once (+ a small adapter), not 2-3 copies
