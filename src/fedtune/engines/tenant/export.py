"""A tenant's own final models (FedMKT's small models): into its own store, never the provider's.

After the last round the tenant's evaluate step asks the algorithm for the models the tenant
keeps (:meth:`~fedtune.algorithms.base.Algorithm.export_kept`), copies them into the tenant's
own store under ``artifacts/<name>/``, and registers those marked so only when the tenant
entry has a ``tracking`` section of its own (its MLflow, ``tenants[].tracking.tracking_uri``):
registered as ``tracking.registered_model``, else ``<job name>-<tenant>-<name>`` (the
provider's registry names are not in the tenant's view).
Without one, the export is files only. Nothing of it goes to the exchange or the provider.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from fedtune.config.job import TrackingConfig
from fedtune.core.messages import Broadcast, ClientState
from fedtune.engines import layout
from fedtune.engines.tenant.env import TenantEnv


def latest_client_state(env: TenantEnv) -> ClientState | None:
    """The tenant's client state of the last round it trained in (None if it never did)."""
    found = layout.latest_round(env.own.list("client-state/"), before=env.job.rounds + 1)
    return None if found is None else ClientState.load(env.own, layout.client_state_key(found))


def finished_state(env: TenantEnv) -> ClientState | None:
    """The tenant's kept state at the end of the last round: its last client state brought
    there by :meth:`~fedtune.algorithms.base.Algorithm.finish_kept` from the final broadcast,
    computed once and kept in its own store (a resumed or later final step reads it back, so
    evaluation, export and audit see the same model). None if the tenant never trained."""
    key = layout.final_client_state_key(env.job.rounds)
    if ClientState.stored(env.own, key):
        return ClientState.load(env.own, key)
    last = latest_client_state(env)
    if last is None:
        return None
    broadcast = Broadcast.load(env.exchange, layout.final_tenant_broadcast_key(env.job.rounds))
    state = env.algorithm.finish_kept(env.ctx, broadcast, env.data(), last)
    state.save(env.own, key)
    return state


def export_kept(env: TenantEnv, state: ClientState) -> dict[str, dict[str, Any]]:
    """Write the tenant's kept models into its own store (and its registry, if it has one)."""
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="fedtune-tenant-export-") as tmp:
        artifacts = env.algorithm.export_kept(env.ctx, state, Path(tmp))
        for name, artifact in artifacts.items():
            prefix = f"{layout.ARTIFACTS_PREFIX}/{name}"
            for path in sorted(p for p in artifact.path.rglob("*") if p.is_file()):
                env.own.put_bytes(f"{prefix}/{path.relative_to(artifact.path).as_posix()}", path.read_bytes())
            entry: dict[str, Any] = {"uri": f"{env.own.uri.rstrip('/')}/{prefix}", "kind": artifact.kind}
            tracking = env.tenant.tracking
            if artifact.register and tracking is not None and tracking.backend == "mlflow":
                entry.update(_register(env, tracking, name, artifact.path, artifact.tags))
            out[name] = entry
    return out


def _register(
    env: TenantEnv, tracking: TrackingConfig, name: str, path: Path, tags: dict[str, str]
) -> dict[str, Any]:
    """Register ``path`` in the tenant's own MLflow (the job's validation requires its URI)."""
    from fedtune.tracking.mlflow_tracker import MlflowTracker

    registered = tracking.registered_model or f"{env.job.job_name}-{env.tenant.name}-{name}"
    tracker = MlflowTracker(
        tracking.tracking_uri,
        tracking.experiment,
        timeout_s=env.job.limits.tracking_timeout_s,
        max_retries=env.job.limits.tracking_max_retries,
    )
    tracker.start(run_name=f"{env.job.job_name}-{env.tenant.name}", params={}, tags={"fedtune.tenant": env.tenant.name})
    try:
        ref = tracker.log_model(path, name=name, registered_name=registered, alias=tracking.alias, tags=tags)
    except BaseException:
        tracker.end("FAILED")
        raise
    tracker.end("FINISHED")
    return {"registered_name": ref.registered_name, "registered_version": ref.version, "model_uri": ref.model_uri}
