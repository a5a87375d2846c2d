"""The federated steps, each reading its inputs from stores and writing its outputs to stores.

Every engine runs these same functions: the local engine in one process, the KFP components
one per pod. A step whose output already exists and verifies is skipped, which is how a run
resumes after a crash; steps are deterministic given the seed, the round and their inputs.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedtune.aggregation import validate_update
from fedtune.algorithms.base import Algorithm, Artifact
from fedtune.config.job import JobConfig, TenantConfig
from fedtune.core.errors import FedtuneError, QuorumError, UpdateRejected
from fedtune.core.messages import Broadcast, ClientState, ServerState, Update
from fedtune.core.registry import get_algorithm
from fedtune.data.loader import read_examples
from fedtune.engines import layout
from fedtune.training.context import Context, TenantData, derive_seed, split_examples

log = logging.getLogger(__name__)

#: Artifact tag marking a model that must not leave the provider (never copied to the
#: exchange store, which tenants read).
PROVIDER_ONLY_TAG = "provider_only"


@dataclass
class StepEnv:
    """Everything a step needs: the job, its algorithm, phase context and stores."""

    job: JobConfig
    algorithm: Algorithm[Any]
    ctx: Context
    stores: layout.JobStores
    _data: dict[str, TenantData] = field(default_factory=dict, repr=False)

    @classmethod
    def create(cls, job: JobConfig) -> StepEnv:
        """Build the algorithm and context a job describes."""
        algorithm = get_algorithm(job.algorithm.name)(job.algorithm)
        return cls(job=job, algorithm=algorithm, ctx=Context.from_job(job), stores=layout.JobStores(job))

    def tenant(self, name: str) -> TenantConfig:
        """The named tenant's settings."""
        for tenant in self.job.tenants:
            if tenant.name == name:
                return tenant
        raise FedtuneError(f"no tenant named {name!r} in job {self.job.name!r}")

    def tenant_data(self, name: str) -> TenantData:
        """The tenant's examples, read from its own data URI and split (cached)."""
        if name not in self._data:
            tenant = self.tenant(name)
            fmt = None if tenant.data_format == "auto" else tenant.data_format
            examples = read_examples(tenant.data_uri, fmt)
            self._data[name] = split_examples(
                examples, self.job.training.eval_fraction, self.job.seed, name
            )
        return self._data[name]


def sample_clients(job: JobConfig, round_index: int) -> list[str]:
    """The tenants of ``round_index``: a seeded sample of ``clients_per_round``, sorted."""
    names = sorted(t.name for t in job.tenants)
    k = job.sampled_per_round
    if k >= len(names):
        return names
    rng = random.Random(derive_seed(job.seed, "sample", round_index))
    return sorted(rng.sample(names, k))


def init_step(env: StepEnv) -> dict[str, Any]:
    """Provider: write the initial server state (skipped when it exists)."""
    store = env.stores.exchange()
    key = layout.state_key(0)
    if ServerState.stored(store, key):
        return {"skipped": True}
    started = time.perf_counter()
    state = env.algorithm.init_state(env.ctx)
    written = state.save(store, key)
    return {"seconds": time.perf_counter() - started, "bytes": written}


def configure_step(env: StepEnv, round_index: int) -> dict[str, Any]:
    """Provider: write round ``round_index``'s broadcast from the previous state."""
    store = env.stores.exchange()
    key = layout.broadcast_key(round_index)
    if Broadcast.stored(store, key):
        return {"skipped": True, "bytes": _stored_size(store, key)}
    started = time.perf_counter()
    state = ServerState.load(store, layout.state_key(round_index - 1))
    broadcast = env.algorithm.configure_round(env.ctx, state, round_index)
    written = broadcast.save(store, key)
    return {"seconds": time.perf_counter() - started, "bytes": written, "raw_bytes": broadcast.nbytes}


def client_step(env: StepEnv, round_index: int, tenant_name: str) -> dict[str, Any]:
    """Tenant: train on its own data; update to the exchange store, state to its own store."""
    exchange = env.stores.exchange()
    key = layout.update_key(round_index, tenant_name)
    if Update.stored(exchange, key):
        meta = exchange.get_json(f"{key}.json")
        return {"skipped": True, "bytes": _stored_size(exchange, key), "meta": meta}
    started = time.perf_counter()
    tenant = env.tenant(tenant_name)
    own = env.stores.tenant(tenant)
    broadcast = Broadcast.load(exchange, layout.broadcast_key(round_index))
    previous = layout.latest_round(own.list("client-state/"), before=round_index)
    client_state = (
        ClientState.load(own, layout.client_state_key(previous)) if previous is not None else None
    )
    update, new_state = env.algorithm.client_step(
        env.ctx, broadcast, env.tenant_data(tenant_name), client_state
    )
    # Kept state is versioned by round, so re-running a round after a crash reads the same
    # input state and rewrites the same output: the step stays idempotent.
    if new_state is not None:
        new_state.save(own, layout.client_state_key(round_index))
        _prune_client_states(own, keep_from=previous if previous is not None else round_index)
    written = update.save(exchange, key)
    return {
        "seconds": time.perf_counter() - started,
        "bytes": written,
        "raw_bytes": update.nbytes,
        "meta": update.meta,
    }


def _prune_client_states(store: Any, keep_from: int) -> None:
    """Drop kept states older than the one this round read (a re-run of it still needs that)."""
    for key in store.list("client-state/"):
        found = layout.latest_round([key], before=keep_from)
        if found is not None:
            store.delete(key)


def collect_updates(
    env: StepEnv, round_index: int, sampled: list[str], broadcast: Broadcast
) -> tuple[dict[str, Update], dict[str, str]]:
    """Load and validate every sampled tenant's update; return (valid, rejected reasons)."""
    store = env.stores.exchange()
    expected = env.algorithm.expected_update_shapes(broadcast)
    valid: dict[str, Update] = {}
    rejected: dict[str, str] = {}
    for name in sampled:
        key = layout.update_key(round_index, name)
        if not Update.stored(store, key):
            rejected[name] = "no update was delivered (the client step failed or did not run)"
            continue
        try:
            update = Update.load(store, key)
            validate_update(name, update.tensors, expected, env.job.limits.max_update_bytes)
            _check_sample_count(name, update.meta.get("num_samples"))
        except FedtuneError as exc:
            rejected[name] = str(exc)
            log.warning("rejected the update of tenant %s: %s", name, exc)
            continue
        valid[name] = update
    return valid, rejected


def _check_sample_count(tenant: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UpdateRejected(f"tenant {tenant!r}: num_samples must be a positive integer, got {value!r}")


def aggregate_step(
    env: StepEnv, round_index: int, sampled: list[str], extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """Provider: validate the round's updates and write the next state if the quorum holds.

    ``extra`` carries reasons for tenants whose client step failed in this process. Nothing
    is written when the quorum fails, so the stored state stays that of the last good round.
    """
    store = env.stores.exchange()
    key = layout.state_key(round_index)
    if ServerState.stored(store, key):
        return {"skipped": True}
    started = time.perf_counter()
    broadcast = Broadcast.load(store, layout.broadcast_key(round_index))
    valid, rejected = collect_updates(env, round_index, sampled, broadcast)
    for name, reason in (extra or {}).items():
        if name not in valid:
            rejected[name] = reason
    if len(valid) < env.job.min_clients:
        reasons = "\n".join(f"  {n}: {r}" for n, r in sorted(rejected.items()))
        raise QuorumError(
            f"round {round_index}: {len(valid)} valid update(s) of {len(sampled)} sampled, "
            f"fewer than min_clients={env.job.min_clients}; rejected:\n{reasons}"
        )
    state = ServerState.load(store, layout.state_key(round_index - 1))
    compute_started = time.perf_counter()
    new_state = env.algorithm.aggregate(env.ctx, state, valid, round_index)
    compute = time.perf_counter() - compute_started
    new_state.save(store, key)
    return {
        "seconds": time.perf_counter() - started,
        "compute_seconds": compute,
        "accepted": sorted(valid),
        "rejected": rejected,
        "train_loss": _weighted([(u.meta.get("train_loss"), u.meta["num_samples"]) for u in valid.values()]),
        "eval_loss": _weighted([(u.meta.get("eval_loss"), u.meta["num_samples"]) for u in valid.values()]),
        # Provider-side metrics an algorithm computed in this round (e.g. FedBiOT's alignment).
        "metrics": dict(new_state.meta.get("metrics") or {}),
    }


def _weighted(pairs: list[tuple[Any, int]]) -> float | None:
    usable = [(float(v), n) for v, n in pairs if isinstance(v, int | float) and math.isfinite(v)]
    total = sum(n for _, n in usable)
    return sum(v * n for v, n in usable) / total if total else None


def final_state(env: StepEnv) -> ServerState:
    """The state after the job's last round."""
    return ServerState.load(env.stores.exchange(), layout.state_key(env.job.rounds))


def evaluate_step(env: StepEnv, tenant_name: str) -> dict[str, float]:
    """Tenant: metrics of the final model on its held-out split."""
    state = final_state(env)
    broadcast = Broadcast(tensors=state.tensors, meta={"round": env.job.rounds + 1})
    return env.algorithm.evaluate(env.ctx, broadcast, env.tenant_data(tenant_name))


def export_step(env: StepEnv, out_dir: Path) -> dict[str, tuple[Artifact, str]]:
    """Provider: write the final models locally and copy them to the exchange store.

    Artifacts tagged ``provider_only: "true"`` are not copied (their URI is the local path).
    Returns each artifact with the store URI of its copy.
    """
    artifacts = env.algorithm.export(env.ctx, final_state(env), out_dir)
    store = env.stores.exchange()
    out: dict[str, tuple[Artifact, str]] = {}
    for name, artifact in artifacts.items():
        if artifact.tags.get(PROVIDER_ONLY_TAG) == "true":
            # The provider's own weights (e.g. FedBiOT's AdapFu holds E*): tenants can read
            # the exchange store, so this stays in the provider's work directory and registry.
            out[name] = (artifact, artifact.path.resolve().as_uri())
            continue
        prefix = f"artifacts/{name}"
        for path in sorted(p for p in artifact.path.rglob("*") if p.is_file()):
            store.put_bytes(f"{prefix}/{path.relative_to(artifact.path).as_posix()}", path.read_bytes())
        out[name] = (artifact, f"{store.uri.rstrip('/')}/{prefix}")
    return out


def _stored_size(store: Any, key: str) -> int:
    return len(store.get_bytes(f"{key}.safetensors")) + len(store.get_bytes(f"{key}.json"))
