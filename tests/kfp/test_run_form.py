"""The run form: where the job comes from, typed overrides, the run's state scope, resuming."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedtune.core.errors import ConfigError
from fedtune.engines import layout, steps
from fedtune.entrypoints import common, configure_round, export_and_register, server_init
from fedtune.pipelines.run_form import JOB_SCOPE, RunForm, open_rounds, resolve_job, scoped
from tests.helpers.moto import admin_client, create_bucket, start_moto_server, use_fake_aws_env
from tests.kfp.conftest import cluster_job_dict, two_tenant_dict, two_tenant_job


def form_for(raw: dict, **fields: object) -> RunForm:  # type: ignore[type-arg]
    return RunForm(job_config=json.dumps(raw), **fields)  # type: ignore[arg-type]


def test_typed_overrides_change_the_job_and_the_rest_is_kept(tmp_path: Path) -> None:
    raw = two_tenant_dict(tmp_path, rounds=2)
    job = resolve_job(
        form_for(raw, rounds=200, clients_per_round=1, lr=0.5, local_steps=7, seed=0,
                 resume_run_id=JOB_SCOPE),
        "fedit",
    )
    assert (job.rounds, job.clients_per_round, job.seed) == (200, 1, 0)
    assert (job.training.lr, job.training.local_steps) == (0.5, 7)
    assert job.training.batch_size == two_tenant_job(tmp_path).training.batch_size
    untouched = resolve_job(form_for(raw, resume_run_id=JOB_SCOPE), "fedit")
    assert untouched == two_tenant_job(tmp_path, rounds=2)  # sentinels keep the job's values


def test_an_override_the_job_refuses_is_reported_with_the_override(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="clients_per_round=5 exceeds the 2 tenants") as info:
        resolve_job(form_for(two_tenant_dict(tmp_path), clients_per_round=5, kfp_run_id="r"), "fedit")
    assert '"clients_per_round": 5' in str(info.value)


def test_no_job_and_a_job_of_another_family_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="both job_uri and job_config are empty"):
        resolve_job(RunForm(kfp_run_id="r"), "fedit")
    with pytest.raises(ConfigError, match="does not belong to the 'fedbiot' pipeline") as info:
        resolve_job(form_for(two_tenant_dict(tmp_path), kfp_run_id="r"), "fedbiot")
    assert "'fedit' pipeline" in info.value.fix
    with pytest.raises(ConfigError, match="not a run id"):
        resolve_job(form_for(two_tenant_dict(tmp_path), resume_run_id="../other"), "fedit")


SECURE = {"secure_aggregation": {"enabled": True}}
DP = {
    "algorithm": {"name": "fedavg", "aggregation_weights": "uniform"},
    "differential_privacy": {"noise_multiplier": 1.0, "clipping": {"norm": 0.5}},
}


def test_each_pipeline_variant_takes_its_jobs_and_names_the_other_for_the_rest(
    tmp_path: Path,
) -> None:
    """The UI's job_config is read only when the run starts: a job given to the wrong variant
    is refused there, naming the pipeline that runs it."""
    secure = {**two_tenant_dict(tmp_path), **SECURE}
    assert resolve_job(form_for(secure, kfp_run_id="r"), "fedit", secure=True).secure_aggregation.enabled
    with pytest.raises(ConfigError, match="sets secure_aggregation.enabled: true, but the 'fedtune-fedit' pipeline") as info:
        resolve_job(form_for(secure, kfp_run_id="r"), "fedit")
    assert "'fedtune-fedit-secure' pipeline" in info.value.fix
    with pytest.raises(ConfigError, match="does not enable secure_aggregation, but the 'fedtune-fedit-secure'") as info:
        resolve_job(form_for(two_tenant_dict(tmp_path), kfp_run_id="r"), "fedit", secure=True)
    assert "'fedtune-fedit' pipeline" in info.value.fix
    # Central DP needs no extra steps: the plain pipeline runs it.
    dp = resolve_job(form_for({**two_tenant_dict(tmp_path), **DP}, kfp_run_id="r"), "fedit")
    assert dp.differential_privacy is not None


@pytest.fixture
def moto_endpoint() -> Iterator[str]:
    server = start_moto_server()
    try:
        yield server.endpoint_url
    finally:
        server.stop()


def test_job_uri_reads_a_job_file_from_the_bucket_and_wins(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_aws_env(monkeypatch, moto_endpoint)
    create_bucket(moto_endpoint, "fedtune-jobs")
    text = json.dumps(cluster_job_dict(rounds=7))
    admin_client(moto_endpoint).put_object(Bucket="fedtune-jobs", Key="fedit.yaml", Body=text)
    form = RunForm(
        job_uri="s3://fedtune-jobs/fedit.yaml",
        job_config=json.dumps(cluster_job_dict(rounds=2)),
        kfp_run_id="4f1c",
    )
    job = resolve_job(form, "fedit")
    assert job.rounds == 7
    with pytest.raises(ConfigError):
        resolve_job(RunForm(job_uri="s3://fedtune-jobs/absent.yaml", kfp_run_id="r"), "fedit")
    with pytest.raises(ConfigError, match="not an s3:// URI"):
        resolve_job(RunForm(job_uri="https://example.org/job.yaml", kfp_run_id="r"), "fedit")


def test_state_lives_under_the_run_id_of_every_store() -> None:
    job = resolve_job(
        RunForm(job_config=json.dumps(cluster_job_dict()), kfp_run_id="8e2d-11"), "fedit"
    )
    assert job.exchange_uri == "s3://exchange/runs/runs/8e2d-11"
    assert job.provider_store_uri == "s3://provider/runs/runs/8e2d-11"
    assert [t.store_uri for t in job.tenants] == [
        "s3://tenant-a-data/state/runs/8e2d-11",
        "s3://tenant-b-data/state/runs/8e2d-11",
    ]
    resumed = resolve_job(
        RunForm(job_config=json.dumps(cluster_job_dict()), kfp_run_id="new", resume_run_id="8e2d-11"),
        "fedit",
    )
    assert resumed == job
    plain = scoped(job, JOB_SCOPE)
    assert plain is job


def test_open_rounds_start_at_the_first_not_stored_and_are_never_empty() -> None:
    assert open_rounds([False] * 3, 0) == [1, 2, 3]
    assert open_rounds([True, False, False], 0) == [2, 3]
    assert open_rounds([True, False, False, False], 2) == [2]
    assert open_rounds([True, True], 0) == [2]  # done: the last round's steps skip


def test_create_run_again_trains_again_and_resume_continues_without_a_second_version(
    tmp_path: Path,
) -> None:
    raw = two_tenant_dict(tmp_path / "w", rounds=1)
    first = RunForm(job_config=json.dumps(raw), kfp_run_id="run-1")
    job_path = tmp_path / "a" / "job"
    assert server_init.component(first, "fedit", str(job_path), str(tmp_path / "a" / "s")) == [1]
    job = common.read_job_artifact(job_path)
    configure_round.component(str(job_path), 1, str(tmp_path / "a" / "b1"))
    env = steps.ProviderEnv.create(job)
    for tenant in ("tenant-a", "tenant-b"):
        steps.client_step(steps.TenantEnv.create(job, tenant), 1)
    steps.aggregate_step(env, 1, ["tenant-a", "tenant-b"])
    env.store().put_json(layout.summary_key(1), {"round": 1})
    first_export = export_and_register.run(job, [])
    # The same job in a new run: fresh state under the new id, round 1 trains again.
    again = RunForm(job_config=json.dumps(raw), kfp_run_id="run-2")
    assert server_init.component(again, "fedit", str(tmp_path / "b" / "job"), str(tmp_path / "b" / "s")) == [1]
    assert common.read_job_artifact(tmp_path / "b" / "job").provider_store_uri.endswith("runs/run-2")
    assert not steps.ProviderEnv.create(common.read_job_artifact(tmp_path / "b" / "job")).store().exists(
        layout.summary_key(1)
    )
    # Resuming run-1 finds it done: the loop's one slot skips, export returns what it stored.
    resume = RunForm(job_config=json.dumps(raw), kfp_run_id="run-3", resume_run_id="run-1")
    server_init.component(resume, "fedit", str(tmp_path / "c" / "job"), str(tmp_path / "c" / "s"))
    resumed_job = common.read_job_artifact(tmp_path / "c" / "job")
    assert resumed_job == job
    second_export = export_and_register.run(resumed_job, [])
    assert second_export["skipped"] and second_export["artifacts"] == first_export["artifacts"]
