"""configure_round: writes the round's broadcast once; a re-run skips it."""

from __future__ import annotations

from pathlib import Path

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


def test_a_slot_ahead_of_the_stored_state_trains_the_first_open_round(tmp_path: Path) -> None:
    """Iterations may run in any order: slot 3 before slots 1 and 2 still trains round 1."""
    job_path = initialised(tmp_path, two_tenant_job(tmp_path / "w", rounds=3))
    sampled = configure_round.component(str(job_path), 3, str(tmp_path / "b3"))
    assert marker(tmp_path / "b3")["round"] == 1
    assert sampled == marker(tmp_path / "b3")["sampled"] == ["tenant-a", "tenant-b"]
