"""``fedtune compile``: the pipeline YAML of a job's family, the job as its default, checked.

A compiled pipeline runs in pods that share no filesystem, so every store, dataset and the
tracking server must be addressed by a network URI; :func:`cluster_problems` lists every
violation at once. The graph depends only on the family: the job fills the run form's
``job_config`` default, its ``secure_aggregation.enabled`` picks the family's plain or
secure-aggregation variant, and its ``provider:`` section gives the heavy provider steps their
resources and image (see :mod:`fedtune.pipelines.builder`).
"""

from __future__ import annotations

from pathlib import Path

from fedtune.config.job import JobConfig, PretrainedModelConfig
from fedtune.core.errors import ConfigError
from fedtune.pipelines.builder import DEFAULT_CLUSTER, ClusterSettings, compile_pipeline
from fedtune.pipelines.run_form import family_of
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
    if isinstance(job.model, PretrainedModelConfig) and not _in_every_pod(job.model.uri):
        hub = job.model.uri.removeprefix("hf://")
        hint = (
            f" (pods share no Hugging Face cache: `hf download {hub} --local-dir DIR`, upload DIR)"
            if job.model.uri.startswith("hf://")
            else ""
        )
        problems.append(f"model.uri is {job.model.uri!r}: set an s3:// URI{hint}")
    if job.public_data_uri and not _is_s3(job.public_data_uri):
        problems.append(f"public_data_uri is {job.public_data_uri!r}: set an s3:// URI")
    uri = job.tracking.tracking_uri or settings.mlflow_uri
    if job.tracking.backend == "mlflow" and not (uri and uri.startswith(("http://", "https://"))):
        problems.append(
            f"tracking.tracking_uri is {job.tracking.tracking_uri!r}: a pod-local MLflow store "
            "vanishes with the pod; set the MLflow server URL (or pass --mlflow-uri)"
        )
    return problems


def _in_every_pod(uri: str) -> bool:
    """An s3:// URI, or a base that ships inside fedtune's images (``builtin://``)."""
    return _is_s3(uri) or uri.startswith("builtin://")


def compile_job(
    job: JobConfig,
    out: str | Path,
    *,
    settings: ClusterSettings | None = DEFAULT_CLUSTER,
) -> tuple[Path, str]:
    """Compile the pipeline of ``job``'s family with ``job`` as its default, then validate the
    file; return its path and the family.

    With ``settings=None`` the cluster checks and Kubernetes settings are left out (the
    ``kfp-local`` form).

    Raises:
        ConfigError: The job cannot run in a pipeline, or not in a cluster.
    """
    family = family_of(job.algorithm.name)
    if settings is not None:
        problems = cluster_problems(job, settings)
        if problems:
            raise ConfigError(
                f"job {job.name!r} cannot run on a cluster as written "
                f"({len(problems)} problem(s)):\n  " + "\n  ".join(problems),
                fix="Point stores, data and tracking at network URIs (see "
                "pipelines/jobs/fedit.yaml), or run it here with --engine kfp-local.",
            )
    # A job with secure aggregation gets its family's secure-aggregation variant.
    path = compile_pipeline(family, out, settings, default_job=job, secure=job.secure_aggregation.enabled)
    validate_compiled(path)
    return path, family
