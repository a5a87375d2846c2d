"""The provider's steps of a secure-aggregation round (see :mod:`fedtune.engines.tenant.secagg`
for the whole round): route keys and shares, ask for unmasking, unmask the sum and fold it.

The provider routes messages it cannot read or forge: advertisements and share messages are
signed by their tenants (checked here too, so a bad one is named early), shares are sealed to
their recipients, and the graph is derived from the job by every party alike.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fedtune.aggregation import validate_update
from fedtune.aggregation.validation import check_update_bound
from fedtune.algorithms.base import SUM_NAME, SecureSum
from fedtune.config.tenant_view import secure_aggregation_facts
from fedtune.core.errors import (
    FedtuneError,
    QuorumError,
    SecureAggregationError,
    StoreError,
    StoreUnavailable,
    UpdateRejected,
)
from fedtune.core.messages import Broadcast, ServerState, Update
from fedtune.core.update_meta import check_update_meta
from fedtune.engines import acceptance, layout
from fedtune.engines.steps import ProviderEnv, _weighted, fold_updates
from fedtune.engines.tenant.secagg import MASKED, expected_roster, json_size, registered_identities
from fedtune.secagg import fixedpoint, identity, protocol as p, vector


def _read_each(env: ProviderEnv, names: list[str], key: str) -> tuple[dict[str, Any], dict[str, str]]:
    found: dict[str, Any] = {}
    missing: dict[str, str] = {}
    for name in names:
        store = env.stores.exchange(name)
        if not store.exists(key):
            missing[name] = f"no {key.rsplit('/', 1)[-1]} was delivered"
            continue
        try:
            acceptance.verify(env.store(), store, name, key)  # as the launcher accepted it
            found[name] = store.get_json(key)
        except FedtuneError as exc:
            missing[name] = str(exc)
    return found, missing


def _too_few(what: str, got: list[str], threshold: int, missing: dict[str, str], round_index: int) -> SecureAggregationError:
    reasons = "; ".join(f"{n}: {r}" for n, r in sorted(missing.items()))
    return SecureAggregationError(
        f"round {round_index}: {len(got)} {what} {got}, fewer than secure_aggregation.threshold="
        f"{threshold}; missing: {reasons}",
        fix="Fix the named tenants and re-run with --resume, or lower secure_aggregation.threshold "
        "(it must stay above half of each neighbourhood).",
    )


def route_keys_step(
    env: ProviderEnv, round_index: int, sampled: list[str], failed: dict[str, str] | None = None
) -> dict[str, Any]:
    """Provider: gather the signed adverts (dropping any that fail their signature, named);
    hand the roster to every advertiser."""
    started = time.perf_counter()
    facts = secure_aggregation_facts(env.job)
    expected = expected_roster(env.job.name, env.job.seed, facts, round_index)
    t = expected["threshold"]
    raw, missing = _read_each(env, sampled, layout.secagg_key(round_index, "advert"))
    registered = registered_identities(facts)
    ads: dict[str, p.Advertisement] = {}
    for name, data in raw.items():
        try:
            ad = p.Advertisement.from_json(data)
        except (KeyError, TypeError, ValueError) as exc:
            missing[name] = f"its key advertisement cannot be read ({exc!r})"
            continue
        public = registered.get(name) or ad.identity
        if ad.tenant != name or not identity.verify(public, "advert", ad.signed_part(expected["context"]), ad.signature):
            missing[name] = "its key advertisement fails its signature check against its identity key"
            continue
        ads[name] = ad
    if len(ads) < t:
        raise _too_few("key advertisement(s)", sorted(ads), t, {**missing, **(failed or {})}, round_index)
    roster = p.Roster(
        expected["context"], t, ads, expected["sampled"], expected["degree"], expected["graph_seed"]
    ).to_json()
    for name in ads:
        env.stores.exchange(name).put_json(layout.secagg_key(round_index, "roster"), roster)
    _, unregistered = p.identities_of(p.Roster.from_json(roster), registered)
    return {
        "seconds": time.perf_counter() - started,
        "bytes": json_size(roster) * len(ads),
        "missing": missing,
        "unregistered": unregistered,
    }


def route_shares_step(
    env: ProviderEnv, round_index: int, sampled: list[str], failed: dict[str, str] | None = None
) -> dict[str, Any]:
    """Provider: hand each sharer the signed, sealed shares addressed to it (and the sharers)."""
    started = time.perf_counter()
    roster = _roster(env, round_index, sampled)
    dealt, missing = _dealt(env, round_index, roster)
    if len(dealt) < roster.threshold:
        raise _too_few("share deal(s)", sorted(dealt), roster.threshold, {**missing, **(failed or {})}, round_index)
    sharers = sorted(dealt)
    written = 0
    for v in sharers:
        inbox = {
            "sharers": sharers,
            "dealt": {u: d.part(v).to_json() for u, d in dealt.items() if v in d.sealed and v in d.commitments},
        }
        env.stores.exchange(v).put_json(layout.secagg_key(round_index, "inbox"), inbox)
        written += json_size(inbox)
    return {"seconds": time.perf_counter() - started, "bytes": written, "missing": missing}


def _roster(env: ProviderEnv, round_index: int, sampled: list[str]) -> p.Roster:
    for name in sampled:
        store = env.stores.exchange(name)
        key = layout.secagg_key(round_index, "roster")
        if store.exists(key):
            return p.Roster.from_json(store.get_json(key))
    raise SecureAggregationError(
        f"round {round_index}: no roster was routed to any of {sampled}",
        fix="Run the round's key routing first (re-run the round with --resume).",
    )


def _dealt(env: ProviderEnv, round_index: int, roster: p.Roster) -> tuple[dict[str, p.Dealt], dict[str, str]]:
    raw, missing = _read_each(env, roster.names, layout.secagg_key(round_index, "dealt"))
    dealt: dict[str, p.Dealt] = {}
    for name, data in raw.items():
        try:
            item = p.Dealt.from_json(data)
        except (KeyError, TypeError, ValueError) as exc:
            missing[name] = f"its share deal cannot be read ({exc!r})"
            continue
        if item.dealer != name or sorted(item.sealed) != roster.neighbourhood(name):
            missing[name] = f"its share deal is not addressed to its neighbourhood {roster.neighbourhood(name)}"
            continue
        dealt[name] = item
    return dealt, missing


def _delivered(env: ProviderEnv, name: str, round_index: int) -> tuple[Update | None, str]:
    """A tenant's masked update if it was delivered with metadata of the schema, else None
    and why: an update with bad metadata counts as dropped, so its mask is recovered from
    the shares like any dropout's (it cannot leave the sum once unmasking began)."""
    exchange = env.stores.exchange(name)
    key = layout.update_key(round_index)
    try:
        if not Update.stored(exchange, key):
            return None, "dropped after sharing keys: no masked update was delivered"
    except StoreUnavailable:
        raise
    except StoreError as exc:  # a key the store refuses (a link out of the tenant's prefix)
        return None, f"dropped after sharing keys: its masked update is refused: {exc}"
    # A masked upload changed after acceptance would spoil the unmasked sum: refused.
    acceptance.verify_message(env.store(), exchange, name, key)
    try:
        update = Update.load(exchange, key)
    except StoreUnavailable:
        raise
    except StoreError as exc:  # not safetensors, a failed checksum: it cannot enter the sum
        return None, f"dropped after sharing keys: its masked update cannot be read: {exc}"
    try:
        check_update_meta(name, update.meta)
    except UpdateRejected as exc:
        return None, str(exc)
    return update, ""


def request_unmask_step(env: ProviderEnv, round_index: int, sampled: list[str]) -> dict[str, Any]:
    """Provider: tell every uploader who uploaded (U3) and who shared (U2)."""
    started = time.perf_counter()
    roster = _roster(env, round_index, sampled)
    dealt, _ = _dealt(env, round_index, roster)
    survivors = [n for n in sorted(dealt) if _delivered(env, n, round_index)[0] is not None]
    request = {"sharers": sorted(dealt), "survivors": survivors}
    for name in survivors:
        env.stores.exchange(name).put_json(layout.secagg_key(round_index, "unmask-request"), request)
    return {"seconds": time.perf_counter() - started, "bytes": json_size(request) * len(survivors)}


def aggregate_step(
    env: ProviderEnv, round_index: int, sampled: list[str], extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """Provider: unmask the sum, check it, and fold the mean into the next state."""
    store = env.store()
    key = layout.state_key(round_index)
    if ServerState.stored(store, key):
        return {"skipped": True}
    started = time.perf_counter()
    roster = _roster(env, round_index, sampled)
    dealt, rejected = _dealt(env, round_index, roster)
    rejected.update({n: "not in the round's roster (no valid key advertisement)" for n in sampled if n not in roster.ads})
    updates: dict[str, Update] = {}
    refused: set[str] = set()  # delivered, but its metadata is not of the schema
    for name in sorted(dealt):
        update, reason = _delivered(env, name, round_index)
        if update is not None:
            updates[name] = update
        else:
            rejected[name] = reason
            if "update rejected" in reason:
                refused.add(name)
    for name, reason in (extra or {}).items():
        if name not in updates and name not in refused:  # a refused tenant was not asked to unmask
            rejected[name] = reason
    if len(updates) < env.job.min_clients:
        raise QuorumError(
            f"round {round_index}: {len(updates)} masked update(s) of {len(sampled)} sampled, fewer "
            f"than min_clients={env.job.min_clients}; rejected: {json.dumps(rejected, sort_keys=True)}"
        )
    answers, missing = _read_each(env, sorted(updates), layout.secagg_key(round_index, "unmask"))
    rejected.update({n: f"no unmasking answer ({r})" for n, r in missing.items()})
    broadcast = Broadcast.load(store, layout.broadcast_key(round_index))
    specs = env.algorithm.expected_update_shapes(broadcast)
    compute_started = time.perf_counter()
    masked = {n: u.tensors[MASKED].numpy().view(np.uint64) for n, u in updates.items() if MASKED in u.tensors}
    result = p.unmask(roster, dealt, masked, answers)
    total_weight = sum(float(updates[n].meta["secagg"]["weight"]) for n in masked)
    mean = fixedpoint.decode(result.total, env.job.secure_aggregation.frac_bits) / total_weight
    mean_tensors = vector.unflatten(mean, specs)
    # The one check left to the provider: the unmasked mean (keys, shapes, finite, size).
    validate_update(SUM_NAME, mean_tensors, specs, env.job.limits.max_update_bytes)
    check_update_bound(SUM_NAME, mean_tensors, broadcast.tensors, env.job.limits)
    summed = SecureSum(mean_tensors, total_weight, {n: dict(updates[n].meta) for n in masked})
    state = ServerState.load(store, layout.state_key(round_index - 1))
    if env.job.differential_privacy is None:
        new_state = env.algorithm.aggregate_sum(env.ctx, state, summed, round_index)
    else:  # DP-FedAvg's release (uniform weights) from the unmasked mean of len(masked) uploads
        single = Update(tensors=dict(mean_tensors), meta={"num_samples": max(int(round(total_weight)), 1)})
        new_state = fold_updates(env, state, {SUM_NAME: single}, round_index, contributors=len(masked))
    compute = time.perf_counter() - compute_started
    new_state.save(store, key)
    metas = [u.meta for u in updates.values()]
    return {
        "seconds": time.perf_counter() - started,
        "compute_seconds": compute,
        "accepted": sorted(masked),
        "rejected": rejected,
        "train_loss": _weighted([(m.get("train_loss"), m["num_samples"]) for m in metas]),
        "eval_loss": _weighted([(m.get("eval_loss"), m["num_samples"]) for m in metas]),
        "metrics": {**dict(new_state.meta.get("metrics") or {}), "secagg/rejected_shares": len(result.rejected_shares)},
        "secagg": {"rejected_shares": result.rejected_shares, "offenders": result.offenders},
    }


# -- one round, as every engine sequences it -----------------------------------------------
SECURE_SEQUENCE: tuple[tuple[str, str], ...] = (
    ("tenant", "secagg-advertise"),
    ("provider", "route-keys"),
    ("tenant", "secagg-share"),
    ("provider", "route-shares"),
    ("tenant", "client"),
    ("provider", "request-unmask"),
    ("tenant", "secagg-unmask"),
)
"""The round's steps in order, before the provider's aggregation; each tenant step runs for
the tenants whose previous tenant step succeeded (:meth:`RoundLog.tenants`)."""

PROVIDER_STEPS: dict[str, Callable[..., dict[str, Any]]] = {
    "route-keys": route_keys_step,
    "route-shares": route_shares_step,
    "request-unmask": request_unmask_step,
}


class RoundLog:
    """What a secure round's steps did so far: who failed where, the protocol's bytes and
    seconds. The local engine fills it as its runner returns; a pipeline's aggregate step
    replays the tasks' markers into it in :data:`SECURE_SEQUENCE` order, so both report alike."""

    def __init__(self) -> None:
        self.failed: dict[str, str] = {}
        self.extra_bytes = 0
        self.extra_seconds = 0.0
        self.routed: dict[str, Any] = {}
        self.clients: dict[str, dict[str, Any]] = {}

    def to_json(self) -> dict[str, Any]:
        """The log as JSON (a pipeline passes it from task to task)."""
        return {
            "failed": self.failed,
            "extra_bytes": self.extra_bytes,
            "extra_seconds": self.extra_seconds,
            "routed": self.routed,
            "clients": self.clients,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RoundLog:
        """The log :meth:`to_json` wrote (an empty one from ``{}``)."""
        log = cls()
        log.failed = dict(data.get("failed") or {})
        log.extra_bytes = int(data.get("extra_bytes", 0))
        log.extra_seconds = float(data.get("extra_seconds", 0.0))
        log.routed = dict(data.get("routed") or {})
        log.clients = {n: dict(r) for n, r in (data.get("clients") or {}).items()}
        return log

    def tenants(self, kind: str, ok: dict[str, dict[str, Any]], failures: dict[str, str]) -> list[str]:
        """Record a tenant step's outcomes; return who goes on to the next one (sorted)."""
        self.failed.update({n: f"{kind}: {why}" for n, why in failures.items()})
        if kind == "client":
            self.clients = {n: dict(r) for n, r in ok.items()}
        else:
            self.extra_bytes += sum(int(r.get("bytes", 0)) for r in ok.values())
            self.extra_seconds += sum(float(r.get("seconds", 0.0)) for r in ok.values())
        return sorted(ok)

    def provider(self, step: str, out: dict[str, Any]) -> None:
        """Record a provider step's result (its ``missing`` tenants keep their first reason)."""
        self.extra_bytes += int(out.get("bytes", 0))
        self.extra_seconds += float(out.get("seconds", 0.0))
        self.failed.update({n: r for n, r in out.get("missing", {}).items() if n not in self.failed})
        if step == "route-keys":
            self.routed = out

    def run_provider(self, env: ProviderEnv, round_index: int, sampled: list[str], step: str) -> dict[str, Any]:
        """Run one provider step of the round and record it."""
        args = () if step == "request-unmask" else (dict(self.failed),)
        out = PROVIDER_STEPS[step](env, round_index, sampled, *args)
        self.provider(step, out)
        return out

    def finish(self, env: ProviderEnv, round_index: int, sampled: list[str]) -> dict[str, Any]:
        """Unmask and fold the round; the aggregate's metrics carry the protocol's costs, and
        tenants whose shares were set aside are named in their client results' notes
        (:attr:`clients`)."""
        clients = self.clients
        aggregate = aggregate_step(env, round_index, sampled, extra=self.failed)
        for name, lines in aggregate.get("secagg", {}).get("offenders", {}).items():
            if name in clients:  # named in the round's summary, beside the tenant
                notes = clients[name].setdefault("provider_notes", [])
                notes += [f"secure aggregation set aside: {x}" for x in lines]
        aggregate["metrics"] = {
            **aggregate.get("metrics", {}),
            "secagg/protocol_bytes": self.extra_bytes,
            "secagg/protocol_seconds": self.extra_seconds,
            "secagg/masked_update_bytes": sum(int(r.get("bytes", 0)) for r in clients.values()),
            "secagg/plain_update_bytes": sum(int(r.get("raw_bytes") or 0) for r in clients.values()),
            "secagg/mask_seconds": sum(float(r.get("mask_seconds", 0.0)) for r in clients.values()),
            "secagg/unmask_seconds": float(aggregate.get("compute_seconds", 0.0)),
            "secagg/unregistered_identities": len(self.routed.get("unregistered", [])),
        }
        return aggregate


def run_round(
    env: ProviderEnv,
    runner: Any,
    round_index: int,
    sampled: list[str],
    done: Callable[[Any], None],
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Every step of a secure round in order; returns (client results, aggregate result).

    A tenant that fails a step drops out of the later ones; the threshold decides whether
    the round completes. The aggregate's metrics carry the protocol's bytes and seconds.
    """
    from fedtune.engines.workers import Task

    log = RoundLog()
    names = list(sampled)
    for side, step in SECURE_SEQUENCE:
        if side == "provider":
            log.run_provider(env, round_index, sampled, step)
            continue
        callback: Callable[[Any], None] = done if step == "client" else (lambda _: None)
        outcomes = runner.run([Task(step, round_index, n) for n in names], callback)  # type: ignore[arg-type]  # a tenant step's kind
        ok = {n: dict(o.result) for n, o in outcomes.items() if o.result is not None}
        names = log.tenants(step, ok, {n: str(o.failure) for n, o in outcomes.items() if o.result is None})
    aggregate = log.finish(env, round_index, sampled)
    return log.clients, aggregate
