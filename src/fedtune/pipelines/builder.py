"""Build and compile the pipeline of a job: generic over the algorithm phase interface.

Every registered algorithm has the same four phases plus export, so one builder serves them
all: ``server-init``, then per round (unrolled at compile time, one nested ``fedtune-round``
pipeline each) ``configure-round`` -> ``client-step`` in a ``ParallelFor`` over the round's
sampled tenant names -> ``aggregate``; after the last round ``evaluate`` per tenant and
``export-and-register``, then, when the job enables it, ``audit`` per audited tenant (through
the launcher, like ``evaluate``) and ``record-audit``. Every task writes to stores, so caching is off everywhere; tenant
steps retry (a retried launcher re-attaches to its Job).

With :class:`ClusterSettings` the compiled YAML also carries the Kubernetes settings a
cluster run needs (the chart's tenants ConfigMap for the launcher, the provider's store
credentials Secret, endpoints); without them it is the plain spec ``kfp-local`` runs.
"""

# No `from __future__ import annotations`: kfp reads the nested pipeline's annotations as types.
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp import compiler, dsl
from kfp.dsl import Artifact, Input

from fedtune.config.job import JobConfig
from fedtune.config.secrets import (
    MLFLOW_SECRET,
    MLFLOW_SECRET_ENV,
    PRESIGNER_ENV,
    PRESIGNER_SECRET,
    PROVIDER_S3_SECRET,
    S3_SECRET_ENV,
)
from fedtune.engines.launcher_manifest import DEFAULT_TENANTS_FILE, TENANTS_FILE_ENV
from fedtune.pipelines import components as c
from fedtune.pipelines.plan import PipelinePlan

PIPELINE_DOC = """Federated fine-tuning with {algorithm}: rounds {start}-{end} of {total}, {tenants} tenant(s).

Provider steps run in this namespace; each tenant's training and evaluation run as a Job in
the tenant's own namespace. Edit hyperparameters and URIs freely; tenants, rounds, seed and
clients_per_round are fixed by the compiled graph (recompile with `fedtune compile`).

Args:
    job_config: The fedtune job config as JSON, validated when the run starts. No credentials: they come from Kubernetes Secrets.
"""

@dataclass(frozen=True)
class ClusterSettings:
    """Kubernetes settings compiled into the pipeline (defaults match the Helm chart).

    Attributes:
        tenants_configmap: ConfigMap with ``tenants.json`` (``<release>-tenants``), mounted
            into the launcher tasks.
        store_secret: Secret in the run's namespace with the exchange store's credentials
            (keys ``access-key-id`` / ``secret-access-key``); None relies on ambient identity.
        s3_endpoint: S3 endpoint of the exchange store (e.g. the chart's MinIO); None: AWS.
        mlflow_uri: MLflow tracking URI for provider steps; None: the job's own setting.
        mlflow_secret: Secret with the MLflow login of provider steps (keys ``username`` /
            ``password``), optional in the cluster: absent when MLflow auth is off.
        presigner_secret: Secret with the keys launcher tasks sign tenants' URLs with (keys
            ``access-key-id`` / ``secret-access-key``), optional: absent, they sign with
            ``store_secret``'s.
    """

    tenants_configmap: str = "fedtune-tenants"
    store_secret: str | None = PROVIDER_S3_SECRET
    s3_endpoint: str | None = None
    mlflow_uri: str | None = None
    mlflow_secret: str | None = MLFLOW_SECRET
    presigner_secret: str | None = PRESIGNER_SECRET


DEFAULT_CLUSTER = ClusterSettings()


def _provider(task: Any, name: str, settings: ClusterSettings | None) -> Any:
    """Display name, no caching, and the provider's store access in a cluster."""
    task.set_display_name(name).set_caching_options(False)
    if settings is not None:
        from kfp import kubernetes

        if settings.store_secret:
            kubernetes.use_secret_as_env(task, settings.store_secret, S3_SECRET_ENV)
        if settings.mlflow_secret:
            kubernetes.use_secret_as_env(
                task, settings.mlflow_secret, MLFLOW_SECRET_ENV, optional=True
            )
        if settings.s3_endpoint:
            task.set_env_variable("FEDTUNE_S3_ENDPOINT_URL", settings.s3_endpoint)
        if settings.mlflow_uri:
            task.set_env_variable("MLFLOW_TRACKING_URI", settings.mlflow_uri)
    return task


def _tenant(task: Any, name: str, settings: ClusterSettings | None) -> Any:
    """A tenant step's launcher task: retried, and given the chart's tenants file."""
    _provider(task, name, settings)
    task.set_retry(num_retries=2, backoff_duration="30s", backoff_factor=2.0)
    if settings is not None:
        from kfp import kubernetes

        # The launcher only signs URLs and talks to the API server: a small pod suffices.
        task.set_cpu_request("250m").set_memory_request("1Gi").set_memory_limit("2Gi")
        kubernetes.use_config_map_as_volume(
            task, settings.tenants_configmap, mount_path=str(Path(DEFAULT_TENANTS_FILE).parent)
        )
        task.set_env_variable(TENANTS_FILE_ENV, DEFAULT_TENANTS_FILE)
        if settings.presigner_secret:
            kubernetes.use_secret_as_env(
                task, settings.presigner_secret, PRESIGNER_ENV, optional=True
            )
    return task


def build_pipeline(job: JobConfig, plan: PipelinePlan, settings: ClusterSettings | None) -> Any:
    """The KFP pipeline of ``plan``, its ``job_config`` parameter defaulting to ``job``."""
    # Only what the job file sets: the run form shows its own settings, and a changed
    # default elsewhere in fedtune does not make every committed pipeline stale.
    job_json = json.dumps(job.model_dump(mode="json", exclude_unset=True), sort_keys=True)
    plan_json = plan.to_json()

    @dsl.pipeline(
        name="fedtune-round",
        description="One federated round: configure, every sampled tenant trains, aggregate.",
    )
    def round_pipeline(
        job: Input[Artifact], state: Input[Artifact], round_index: int, tenants: list[str]
    ) -> Artifact:
        configure = c.configure_round(job=job, state=state, round_index=round_index)
        _provider(configure, "configure round", settings)
        with dsl.ParallelFor(tenants) as tenant:
            client = c.client_step(
                job=job,
                broadcast=configure.outputs["broadcast"],
                round_index=round_index,
                tenant=tenant,
                run_key=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            )
            _tenant(client, "client step", settings)
        merged = c.aggregate(
            job=job,
            broadcast=configure.outputs["broadcast"],
            updates=dsl.Collected(client.outputs["update"]),
            round_index=round_index,
        )
        _provider(merged, "aggregate", settings)
        return merged.outputs["state"]

    def pipeline(job_config: str = job_json) -> None:
        init = _provider(
            c.server_init(job_config=job_config, plan=plan_json), "server init", settings
        )
        job_artifact, state = init.outputs["job"], init.outputs["state"]
        for round_index, sampled in plan.rounds:
            step = round_pipeline(
                job=job_artifact, state=state, round_index=round_index, tenants=list(sampled)
            )
            step.set_display_name(f"round {round_index}")
            state = step.output
        if plan.final:
            with dsl.ParallelFor(list(plan.tenants)) as tenant:
                scored = c.evaluate(
                    job=job_artifact,
                    state=state,
                    tenant=tenant,
                    run_key=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                )
                _tenant(scored, "evaluate", settings)
            export = c.export_and_register(
                job=job_artifact, state=state, metrics=dsl.Collected(scored.outputs["metrics"])
            )
            _provider(export, "export and register", settings)
            if plan.audited:
                with dsl.ParallelFor(list(plan.audited)) as tenant:
                    audited = c.audit(
                        job=job_artifact,
                        registered=export.outputs["artifacts"],
                        tenant=tenant,
                        run_key=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                    )
                    _tenant(audited, "audit", settings)
                recorded = c.record_audit(
                    job=job_artifact, scores=dsl.Collected(audited.outputs["scores"])
                )
                _provider(recorded, "record audit", settings)

    pipeline.__doc__ = PIPELINE_DOC.format(
        algorithm=job.algorithm.name,
        tenants=len(plan.tenants),
        start=plan.start_round,
        end=plan.end_round,
        total=plan.total_rounds,
    )
    # The description shown in the KFP UI comes from the docstring, the form's help from Args.
    return dsl.pipeline(name=f"fedtune-{job.name}")(pipeline)


def compile_pipeline(
    job: JobConfig, plan: PipelinePlan, out: str | Path, settings: ClusterSettings | None
) -> Path:
    """Compile the pipeline of ``plan`` to YAML at ``out``; return the path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(job, plan, settings), str(out))
    return out
