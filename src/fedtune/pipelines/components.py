"""The ten KFP components: thin typed specs whose bodies call ``fedtune.entrypoints``.

Each takes the one job artifact written by ``server-init`` (never loose hyperparameters) and
passes small JSON markers as artifacts: artifacts, unlike parameters, resolve correctly inside
``ParallelFor`` bodies under ``kfp.local``. Server state itself flows through the job's stores
by URI; markers only order the tasks and carry what each step did (bytes, seconds, metrics).
Every component runs in the CPU image of this package version, which already contains kfp,
so nothing is installed at run time; the builder moves the heavy provider steps of a job
with ``provider.gpu > 0`` to the GPU image of the same version (which contains kfp too).

Typed outputs make the run page useful: per-round and final ``Metrics``, the round table as
``Markdown``, the exported models as ``Model`` with their registry metadata. kfp.local resolves a
``ParallelFor``'s items at the top level and a ``dsl.If``'s condition only from a task output
named ``Output``, so that name carries the rounds, the sampled tenants, and the flags "job
complete" and "audit on"; loops inside a condition read named outputs fine.

Component folders under ``components/<name>/`` hold each one's compiled YAML, metadata,
README and tests; ``python -m fedtune.pipelines.catalog --write`` regenerates them.
"""

# No `from __future__ import annotations` here: kfp reads the parameter annotations as types.
from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Artifact, Input, Markdown, Metrics, Model, Output

from fedtune.core.images import provider_image

IMAGE = provider_image()


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def server_init(
    job_uri: str,
    job_config: str,
    rounds: int,
    clients_per_round: int,
    lr: float,
    local_steps: int,
    seed: int,
    run_label: str,
    resume_run_id: str,
    stop_after_round: int,
    kfp_run_id: str,
    family: str,
    secure_aggregation: bool,
    job: Output[Artifact],
    state: Output[Artifact],
) -> list:
    """Read the job from the run form, scope its state to the run, start or resume tracking,
    write the initial server state, and list the rounds still to train.

    Args:
        job_uri: s3:// URI of a job file in the provider's bucket (wins over job_config).
        job_config: The job as JSON or YAML text.
        rounds: Rounds to train in all (0: the job's).
        clients_per_round: Tenants sampled per round (0: the job's).
        lr: Client learning rate (0: the job's).
        local_steps: Local steps per round (0: the job's).
        seed: Seed of sampling and training (-1: the job's).
        run_label: A label for the tracker run.
        resume_run_id: Empty: a new training under kfp_run_id; else the run whose state to resume.
        stop_after_round: 0: train to the end; k: stop after round k (resume it later).
        kfp_run_id: This pipeline run's id.
        family: The algorithm family this pipeline was compiled for.
        secure_aggregation: Whether it is the family's secure-aggregation variant.
        job: The validated, run-scoped job, read by every later task.
        state: Marker of the initial server state (stored in the provider store).
    """
    from fedtune.entrypoints.server_init import RunForm, component

    form = RunForm(
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
        kfp_run_id=kfp_run_id,
    )
    return component(form, family, job.path, state.path, secure_aggregation)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def configure_round(
    job: Input[Artifact], state: Input[Artifact], slot: int, broadcast: Output[Artifact]
) -> list:
    """Provider: pick the first round not yet trained, write its broadcast, sample its tenants.

    Args:
        job: The validated job from server-init.
        state: Marker of the initial server state (orders the tasks).
        slot: The loop's round number; the round trained is the first one not stored yet, so
            the rounds stay in order whatever order the loop runs its iterations in.
        broadcast: Marker of the stored broadcast (round, bytes, seconds).
    """
    from fedtune.entrypoints.configure_round import component

    return component(job.path, slot, broadcast.path)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def client_step(
    job: Input[Artifact],
    broadcast: Input[Artifact],
    tenant: str,
    run_key: str,
    update: Output[Artifact],
) -> None:
    """Tenant: train on its own data; in a cluster, as a Job in the tenant's namespace.

    Args:
        job: The validated job from server-init.
        broadcast: Marker of the round's broadcast (says which round).
        tenant: The tenant's name.
        run_key: The pipeline run's id: names the tenant Job, so a retry re-attaches to it.
        update: Marker of the stored update, or of the failure that cost it.
    """
    from fedtune.entrypoints.client_step import component

    component(job.path, broadcast.path, tenant, run_key, update.path)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def aggregate(
    job: Input[Artifact],
    broadcast: Input[Artifact],
    updates: Input[list[Artifact]],
    state: Output[Artifact],
    metrics: Output[Metrics],
) -> None:
    """Provider: validate the round's updates, aggregate them if the quorum holds, record it.

    Args:
        job: The validated job from server-init.
        broadcast: Marker of the round's broadcast (its round, start time and size).
        updates: Markers of every sampled tenant's client step.
        state: Marker of the new server state.
        metrics: The round's metrics (clients accepted, losses, bytes, server metrics).
    """
    from fedtune.entrypoints.aggregate import component

    component(job.path, broadcast.path, [u.path for u in updates], state.path, metrics)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def close_rounds(
    job: Input[Artifact],
    init: Input[Artifact],
    states: Input[list[Artifact]],
    state: Output[Artifact],
    rounds_table: Output[Markdown],
    metrics: Output[Metrics],
) -> NamedTuple("Outputs", [("Output", bool), ("tenants", list)]):  # noqa: F821
    """Provider: check every round of the run is stored, tabulate them, say what comes next.

    Returns ``Output`` (whether the job is complete: evaluation and export follow) and
    ``tenants`` (the tenants the final evaluation covers).

    Args:
        job: The validated job from server-init.
        init: Server init's marker (lists the rounds of this run).
        states: Markers of every round of this run (orders the task).
        state: Marker of the last stored server state.
        rounds_table: The rounds as a Markdown table (sampled, accepted, losses, seconds).
        metrics: The last round's metrics and the rounds completed.
    """
    from fedtune.entrypoints.close_rounds import component

    outputs = NamedTuple("Outputs", [("Output", bool), ("tenants", list)])
    return outputs(*component(job.path, init.path, state.path, rounds_table.path, metrics))


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def final_broadcast(
    job: Input[Artifact],
    state: Input[Artifact],
    broadcast: Output[Artifact],
) -> None:
    """Provider: publish the final broadcast to every tenant, once, before their evaluate tasks.

    Args:
        job: The validated job from server-init.
        state: Marker of the final server state (orders the task).
        broadcast: Marker of the published final broadcast (orders the evaluate tasks).
    """
    from fedtune.entrypoints.final_broadcast import component

    component(job.path, state.path, broadcast.path)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluate(
    job: Input[Artifact],
    state: Input[Artifact],
    tenant: str,
    run_key: str,
    metrics: Output[Metrics],
) -> None:
    """Tenant: metrics of the final model on its held-out split (launched like client-step);
    it only reads the final broadcast that final-broadcast published.

    Args:
        job: The validated job from server-init.
        state: Marker of the published final broadcast (orders the tasks).
        tenant: The tenant's name.
        run_key: The pipeline run's id: names the tenant Job, so a retry re-attaches to it.
        metrics: The tenant's final metrics.
    """
    from fedtune.entrypoints.evaluate import component

    component(job.path, tenant, run_key, metrics.path, metrics)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def export_and_register(
    job: Input[Artifact],
    state: Input[Artifact],
    metrics: Input[list[Metrics]],
    model: Output[Model],
    companion: Output[Model],
    final_metrics: Output[Metrics],
    artifacts: Output[Artifact],
) -> NamedTuple("Outputs", [("Output", bool), ("audited", list)]):  # noqa: F821
    """Provider: store the final evaluation, export the final models and register them once.

    Returns ``Output`` (whether the job audits memorization) and ``audited`` (its tenants).

    Args:
        job: The validated job from server-init.
        state: Marker of the final server state (orders the tasks).
        metrics: Every tenant's final metrics.
        model: The run's main model (registered name, version, MLflow run id, layout, URI).
        companion: The family's second model where it exports one (FedBiOT's AdapFu beside
            AdapEmu, FedPT's small model beside the proxy-tuned one); else marked not exported.
        final_metrics: Every tenant's final metrics, as one table.
        artifacts: The exported artifacts' store URIs and registered model versions.
    """
    from fedtune.entrypoints.export_and_register import component

    outputs = NamedTuple("Outputs", [("Output", bool), ("audited", list)])
    return outputs(
        *component(
            job.path, [m.path for m in metrics], artifacts.path, model, companion, final_metrics
        )
    )


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
    "close_rounds": close_rounds,
    "final_broadcast": final_broadcast,
    "evaluate": evaluate,
    "export_and_register": export_and_register,
    "audit": audit,
    "record_audit": record_audit,
}
"""Every component by the name of its folder under ``components/``."""
