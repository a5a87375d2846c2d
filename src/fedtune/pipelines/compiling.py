"""``fedtune compile``: the pipeline YAML of a job, checked for size and for cluster use.

A compiled pipeline runs in pods that share no filesystem, so every store, dataset and the
tracking server must be addressed by a network URI; :func:`cluster_problems` lists every
violation at once. The size bound of :mod:`fedtune.pipelines.plan` applies too.
"""

from __future__ import annotations

from pathlib import Path

from fedtune.config.job import JobConfig, PretrainedModelConfig
from fedtune.core.errors import ConfigError
from fedtune.pipelines.builder import DEFAULT_CLUSTER, ClusterSettings, compile_pipeline
from fedtune.pipelines.plan import PipelinePlan, check_size, plan_job
from fedtune.pipelines.validate import validate_compiled


def _is_s3(uri: str | None) -> bool:
    return bool(uri) and str(uri).startswith("s3://")


def cluster_problems(job: JobConfig, settings: ClusterSettings) -> list[str]:
    """Everything in ``job`` that cannot work when each step is a separate pod."""
    problems = []
    if not _is_s3(job.exchange_uri):
        problems.append(
            f"exchange_uri is {job.exchange_uri!r}: provider and tenant pods share no disk; "
            "set an s3:// URI"
        )
    if not _is_s3(job.provider_store_uri):
        problems.append(
            f"provider_store_uri is {job.provider_store_uri!r}: server state must outlive each "
            "provider pod; set an s3:// URI tenants cannot read"
        )
    for tenant in job.tenants:
        if not _is_s3(tenant.data_uri):
            problems.append(
                f"tenants.{tenant.name}.data_uri is {tenant.data_uri!r}: set an s3:// URI"
            )
        if not _is_s3(tenant.store_uri):
            problems.append(
                f"tenants.{tenant.name}.store_uri is {tenant.store_uri!r}: the tenant's kept "
                "state must outlive its pod; set an s3:// URI in the tenant's bucket"
            )
    if isinstance(job.model, PretrainedModelConfig) and not _is_s3(job.model.uri):
        problems.append(f"model.uri is {job.model.uri!r}: set an s3:// URI")
    if job.public_data_uri and not _is_s3(job.public_data_uri):
        problems.append(f"public_data_uri is {job.public_data_uri!r}: set an s3:// URI")
    uri = job.tracking.tracking_uri or settings.mlflow_uri
    if job.tracking.backend == "mlflow" and not (uri and uri.startswith(("http://", "https://"))):
        problems.append(
            f"tracking.tracking_uri is {job.tracking.tracking_uri!r}: a pod-local MLflow store "
            "vanishes with the pod; set the MLflow server URL (or pass --mlflow-uri)"
        )
    return problems


def compile_job(
    job: JobConfig,
    out: str | Path,
    *,
    start_round: int = 1,
    rounds: int | None = None,
    settings: ClusterSettings | None = DEFAULT_CLUSTER,
) -> tuple[Path, PipelinePlan]:
    """Compile ``job`` (rounds ``start_round``.. of it) for a cluster, then validate the file.

    With ``settings=None`` the cluster checks and Kubernetes settings are left out (the
    ``kfp-local`` form).

    Raises:
        ConfigError: The run is above the size bound, or the job cannot run in a cluster.
    """
    from fedtune.engines import privacy_steps
    from fedtune.engines.secagg_steps import refuse_pipeline

    refuse_pipeline(job)
    privacy_steps.refuse_pipeline(job)
    plan = plan_job(job, start_round, rounds)
    check_size(plan, job)
    if settings is not None:
        problems = cluster_problems(job, settings)
        if problems:
            raise ConfigError(
                f"job {job.name!r} cannot run on a cluster as written "
                f"({len(problems)} problem(s)):\n  " + "\n  ".join(problems),
                fix="Point stores, data and tracking at network URIs (see "
                "pipelines/jobs/fedit.yaml), or run it here with --engine kfp-local.",
            )
    path = compile_pipeline(job, plan, out, settings)
    validate_compiled(path)
    return path, plan
