"""aggregate: aggregates delivered updates and records the round; refuses foreign markers."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.core.messages import ServerState
from fedtune.engines import layout
from fedtune.entrypoints import aggregate, client_step
from tests.kfp.component_checks import assert_folder_consistent, initialised, marker
from tests.kfp.conftest import two_tenant_job


def test_spec_metadata_and_readme_agree() -> None:
    assert_folder_consistent("aggregate")


def test_aggregates_and_records_the_round(tmp_path: Path) -> None:
    job = two_tenant_job(tmp_path / "w")
    job_path = initialised(tmp_path, job, rounds_configured=1)
    updates = []
    for tenant in ("tenant-a", "tenant-b"):
        b1 = str(tmp_path / "artifacts" / "b1")
        client_step.component(str(job_path), b1, tenant, "run", str(tmp_path / tenant))
        updates.append(str(tmp_path / tenant))
    aggregate.component(
        str(job_path), str(tmp_path / "artifacts" / "b1"), updates, str(tmp_path / "s1")
    )
    assert marker(tmp_path / "s1")["accepted"] == ["tenant-a", "tenant-b"]
    store = layout.JobStores(job).provider()
    assert ServerState.stored(store, layout.state_key(1))
    assert store.get_json(layout.summary_key(1))["sampled"] == ["tenant-a", "tenant-b"]


def test_a_marker_of_another_round_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_path = initialised(tmp_path, two_tenant_job(tmp_path / "w"), rounds_configured=1)
    (tmp_path / "stray").write_text('{"round": 7, "tenant": "tenant-a", "ok": true}')
    with pytest.raises(SystemExit) as done:
        aggregate.component(
            str(job_path),
            str(tmp_path / "artifacts" / "b1"),
            [str(tmp_path / "stray")],
            str(tmp_path / "s1"),
        )
    assert done.value.code == 1
    assert "Recompile the pipeline" in capsys.readouterr().err
