"""The eight KFP components: thin typed specs whose bodies call ``fedtune.entrypoints``.

Each takes the one job artifact written by ``server-init`` (never loose hyperparameters) and
passes small JSON markers as artifacts: artifacts, unlike parameters, resolve correctly inside
``ParallelFor`` bodies under ``kfp.local``. Server state itself flows through the job's stores
by URI; markers only order the tasks and carry what each step did (bytes, seconds, metrics).
Every component runs in the CPU image of this package version, which already contains kfp,
so nothing is installed at run time.

Component folders under ``components/<name>/`` hold each one's compiled YAML, metadata,
README and tests; ``python -m fedtune.pipelines.catalog --write`` regenerates them.
"""

# No `from __future__ import annotations` here: kfp reads the parameter annotations as types.
from kfp import dsl
from kfp.dsl import Artifact, Input, Output

from fedtune.pipelines.images import provider_image

IMAGE = provider_image()


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def server_init(job_config: str, plan: str, job: Output[Artifact], state: Output[Artifact]) -> None:
    """Validate the job, start or resume tracking, and write the initial server state.

    Args:
        job_config: The job config (fedtune JobConfig) as JSON.
        plan: The shape the pipeline was compiled for (rounds, sampled tenants); the job must fit.
        job: The validated job, read by every later task.
        state: Marker of the initial server state (stored in the exchange store).
    """
    from fedtune.entrypoints.server_init import component

    component(job_config, plan, job.path, state.path)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def configure_round(
    job: Input[Artifact], state: Input[Artifact], round_index: int, broadcast: Output[Artifact]
) -> None:
    """Provider: write the round's broadcast from the previous server state.

    Args:
        job: The validated job from server-init.
        state: Marker of the previous round's server state (orders the tasks).
        round_index: The round, from 1.
        broadcast: Marker of the stored broadcast (bytes, seconds).
    """
    from fedtune.entrypoints.configure_round import component

    component(job.path, round_index, broadcast.path)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def client_step(
    job: Input[Artifact],
    broadcast: Input[Artifact],
    round_index: int,
    tenant: str,
    run_key: str,
    update: Output[Artifact],
) -> None:
    """Tenant: train on its own data; in a cluster, as a Job in the tenant's namespace.

    Args:
        job: The validated job from server-init.
        broadcast: Marker of the round's broadcast (orders the tasks).
        round_index: The round, from 1.
        tenant: The tenant's name.
        run_key: The pipeline run's id: names the tenant Job, so a retry re-attaches to it.
        update: Marker of the stored update, or of the failure that cost it.
    """
    from fedtune.entrypoints.client_step import component

    component(job.path, round_index, tenant, run_key, update.path)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def aggregate(
    job: Input[Artifact],
    broadcast: Input[Artifact],
    updates: Input[list[Artifact]],
    round_index: int,
    state: Output[Artifact],
) -> None:
    """Provider: validate the round's updates, aggregate them if the quorum holds, record it.

    Args:
        job: The validated job from server-init.
        broadcast: Marker of the round's broadcast (carries its start time and size).
        updates: Markers of every sampled tenant's client step.
        round_index: The round, from 1.
        state: Marker of the new server state.
    """
    from fedtune.entrypoints.aggregate import component

    component(job.path, round_index, broadcast.path, [u.path for u in updates], state.path)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluate(
    job: Input[Artifact],
    state: Input[Artifact],
    tenant: str,
    run_key: str,
    metrics: Output[Artifact],
) -> None:
    """Tenant: metrics of the final model on its held-out split (launched like client-step).

    Args:
        job: The validated job from server-init.
        state: Marker of the final server state (orders the tasks).
        tenant: The tenant's name.
        run_key: The pipeline run's id: names the tenant Job, so a retry re-attaches to it.
        metrics: The tenant's final metrics.
    """
    from fedtune.entrypoints.evaluate import component

    component(job.path, tenant, run_key, metrics.path)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def export_and_register(
    job: Input[Artifact],
    state: Input[Artifact],
    metrics: Input[list[Artifact]],
    artifacts: Output[Artifact],
) -> None:
    """Provider: store the final evaluation, export the final models and register them.

    Args:
        job: The validated job from server-init.
        state: Marker of the final server state (orders the tasks).
        metrics: Every tenant's final metrics.
        artifacts: The exported artifacts' store URIs and registered model versions.
    """
    from fedtune.entrypoints.export_and_register import component

    component(job.path, [m.path for m in metrics], artifacts.path)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def audit(
    job: Input[Artifact],
    registered: Input[Artifact],
    tenant: str,
    run_key: str,
    scores: Output[Artifact],
) -> None:
    """Tenant: memorization audit of the final model on its own records (launched like evaluate).

    Args:
        job: The validated job from server-init.
        registered: Marker of export-and-register (orders the tasks).
        tenant: The tenant's name.
        run_key: The pipeline run's id: names the tenant Job, so a retry re-attaches to it.
        scores: The tenant's audit scores (numbers only).
    """
    from fedtune.entrypoints.audit import component

    component(job.path, tenant, run_key, scores.path)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def record_audit(
    job: Input[Artifact], scores: Input[list[Artifact]], audit: Output[Artifact]
) -> None:
    """Provider: pool the tenants' audit scores, tag the registered versions, log them.

    Args:
        job: The validated job from server-init.
        scores: Every audited tenant's scores marker (orders the task).
        audit: The pooled audit and the versions tagged.
    """
    from fedtune.entrypoints.record_audit import component

    component(job.path, [s.path for s in scores], audit.path)


COMPONENTS = {
    "server_init": server_init,
    "configure_round": configure_round,
    "client_step": client_step,
    "aggregate": aggregate,
    "evaluate": evaluate,
    "export_and_register": export_and_register,
    "audit": audit,
    "record_audit": record_audit,
}
"""Every component by the name of its folder under ``components/``."""
