"""The three extra KFP components of a secure-aggregation round: thin specs over
:mod:`fedtune.entrypoints.secagg_round`.

``secagg-tenant`` runs one tenant step of the round (key advertisement, share dealing,
unmasking answer) through the tenant launcher, like ``client-step``; ``secagg-provider``
routes keys or shares or asks for unmasking, and lists (as ``Output``) the tenants of the next
tenant step; ``secure-aggregate`` unmasks the sum and records the round. Like the other
components they pass only small JSON markers, as artifacts (see
:mod:`fedtune.pipelines.components`).
"""

# No `from __future__ import annotations` here: kfp reads the parameter annotations as types.
from kfp import dsl
from kfp.dsl import Artifact, Input, Metrics, Output

from fedtune.core.images import provider_image

IMAGE = provider_image()


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def secagg_tenant(
    job: Input[Artifact],
    after: Input[Artifact],
    phase: str,
    tenant: str,
    run_key: str,
    marker: Output[Artifact],
) -> None:
    """Tenant: one secure-aggregation step; in a cluster, as a Job in the tenant's namespace.

    Args:
        job: The validated job from server-init.
        after: Marker of the provider step this one follows (says which round).
        phase: secagg-advertise, secagg-share or secagg-unmask.
        tenant: The tenant's name.
        run_key: The pipeline run's id: names the tenant Job, so a retry re-attaches to it.
        marker: What the step wrote (bytes, seconds), or the failure that cost it.
    """
    from fedtune.entrypoints.secagg_round import tenant_component

    tenant_component(phase, job.path, after.path, tenant, run_key, marker.path)  # type: ignore[arg-type]


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def secagg_provider(
    job: Input[Artifact],
    previous: Input[Artifact],
    markers: Input[list[Artifact]],
    step: str,
    log: Output[Artifact],
) -> list:
    """Provider: route keys, route shares or request unmasking; list the next step's tenants.

    Args:
        job: The validated job from server-init.
        previous: Marker of the round's previous provider step (configure-round's first).
        markers: Markers of the tenant step just run.
        step: route-keys, route-shares or request-unmask.
        log: The round's log so far (who dropped out and why, the protocol's bytes).
    """
    from fedtune.entrypoints.secagg_round import provider_component

    return provider_component(step, job.path, previous.path, [m.path for m in markers], log.path)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def secure_aggregate(
    job: Input[Artifact],
    previous: Input[Artifact],
    markers: Input[list[Artifact]],
    state: Output[Artifact],
    metrics: Output[Metrics],
) -> None:
    """Provider: unmask the round's sum, check it, fold it, record the round.

    Args:
        job: The validated job from server-init.
        previous: Marker of request-unmask (carries the round's log).
        markers: Every unmasking answer's marker.
        state: Marker of the new server state.
        metrics: The round's metrics (secure-aggregation bytes and seconds included).
    """
    from fedtune.entrypoints.secagg_round import aggregate_component

    aggregate_component(job.path, previous.path, [m.path for m in markers], state.path, metrics)


SECAGG_COMPONENTS = {
    "secagg_tenant": secagg_tenant,
    "secagg_provider": secagg_provider,
    "secure_aggregate": secure_aggregate,
}
"""The secure round's components by the name of their folder under ``components/``."""
