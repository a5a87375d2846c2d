"""Build and compile the pipeline of an algorithm family: generic over the phase interface.

Every registered algorithm has the same four phases plus export, so one builder serves them
all, and nothing in the graph depends on a job's rounds or tenants: ``server-init`` reads the
job from the run form and lists the rounds still to train; a ``ParallelFor`` over that list
with ``parallelism=1`` runs one nested ``fedtune-round`` pipeline per round
(``configure-round`` samples the round's tenants at run time -> ``client-step`` in a
``ParallelFor`` over them -> ``aggregate``); ``close-rounds`` checks and tabulates the rounds;
when the job is complete, ``final-broadcast`` (the provider publishes what tenants may see
of the final model, once), ``evaluate`` per tenant and ``export-and-register``, then, when the
job enables it, ``audit`` per audited tenant (through the launcher, like ``evaluate``) and
``record-audit``. State flows through the job's stores, never through task outputs, so each
round task finds its predecessor's state there. Every task writes to stores, so caching is
off everywhere, sub-DAGs included; tenant steps retry (a retried launcher re-attaches to
its Job).

Order of rounds: KFP backends since 2.2 honour ``parallelism`` (kubeflow/pipelines#10798,
fixing #8718) but do not document the order of iterations, and kfp.local runs them in order.
``configure-round`` therefore trains the first round not yet stored, whatever iteration it
is in, and ``close-rounds`` fails, naming the missing rounds, if a backend ran iterations at
once. Size: the backend keeps a run's nodes in one workflow object (~1.5 MiB in etcd); very
long trainings are split with ``stop_after_round`` and continued with ``resume_run_id``.

With :class:`ClusterSettings` the compiled YAML also carries the Kubernetes settings a
cluster run needs (the chart's tenants ConfigMap for the launcher, the provider's store
credentials Secret, endpoints); without them it is the plain spec ``kfp-local`` runs.

Provider resources: the job's ``provider:`` section (cpu, memory, gpu, node selector,
tolerations, image) is compiled into the :data:`HEAVY_STEPS` -- ``server-init`` (builds the
model and the initial state: FedBiOT's emulator compression, FedPT's and FedMKT's models),
``aggregate`` (aggregation, FedBiOT's emulator alignment, FedPT's and FedMKT's distillation),
``final-broadcast`` (builds the final broadcast with the provider's model: FedBiOT's emulator)
and ``export-and-register`` (loads, merges and writes the final models). The other tasks stay
small: ``configure-round``, ``close-rounds`` and ``record-audit`` move stored state and
records, and the tenant launchers only talk to the Kubernetes API (the tenants' own work runs
in their Jobs, with the tenants' resources). KFP fixes a task's resources and image when the
pipeline is compiled, while the job arrives at run time: so ``fedtune compile J.yaml`` takes
them from J, the compiled ``server-init`` carries the section it was compiled with
(:data:`PROVIDER_ENV`, set only when it is not the default, so a job without one compiles to
the same YAML as before), and a run whose job asks for other provider resources is refused
(:func:`fedtune.pipelines.run_form.check_compiled_provider`) instead of running without them.
"""

# No `from __future__ import annotations`: kfp reads the nested pipeline's annotations as types.
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp import compiler, dsl
from kfp.dsl import Artifact, Input, pipeline_context

from fedtune.config.job import JobConfig, ProviderResources
from fedtune.config.secrets import (
    MLFLOW_SECRET,
    MLFLOW_SECRET_ENV,
    PRESIGNER_ENV,
    PRESIGNER_SECRET,
    PROVIDER_S3_SECRET,
    S3_SECRET_ENV,
)
from fedtune.core.images import TENANT_IMAGE_ENV, Images, tenant_image
from fedtune.engines.launcher_manifest import DEFAULT_TENANTS_FILE, TENANTS_FILE_ENV
from fedtune.pipelines import components as c, secagg_components as sc
from fedtune.pipelines.images import heavy_step_image, retarget_text
from fedtune.pipelines.run_form import FAMILIES, PROVIDER_ENV, pipeline_name, provider_marker

HEAVY_STEPS = ("server-init", "aggregate", "final-broadcast", "export-and-register")
"""The provider tasks that get the job's ``provider:`` resources and image (see above); the
secure-aggregation variant's ``secure-aggregate`` too."""

GPU_RESOURCE = "nvidia.com/gpu"

PIPELINE_DOC = """Federated fine-tuning, {family} family ({algorithms}): any number of rounds and tenants.

Give the job as job_uri (a job file in the provider's bucket) or job_config (JSON), and
override what changes between runs below. Rounds run one after another in a loop whose
length, like each round's sampled tenants, is decided when the run starts. Each run keeps
its state under its own run id, so creating a run again trains again; resume_run_id
continues an earlier run instead. Provider steps run in this namespace; each tenant's
training and evaluation run as a Job in the tenant's own namespace.

Args:
    job_uri: s3:// URI of a job file (YAML) in the provider's bucket; wins over job_config.
    job_config: The fedtune job as JSON (or YAML), validated when the run starts. No credentials: they come from Kubernetes Secrets.
    rounds: Federated rounds in all; 0 keeps the job's.
    clients_per_round: Tenants sampled per round; 0 keeps the job's.
    lr: Client learning rate; 0 keeps the job's.
    local_steps: Local training steps per round; 0 keeps the job's.
    seed: Seed of sampling and training; -1 keeps the job's.
    run_label: A label for this run, the name of its MLflow run (empty: the job's name).
    resume_run_id: Empty: train afresh under this run's id. The id of an earlier run: resume its stored state (finished rounds are kept, nothing is registered twice). "job": state directly under the job's name, as `fedtune run` keeps it.
    stop_after_round: 0 trains to the end; k stops after round k (resume later with resume_run_id), e.g. to split a very long training into runs.
"""

SECURE_DOC = """This is the secure-aggregation variant: every round runs SecAgg+ (key advertisement, share
exchange, masked upload, unmasking), each tenant step as a Job in the tenant's namespace, and
the provider sees only the masked uploads and their sum. It runs jobs that set
secure_aggregation.enabled: true; a job without it runs on the plain pipeline of its family.
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
        images: The CPU and GPU images every task (and the launcher's tenant Jobs, when the
            chart's tenants file names none) runs; see :mod:`fedtune.core.images`.
    """

    tenants_configmap: str = "fedtune-tenants"
    store_secret: str | None = PROVIDER_S3_SECRET
    s3_endpoint: str | None = None
    mlflow_uri: str | None = None
    mlflow_secret: str | None = MLFLOW_SECRET
    presigner_secret: str | None = PRESIGNER_SECRET
    images: Images | None = None


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
        # The default reference; compiling with other images retargets it with the rest.
        task.set_env_variable(TENANT_IMAGE_ENV, tenant_image())
        if settings.presigner_secret:
            kubernetes.use_secret_as_env(
                task, settings.presigner_secret, PRESIGNER_ENV, optional=True
            )
    return task


def _heavy(task: Any, provider: ProviderResources, settings: ClusterSettings | None) -> Any:
    """Give a heavy provider step the job's provider resources, placement and image (in a
    cluster; kfp.local ignores them)."""
    if settings is None:
        return task
    from kfp import kubernetes

    if provider.cpu:
        task.set_cpu_request(provider.cpu).set_cpu_limit(provider.cpu)
    if provider.memory:
        task.set_memory_request(provider.memory).set_memory_limit(provider.memory)
    if provider.gpu:
        task.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(provider.gpu)
    if provider.gpu > 1:
        # Ranks on one node talk through /dev/shm (NCCL), which a pod gets only 64 MiB of by
        # default; a memory-backed emptyDir there counts against the step's memory limit.
        kubernetes.empty_dir_mount(task, "dshm", "/dev/shm", medium="Memory")
    for key, value in sorted(provider.node_selector.items()):
        kubernetes.add_node_selector(task, key, value)
    for toleration in provider.tolerations:
        kubernetes.add_toleration(task, **toleration)
    image = heavy_step_image(provider)
    if image != c.IMAGE:
        task.set_container_image(image)
    return task


def _no_cache(task: Any) -> Any:
    # Every task, sub-DAGs included, writes to stores: a cached task would skip that.
    return task.set_caching_options(False)


_RESERVED_GROUP_IDS = 10
"""More than the outer pipeline's groups (rounds loop, two conditions, two loops)."""


def secure_round_pipeline(
    settings: ClusterSettings | None, provider: ProviderResources | None = None
) -> Any:
    """The nested round pipeline of the secure-aggregation variant: the steps of
    :data:`fedtune.engines.provider.secagg.SECURE_SEQUENCE`, each tenant step a fan-out
    through the launcher over the tenants still in the round, then the secure aggregate."""
    run_key = dsl.PIPELINE_JOB_ID_PLACEHOLDER

    @dsl.pipeline(
        name="fedtune-secure-round",
        description="One federated round under secure aggregation: configure, keys, shares, "
        "masked training, unmasking, aggregate.",
    )
    def secure_round(job: Input[Artifact], state: Input[Artifact], slot: int) -> Artifact:
        # kfp 2.17 numbers groups per pipeline (for-loop-1, condition-2, ...) and the outer
        # pipeline's groups share one table with this round's: its for-loop-3 (evaluate) met
        # this round's for-loop-3 and compiled wrongly. Reserving ids keeps the names apart.
        context = pipeline_context.Pipeline.get_default_pipeline()
        for _ in range(_RESERVED_GROUP_IDS):
            context.get_next_group_id()
        configure = c.configure_round(job=job, state=state, slot=slot)
        _provider(configure, "configure round", settings)
        with dsl.ParallelFor(configure.outputs["Output"]) as tenant:
            advert = sc.secagg_tenant(
                job=job, after=configure.outputs["broadcast"], phase="secagg-advertise",
                tenant=tenant, run_key=run_key,
            )
            _tenant(advert, "advertise keys", settings)
        keys = sc.secagg_provider(
            job=job, previous=configure.outputs["broadcast"],
            markers=dsl.Collected(advert.outputs["marker"]), step="route-keys",
        )
        _provider(keys, "route keys", settings)
        with dsl.ParallelFor(keys.outputs["Output"]) as tenant:
            share = sc.secagg_tenant(
                job=job, after=keys.outputs["log"], phase="secagg-share", tenant=tenant,
                run_key=run_key,
            )
            _tenant(share, "deal shares", settings)
        shares = sc.secagg_provider(
            job=job, previous=keys.outputs["log"],
            markers=dsl.Collected(share.outputs["marker"]), step="route-shares",
        )
        _provider(shares, "route shares", settings)
        with dsl.ParallelFor(shares.outputs["Output"]) as tenant:
            # The round marker here is route-shares' log: training starts once shares are in.
            client = c.client_step(
                job=job, broadcast=shares.outputs["log"], tenant=tenant, run_key=run_key
            )
            _tenant(client, "client step (masked)", settings)
        ask = sc.secagg_provider(
            job=job, previous=shares.outputs["log"],
            markers=dsl.Collected(client.outputs["update"]), step="request-unmask",
        )
        _provider(ask, "request unmasking", settings)
        with dsl.ParallelFor(ask.outputs["Output"]) as tenant:
            answer = sc.secagg_tenant(
                job=job, after=ask.outputs["log"], phase="secagg-unmask", tenant=tenant,
                run_key=run_key,
            )
            _tenant(answer, "answer unmasking", settings)
        merged = sc.secure_aggregate(
            job=job, previous=ask.outputs["log"], markers=dsl.Collected(answer.outputs["marker"])
        )
        _heavy(_provider(merged, "secure aggregate", settings), provider or ProviderResources(), settings)
        return merged.outputs["state"]

    return secure_round


def build_pipeline(
    family: str,
    settings: ClusterSettings | None,
    default_job: JobConfig | None = None,
    provider: ProviderResources | None = None,
    secure: bool = False,
) -> Any:
    """The family's KFP pipeline; ``default_job`` (if any) fills the ``job_config`` default.

    ``provider`` (default: ``default_job``'s section, else none) is what the heavy steps ask
    of the cluster; every run of the pipeline must ask for the same. ``secure`` builds the
    family's secure-aggregation variant (``fedtune-<family>-secure``): the same graph with
    :func:`secure_round_pipeline` as its round.
    """
    if provider is None:
        provider = default_job.provider if default_job is not None else ProviderResources()
    marker = provider_marker(provider)
    # Only what the job file sets: the run form shows its own settings, and a changed
    # default elsewhere in fedtune does not make every committed pipeline stale.
    job_json = (
        json.dumps(default_job.model_dump(mode="json", exclude_unset=True), sort_keys=True)
        if default_job is not None
        else ""
    )

    @dsl.pipeline(
        name="fedtune-round",
        description="One federated round: configure, every sampled tenant trains, aggregate.",
    )
    def round_pipeline(job: Input[Artifact], state: Input[Artifact], slot: int) -> Artifact:
        configure = c.configure_round(job=job, state=state, slot=slot)
        _provider(configure, "configure round", settings)
        with dsl.ParallelFor(configure.outputs["Output"]) as tenant:
            client = c.client_step(
                job=job,
                broadcast=configure.outputs["broadcast"],
                tenant=tenant,
                run_key=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            )
            _tenant(client, "client step", settings)
        merged = c.aggregate(
            job=job,
            broadcast=configure.outputs["broadcast"],
            updates=dsl.Collected(client.outputs["update"]),
        )
        _heavy(_provider(merged, "aggregate", settings), provider, settings)
        return merged.outputs["state"]

    one_round = secure_round_pipeline(settings, provider) if secure else round_pipeline

    def pipeline(
        job_uri: str = "",
        job_config: str = job_json,
        rounds: int = 0,
        clients_per_round: int = 0,
        lr: float = 0.0,
        local_steps: int = 0,
        seed: int = -1,
        run_label: str = "",
        resume_run_id: str = "",
        stop_after_round: int = 0,
    ) -> None:
        init = c.server_init(
            job_uri=job_uri,
            job_config=job_config,
            rounds=rounds,
            clients_per_round=clients_per_round,
            lr=lr,
            local_steps=local_steps,
            seed=seed,
            run_label=run_label,
            resume_run_id=resume_run_id,
            stop_after_round=stop_after_round,
            kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            family=family,
            secure_aggregation=secure,
        )
        _heavy(_provider(init, "server init", settings), provider, settings)
        if marker:
            init.set_env_variable(PROVIDER_ENV, marker)
        job_artifact = init.outputs["job"]
        # One iteration per round still to train, one at a time; each trains the first round
        # not yet stored, so the order holds even where the backend reorders iterations.
        with dsl.ParallelFor(init.outputs["Output"], parallelism=1) as slot:
            step = one_round(job=job_artifact, state=init.outputs["state"], slot=slot)
            _no_cache(step).set_display_name("round")
        closed = c.close_rounds(
            job=job_artifact, init=init.outputs["state"], states=dsl.Collected(step.output)
        )
        _provider(closed, "close rounds", settings)
        with dsl.If(closed.outputs["Output"] == True, "job complete"):  # noqa: E712
            # Provider work, once: the evaluate tasks only read what it published.
            final = c.final_broadcast(job=job_artifact, state=closed.outputs["state"])
            _heavy(_provider(final, "final broadcast", settings), provider, settings)
            with dsl.ParallelFor(closed.outputs["tenants"]) as tenant:
                scored = c.evaluate(
                    job=job_artifact,
                    state=final.outputs["broadcast"],
                    tenant=tenant,
                    run_key=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                )
                _tenant(scored, "evaluate", settings)
            export = c.export_and_register(
                job=job_artifact,
                state=closed.outputs["state"],
                metrics=dsl.Collected(scored.outputs["metrics"]),
            )
            _heavy(_provider(export, "export and register", settings), provider, settings)
            with dsl.If(export.outputs["Output"] == True, "memorization audit"):  # noqa: E712
                with dsl.ParallelFor(export.outputs["audited"]) as tenant:
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

    doc = PIPELINE_DOC.format(family=family, algorithms=", ".join(FAMILIES[family]))
    # Before the Args section, which the KFP UI reads as the run form's help.
    pipeline.__doc__ = doc.replace("\nArgs:", SECURE_DOC + "\nArgs:", 1) if secure else doc
    # The description shown in the KFP UI comes from the docstring, the form's help from Args.
    return dsl.pipeline(name=pipeline_name(family, secure, gpu=provider.gpu > 0))(pipeline)


def compile_pipeline(
    family: str,
    out: str | Path,
    settings: ClusterSettings | None,
    default_job: JobConfig | None = None,
    provider: ProviderResources | None = None,
    secure: bool = False,
) -> Path:
    """Compile the ``family`` pipeline (``secure``: its secure-aggregation variant) to YAML at
    ``out``; return the path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pipeline = build_pipeline(family, settings, default_job, provider, secure)
    compiler.Compiler().compile(pipeline, str(out))
    if settings is not None and settings.images is not None:
        out.write_text(retarget_text(out.read_text("utf-8"), settings.images), "utf-8")
    return out
