"""export_and_register: stores the final evaluation, exports and "registers" the final model."""

from __future__ import annotations

from pathlib import Path

from fedtune.engines import layout, steps
from fedtune.entrypoints import export_and_register
from tests.kfp.component_checks import assert_folder_consistent, initialised, marker
from tests.kfp.conftest import two_tenant_job


def test_spec_metadata_and_readme_agree() -> None:
    assert_folder_consistent("export_and_register")


def test_exports_the_final_model_and_stores_the_summary_parts(tmp_path: Path) -> None:
    job = two_tenant_job(tmp_path / "w")
    job_path = initialised(tmp_path, job, rounds_configured=1)
    env = steps.ProviderEnv.create(job)
    for tenant in ("tenant-a", "tenant-b"):
        steps.client_step(steps.TenantEnv.create(env.job, tenant), 1)
    steps.aggregate_step(env, 1, ["tenant-a", "tenant-b"])
    metrics = []
    for tenant in ("tenant-b", "tenant-a"):  # collected in any order
        path = tmp_path / f"m-{tenant}"
        path.write_text(f'{{"tenant": "{tenant}", "metrics": {{"eval_loss": 1.5}}}}')
        metrics.append(str(path))
    export_and_register.component(str(job_path), metrics, str(tmp_path / "out"))
    got = marker(tmp_path / "out")
    assert list(got["final_eval"]) == ["tenant-a", "tenant-b"]  # the job's tenant order
    ((name, artifact),) = got["artifacts"].items()
    assert Path(artifact["local_path"]).is_dir() and artifact["registered_version"] == 0
    store = layout.JobStores(job).provider()
    assert store.get_json(layout.FINAL_EVAL_KEY) == got["final_eval"]
    assert store.list(f"artifacts/{name}")
