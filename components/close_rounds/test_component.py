"""close_rounds: tabulates the stored rounds, says the job is complete; names missing rounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.engines import steps
from fedtune.entrypoints import close_rounds, common
from tests.kfp.component_checks import assert_folder_consistent, initialised


class Sink:
    """Stands in for a dsl.Metrics output: what the component body logs."""

    def __init__(self) -> None:
        self.logged: dict[str, float] = {}

    def log_metric(self, metric: str, value: float) -> None:
        self.logged[metric] = value


def test_spec_metadata_and_readme_agree() -> None:
    assert_folder_consistent("close_rounds")


def test_tabulates_every_round_and_says_the_job_is_complete(tmp_path: Path) -> None:
    from tests.kfp.conftest import two_tenant_job

    job = two_tenant_job(tmp_path / "w")
    job_path = initialised(tmp_path, job, rounds_configured=1)
    env = steps.ProviderEnv.create(job)
    for tenant in ("tenant-a", "tenant-b"):
        steps.client_step(steps.TenantEnv.create(env.job, tenant), 1)
    from fedtune.entrypoints import aggregate

    aggregate.run(job, 1, common.read_marker(tmp_path / "artifacts" / "b1"), [
        {"round": 1, "tenant": t, "ok": True} for t in ("tenant-a", "tenant-b")
    ])
    sink = Sink()
    complete, tenants = close_rounds.component(
        str(job_path),
        str(tmp_path / "artifacts" / "state-0"),
        str(tmp_path / "closed"),
        str(tmp_path / "table.md"),
        sink,
    )
    assert complete is True and tenants == ["tenant-a", "tenant-b"]
    table = (tmp_path / "table.md").read_text().splitlines()
    assert table[0].startswith("| round | sampled | accepted")
    assert table[2].startswith("| 1 | tenant-a, tenant-b | tenant-a, tenant-b |")
    assert sink.logged["rounds_completed"] == 1.0 and sink.logged["clients_accepted"] == 2.0


def test_a_round_missing_after_the_loop_fails_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.kfp.conftest import two_tenant_job

    job_path = initialised(tmp_path, two_tenant_job(tmp_path / "w", rounds=2))
    with pytest.raises(SystemExit) as done:
        close_rounds.component(
            str(job_path),
            str(tmp_path / "artifacts" / "state-0"),
            str(tmp_path / "closed"),
            str(tmp_path / "table.md"),
        )
    assert done.value.code == 1
    err = capsys.readouterr().err
    assert "rounds [1, 2]" in err and "resume_run_id" in err
    assert not (tmp_path / "table.md").exists()
