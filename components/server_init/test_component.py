"""server_init: writes the job artifact and the initial state; refuses a malformed config."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.core.messages import ServerState
from fedtune.engines import layout
from fedtune.entrypoints import common, server_init
from fedtune.pipelines.run_form import RunForm
from tests.kfp.component_checks import assert_folder_consistent, initialised, marker
from tests.kfp.conftest import two_tenant_job


def test_spec_metadata_and_readme_agree() -> None:
    assert_folder_consistent("server_init")


def test_writes_the_job_artifact_and_the_initial_state(tmp_path: Path) -> None:
    job = two_tenant_job(tmp_path / "w")
    job_path = initialised(tmp_path, job)
    assert common.read_job_artifact(job_path) == job
    assert marker(tmp_path / "artifacts" / "state-0")["round"] == 0
    store = layout.JobStores(job).provider()
    assert ServerState.stored(store, layout.state_key(0)) and store.exists(layout.RUN_KEY)


def test_a_malformed_job_config_exits_2_with_a_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        server_init.component(
            RunForm(job_config='{"name": "Bad Name"}', kfp_run_id="run-1"),
            "fedit",
            str(tmp_path / "job"),
            str(tmp_path / "s"),
        )
    assert done.value.code == 2
    assert "is not a DNS-1123 label" in capsys.readouterr().err
    assert not (tmp_path / "job").exists()
