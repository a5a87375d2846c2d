"""The federated steps, each reading its inputs from stores and writing its outputs to stores.

Every engine runs these same functions: the local engine in one process, the KFP components
one per pod. A step whose output already exists and verifies is skipped, which is how a run
resumes after a crash; steps are deterministic given the seed, the round and their inputs.
Importing this module imports no torch (a KFP task that only reads records starts in a
fraction of a second); the algorithm a job names is imported when its env is created. The
tenant's steps live in :mod:`fedtune.engines.tenant.steps`, re-exported here.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtune.algorithms.registry import get_algorithm
from fedtune.config.job import JobConfig
from fedtune.core import killpoints
from fedtune.core.errors import FedtuneError, QuorumError, StoreUnavailable
from fedtune.core.messages import Broadcast, ServerState, Update
from fedtune.core.update_meta import check_update_meta
from fedtune.engines import acceptance, layout
from fedtune.engines.participation import check_sample_count, sample_names
from fedtune.engines.publish import (
    publish as _publish,
    stored_size,  # noqa: F401 - re-exported for the engines
)

# The tenant's env and steps live in the tenant package; steps re-exports them for the engines.
from fedtune.engines.tenant.env import (  # noqa: F401 - re-exported for the engines
    TenantEnv as TenantEnv,
    TenantEnvs as TenantEnvs,
    keep_failure_details as keep_failure_details,
)
from fedtune.engines.tenant.steps import (  # noqa: F401 - re-exported for the engines
    client_step as client_step,
    client_step_part as client_step_part,
    evaluate_step as evaluate_step,
    stored_update_result as stored_update_result,
    train_client as train_client,
)
from fedtune.storage.base import Store
from fedtune.training.context import (  # noqa: F401
    ProviderContext,
    TenantData as TenantData,  # re-exported
    derive_seed,
)

if TYPE_CHECKING:
    from fedtune.algorithms.base import Algorithm, Artifact

log = logging.getLogger(__name__)

@dataclass
class ProviderEnv:
    """The provider's side of a job: its algorithm, its context and the job's stores."""

    job: JobConfig
    algorithm: Algorithm[Any]
    ctx: ProviderContext
    stores: layout.JobStores

    @classmethod
    def create(cls, job: JobConfig) -> ProviderEnv:
        """Build the algorithm and provider context a job describes."""
        stores = layout.JobStores(job)
        algorithm = get_algorithm(job.algorithm.name)(job.algorithm)
        return cls(
            job=job,
            algorithm=algorithm,
            ctx=ProviderContext.from_job(job, store=stores.provider()),
            stores=stores,
        )

    def store(self) -> Store:
        """The provider-private store."""
        return self.stores.provider()


def _writes_state() -> bool:
    """Whether this process writes the step's state: rank 0 of a multi-rank provider step, or
    the only process (a process group needs torch.distributed, so without it there is none;
    checked so that light steps need not import torch)."""
    if "torch.distributed" not in sys.modules:
        return True
    from fedtune.training.world import World

    return World.current().writer

def sample_clients(job: JobConfig, round_index: int) -> list[str]:
    """The tenants of ``round_index``: a seeded sample of ``clients_per_round``, sorted."""
    return sample_names([t.name for t in job.tenants], job.sampled_per_round, job.seed, round_index)


def init_step(env: ProviderEnv) -> dict[str, Any]:
    """Provider: write the initial server state (skipped when it exists).

    On several ranks (:mod:`fedtune.engines.provider.ranks`) every rank computes it, rank 0 writes it.
    """
    store = env.store()
    key = layout.state_key(0)
    if ServerState.stored(store, key):
        return {"skipped": True}
    started = time.perf_counter()
    state = env.algorithm.init_state(env.ctx)
    if not _writes_state():
        return {}
    written = state.save(store, key)
    return {"seconds": time.perf_counter() - started, "bytes": written}


def configure_step(env: ProviderEnv, round_index: int) -> dict[str, Any]:
    """Provider: compute round ``round_index``'s broadcast and hand it to each sampled tenant.

    The provider keeps its own record (which aggregation validates updates against) and
    writes a copy into each sampled tenant's exchange prefix; a tenant can read only its own.
    """
    store = env.store()
    key = layout.broadcast_key(round_index)
    out: dict[str, Any]
    if Broadcast.stored(store, key):
        out = {"skipped": True}
    else:
        started = time.perf_counter()
        state = ServerState.load(store, layout.state_key(round_index - 1))
        broadcast = env.algorithm.configure_round(env.ctx, state, round_index)
        broadcast.save(store, key)
        out = {"seconds": time.perf_counter() - started, "raw_bytes": broadcast.nbytes}
    sampled = sample_clients(env.job, round_index)
    # per tenant: every sampled tenant gets one copy (made server-side after the first)
    out["bytes"] = _publish(env, key, sampled, layout.round_broadcast_key(round_index))
    return out


def collect_updates(
    env: ProviderEnv, round_index: int, sampled: list[str], broadcast: Broadcast
) -> tuple[dict[str, Update], dict[str, str]]:
    """Load and validate every sampled tenant's update; return (valid, rejected reasons)."""
    from fedtune.aggregation.validation import check_update_norm, tensors_norm

    valid: dict[str, Update] = {}
    rejected: dict[str, str] = {}
    # On by default, relative to the broadcast (its norm taken once: FedBiOT's holds a model).
    bound = env.job.limits.update_norm_bound(
        tensors_norm(broadcast.tensors), relative=env.job.algorithm.capabilities.summed_update)
    for name in sampled:
        store = env.stores.exchange(name)
        key = layout.update_key(round_index)
        try:
            # Inside the try: a key that leaves the tenant's prefix (a planted symbolic
            # link) is refused by the store, and that rejects this update, not the round.
            if not Update.stored(store, key):
                rejected[name] = "no update was delivered (the client step failed or did not run)"
                continue
            # What the launcher accepted from the tenant's pod, not what its URLs wrote since.
            acceptance.verify_message(env.store(), store, name, key)
            update = Update.load(store, key)
            env.algorithm.check_update(name, update, broadcast, env.job.limits.max_update_bytes)
            if bound is not None:  # a finite outlier (1e30) is rejected, naming the bound
                check_update_norm(name, update.tensors, broadcast.tensors, bound[0], setting=bound[1])
            check_sample_count(name, update.meta.get("num_samples"), env.job.limits.sample_cap(
                next(t for t in env.job.tenants if t.name == name)
            ))
            check_update_meta(name, update.meta)  # numbers under declared keys, no free text
        except FedtuneError as exc:
            rejected[name] = str(exc)
            log.warning("rejected the update of tenant %s: %s", name, exc)
            continue
        valid[name] = update
    return valid, rejected


def aggregate_step(
    env: ProviderEnv, round_index: int, sampled: list[str], extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """Provider: validate the round's updates and write the next state if the quorum holds.

    ``extra`` carries reasons for tenants whose client step failed in this process. Nothing
    is written when the quorum fails, so the stored state stays that of the last good round.
    On several ranks (:mod:`fedtune.engines.provider.ranks`) every rank computes the state, rank 0
    writes it.
    """
    store = env.store()
    key = layout.state_key(round_index)
    if ServerState.stored(store, key):
        return {"skipped": True, **_stored_outcome(env, round_index, sampled)}
    started = time.perf_counter()
    # Validated against the provider's own record, not the tenants' copies.
    broadcast = Broadcast.load(store, layout.broadcast_key(round_index))
    valid, rejected = collect_updates(env, round_index, sampled, broadcast)
    for name, reason in (extra or {}).items():
        if name not in valid:
            rejected[name] = reason
    if len(valid) < env.job.min_clients:
        reasons = "\n".join(f"  {n}: {r}" for n, r in sorted(rejected.items()))
        outage = sorted(n for n, r in rejected.items() if StoreUnavailable.__name__ in r)
        if outage:
            # Not the tenants' fault, and nothing to fix in the job: name the outage.
            raise StoreUnavailable(
                f"round {round_index}: store outage: the steps of {outage} failed because a "
                f"store did not answer (within limits.store_*), leaving {len(valid)} valid "
                f"update(s) of {len(sampled)} sampled, fewer than min_clients="
                f"{env.job.min_clients}; rejected:\n{reasons}",
                fix="Each named tenant's log or errors/ file names the endpoint that did not "
                "answer; once it is back, run again with --resume (finished steps are kept).",
            )
        raise QuorumError(
            f"round {round_index}: {len(valid)} valid update(s) of {len(sampled)} sampled, "
            f"fewer than min_clients={env.job.min_clients}; rejected:\n{reasons}"
        )
    state = ServerState.load(store, layout.state_key(round_index - 1))
    compute_started = time.perf_counter()
    new_state = fold_updates(env, state, valid, round_index)
    compute = time.perf_counter() - compute_started
    if not _writes_state():
        return {}
    new_state.save(store, key)
    killpoints.reached(f"state-saved:{round_index}")
    return {
        "seconds": time.perf_counter() - started,
        "compute_seconds": compute,
        **_outcome(valid, rejected, new_state.meta),
    }


def fold_updates(
    env: ProviderEnv,
    state: ServerState,
    updates: dict[str, Update],
    round_index: int,
    contributors: int | None = None,
) -> ServerState:
    """The algorithm's aggregation, or, with differential privacy, its DP-FedAvg release
    (``contributors``: ``updates`` is one mean of that many uploads, as secure aggregation
    unmasks it)."""
    if env.job.differential_privacy is None:
        return env.algorithm.aggregate(env.ctx, state, updates, round_index)
    from fedtune.engines.privacy_steps import fold

    return fold(env, state, updates, round_index, contributors)


def _outcome(
    valid: dict[str, Update], rejected: dict[str, str], meta: dict[str, Any]
) -> dict[str, Any]:
    """What a round's aggregation reports: who was accepted, the weighted losses, metrics."""
    return {
        "accepted": sorted(valid),
        "rejected": rejected,
        "train_loss": _weighted([(u.meta.get("train_loss"), u.meta["num_samples"]) for u in valid.values()]),
        "eval_loss": _weighted([(u.meta.get("eval_loss"), u.meta["num_samples"]) for u in valid.values()]),
        # Provider-side metrics an algorithm computed in this round (e.g. FedBiOT's alignment).
        "metrics": dict(meta.get("metrics") or {}),
    }


def _stored_outcome(env: ProviderEnv, round_index: int, sampled: list[str]) -> dict[str, Any]:
    """Rebuild an aggregated round's report from its stored updates and state.

    A crash after the state was written but before the round's summary leaves only these;
    validation is deterministic, so the same updates are accepted again.
    """
    store = env.store()
    broadcast = Broadcast.load(store, layout.broadcast_key(round_index))
    valid, rejected = collect_updates(env, round_index, sampled, broadcast)
    return _outcome(valid, rejected, store.get_json(f"{layout.state_key(round_index)}.json"))


def _weighted(pairs: list[tuple[Any, int]]) -> float | None:
    usable = [(float(v), n) for v, n in pairs if isinstance(v, int | float) and math.isfinite(v)]
    total = sum(n for _, n in usable)
    return sum(v * n for v, n in usable) / total if total else None


def final_state(env: ProviderEnv) -> ServerState:
    """The state after the job's last round."""
    return ServerState.load(env.store(), layout.state_key(env.job.rounds))


def publish_final_step(env: ProviderEnv, tenants: list[str]) -> dict[str, Any]:
    """Provider: put what tenants may see of the final model into each of ``tenants``'
    prefixes (one write, the rest copied server-side: :func:`_publish`).

    The algorithm's :meth:`~fedtune.algorithms.base.Algorithm.final_broadcast` decides what
    that is; no tenant ever receives a server state.
    """
    rounds = env.job.rounds
    record = layout.final_broadcast_key(rounds)
    store = env.store()
    if not Broadcast.stored(store, record):
        env.algorithm.final_broadcast(env.ctx, final_state(env)).save(store, record)
    return {"bytes": _publish(env, record, tenants, layout.final_tenant_broadcast_key(rounds))}


def final_broadcast_step(env: ProviderEnv) -> dict[str, Any]:
    """Provider, once after the last round: the final broadcast into every tenant's prefix,
    before any tenant's evaluate step starts (which then only reads it)."""
    started = time.perf_counter()
    names = [t.name for t in env.job.tenants]
    published = publish_final_step(env, names)
    return {"seconds": time.perf_counter() - started, "tenants": sorted(names),
            "bytes": published["bytes"]}


def final_broadcast_published(job: JobConfig, tenant: str) -> bool:
    """Whether the final broadcast is in ``tenant``'s exchange prefix."""
    exchange = layout.JobStores(job).exchange(tenant)
    return Broadcast.stored(exchange, layout.final_tenant_broadcast_key(job.rounds))


def export_step(env: ProviderEnv, out_dir: Path) -> dict[str, tuple[Artifact, str]]:
    """Provider: write the final models locally and copy them to the provider-private store.

    Exports never go to the exchange store. Returns each artifact with its store URI.
    """
    artifacts = env.algorithm.export(env.ctx, final_state(env), out_dir)
    store = env.store()
    out: dict[str, tuple[Artifact, str]] = {}
    for name, artifact in artifacts.items():
        prefix = f"{layout.ARTIFACTS_PREFIX}/{name}"
        for path in sorted(p for p in artifact.path.rglob("*") if p.is_file()):
            store.put_bytes(f"{prefix}/{path.relative_to(artifact.path).as_posix()}", path.read_bytes())
        out[name] = (artifact, f"{store.uri.rstrip('/')}/{prefix}")
    return out
