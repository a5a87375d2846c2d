"""configure_round: writes the round's broadcast once; a re-run skips it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.entrypoints import configure_round
from tests.kfp.component_checks import assert_folder_consistent, initialised, marker
from tests.kfp.conftest import two_tenant_job


def test_spec_metadata_and_readme_agree() -> None:
    assert_folder_consistent("configure_round")


def test_writes_the_broadcast_then_skips_it(tmp_path: Path) -> None:
    job_path = initialised(tmp_path, two_tenant_job(tmp_path / "w"), rounds_configured=1)
    first = marker(tmp_path / "artifacts" / "b1")
    assert first["round"] == 1 and first["configure"]["bytes"] > 0 and first["started_at"] > 0
    configure_round.component(str(job_path), 1, str(tmp_path / "again"))
    assert marker(tmp_path / "again")["configure"]["skipped"] is True


def test_a_round_without_previous_state_fails_with_a_store_error(tmp_path: Path) -> None:
    job_path = initialised(tmp_path, two_tenant_job(tmp_path / "w", rounds=3))
    with pytest.raises(SystemExit) as done:
        configure_round.component(str(job_path), 3, str(tmp_path / "b3"))
    assert done.value.code == 4  # StoreError: the state of round 2 is not stored
