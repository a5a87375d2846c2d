"""export_and_register: stores the final evaluation, exports and "registers" the final model."""

from __future__ import annotations

import json
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


class ModelOut:
    """Stands in for a dsl.Model output: a path and a metadata dict."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.metadata: dict = {}  # type: ignore[type-arg]


class Sink:
    """Stands in for a dsl.Metrics output."""

    def __init__(self) -> None:
        self.logged: dict[str, float] = {}

    def log_metric(self, metric: str, value: float) -> None:
        self.logged[metric] = value


def test_typed_outputs_describe_the_models_and_a_repeat_registers_nothing(tmp_path: Path) -> None:
    job = two_tenant_job(tmp_path / "w")
    job_path = initialised(tmp_path, job, rounds_configured=1)
    env = steps.ProviderEnv.create(job)
    for tenant in ("tenant-a", "tenant-b"):
        steps.client_step(steps.TenantEnv.create(env.job, tenant), 1)
    steps.aggregate_step(env, 1, ["tenant-a", "tenant-b"])
    (tmp_path / "m").write_text('{"tenant": "tenant-a", "metrics": {"eval_loss": 1.5}}')
    model, companion, final = ModelOut(tmp_path / "model"), ModelOut(tmp_path / "c"), Sink()
    audit_on, audited = export_and_register.component(
        str(job_path), [str(tmp_path / "m")], str(tmp_path / "out"), model, companion, final
    )
    assert (audit_on, audited) == (False, [])
    record = marker(tmp_path / "out")["artifacts"]["model"]
    assert model.metadata["exported"] is True and model.metadata["name"] == "model"
    assert model.metadata["layout"] == record["kind"] and model.metadata["store_uri"] == record["uri"]
    assert model.metadata["registered_version"] == record["registered_version"]
    assert json.loads(Path(model.path).read_text()) == model.metadata
    assert companion.metadata == {"exported": False}  # FedIT exports one model
    assert final.logged == {"eval_loss/tenant-a": 1.5}
    # A retried or resumed step returns the stored record: nothing is exported or registered again.
    again = export_and_register.run(job, [])
    assert again["skipped"] and again["artifacts"] == marker(tmp_path / "out")["artifacts"]


def test_model_roles_pick_the_main_model_and_its_companion() -> None:
    roles = export_and_register.model_roles
    registered = {"registered_name": "x"}
    assert roles({"model": registered}) == ("model", None)
    assert roles({"model": registered, "small": registered}) == ("model", "small")  # FedPT
    assert roles({"adapfu": registered, "adapemu": registered}) == ("adapemu", "adapfu")  # FedBiOT
    assert roles({"slm": registered}) == ("slm", None)  # FedMKT
