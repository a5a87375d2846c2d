"""Secure aggregation mapped onto the step functions (off unless ``secure_aggregation.enabled``).

One round, with every message in the exchange store (``layout.secagg_key``) so that every
engine runs it alike:

======================  ========  ================================================
step                    side      reads -> writes
======================  ========  ================================================
advertise               tenant    -> ``advert`` (public keys; private ones stay in its store)
route_keys              provider  adverts -> ``roster`` in each advertiser's prefix
share                   tenant    roster -> ``dealt`` (sealed Shamir shares + commitments)
route_shares            provider  dealt -> ``inbox`` (its own sealed shares) per sharer
client                  tenant    broadcast, inbox -> masked ``update`` (checked before masking)
request_unmask          provider  masked updates -> ``unmask-request`` (uploaders, sharers)
unmask                  tenant    request -> ``unmask`` (seed or key shares, never both)
aggregate               provider  everything -> the sum, checked, folded by the algorithm
======================  ========  ================================================

The per-update checks the provider can no longer make (keys, shapes, NaN/Inf, size, sample
cap, fixed-point range) run on the tenant before it masks; the provider checks the unmasked
mean the same way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedtune.aggregation import validate_update
from fedtune.core.errors import ConfigError, FedtuneError, QuorumError, SecureAggregationError
from fedtune.core.messages import Broadcast, ServerState, Update, prefixed
from fedtune.engines import layout
from fedtune.engines.steps import (
    ProviderEnv,
    TenantEnv,
    _check_sample_count,
    _weighted,
    fold_updates,
    train_client,
)
from fedtune.secagg import fixedpoint, vector
from fedtune.secagg import protocol as p

MASKED = "secagg/masked"
SUM_NAME = "secure-sum"


def refuse_pipeline(job: Any) -> None:
    """Refuse a job with secure aggregation on where its steps are not wired in (pipelines).

    Raises:
        ConfigError: ``secure_aggregation.enabled`` for a compiled pipeline (kfp-local, cluster).
    """
    if job.secure_aggregation.enabled:
        raise ConfigError(
            f"job {job.name!r} sets secure_aggregation.enabled: true, which the compiled "
            "pipelines (kfp-local and the cluster) do not run yet",
            fix="Run it with the local engine (`fedtune run --engine local`), or set "
            "secure_aggregation.enabled: false.",
        )


def _context(job_name: str, round_index: int) -> str:
    return f"fedtune-secagg|{job_name}|{layout.round_tag(round_index)}"


def _json_size(data: Any) -> int:
    return len(json.dumps(data, sort_keys=True).encode())


# -- tenant side -------------------------------------------------------------------------------
def _kept(env: TenantEnv, round_index: int) -> dict[str, Any]:
    key = layout.secagg_secrets_key(round_index)
    if not env.own.exists(key):
        raise SecureAggregationError(
            f"tenant {env.tenant.name!r} has no secure-aggregation keys for round {round_index} "
            f"in its store ({key})",
            fix="Re-run the round from its key advertisement (delete the round's secagg/ messages).",
        )
    return dict(env.own.get_json(key))


def advertise_step(env: TenantEnv, round_index: int) -> dict[str, Any]:
    """Tenant: fresh key pairs for the round; publish the public halves."""
    key = layout.secagg_key(round_index, "advert")
    if env.exchange.exists(key):
        return {"skipped": True}
    started = time.perf_counter()
    secrets_ = p.TenantSecrets.new()
    env.own.put_json(layout.secagg_secrets_key(round_index), {"secrets": secrets_.to_json()})
    ad = secrets_.advertisement(env.tenant.name).to_json()
    env.exchange.put_json(key, ad)
    return {"seconds": time.perf_counter() - started, "bytes": _json_size(ad)}


def share_step(env: TenantEnv, round_index: int) -> dict[str, Any]:
    """Tenant: check the routed roster, then deal sealed shares of its seed and mask key."""
    key = layout.secagg_key(round_index, "dealt")
    if env.exchange.exists(key):
        return {"skipped": True}
    started = time.perf_counter()
    kept = _kept(env, round_index)
    roster = p.Roster.from_json(env.exchange.get_json(layout.secagg_key(round_index, "roster")))
    _check_context(roster, env.job.name, round_index)
    secrets_, dealt = p.deal(env.tenant.name, p.TenantSecrets.from_json(kept["secrets"]), roster)
    env.own.put_json(layout.secagg_secrets_key(round_index), {**kept, "secrets": secrets_.to_json()})
    out = dealt.to_json()
    env.exchange.put_json(key, out)
    return {"seconds": time.perf_counter() - started, "bytes": _json_size(out)}


def _check_context(roster: p.Roster, job_name: str, round_index: int) -> None:
    expected = _context(job_name, round_index)
    if roster.context != expected:
        raise SecureAggregationError(
            f"the routed roster is for {roster.context!r}, expected {expected!r}",
            fix="Re-run the round's key routing; a roster of another job or round must not be reused.",
        )


def client_step(env: TenantEnv, round_index: int) -> dict[str, Any]:
    """Tenant: train, check the update here (the provider cannot), mask it and upload."""
    key = layout.update_key(round_index)
    if Update.stored(env.exchange, key):
        return {"skipped": True, "meta": env.exchange.get_json(f"{key}.json")}
    started = time.perf_counter()
    name = env.tenant.name
    roster = p.Roster.from_json(env.exchange.get_json(layout.secagg_key(round_index, "roster")))
    inbox = env.exchange.get_json(layout.secagg_key(round_index, "inbox"))
    kept = _kept(env, round_index)
    secrets_ = p.TenantSecrets.from_json(kept["secrets"])
    dealt = {u: p.Dealt.from_json(d) for u, d in inbox["dealt"].items()}
    held, problems = p.open_shares(name, secrets_, roster, dealt)
    env.own.put_json(
        layout.secagg_secrets_key(round_index),
        {**kept, "held": {u: {k: f"{v:x}" for k, v in pair.items()} for u, pair in held.items()}},
    )
    update = train_client(env, round_index)
    mask_started = time.perf_counter()
    broadcast = Broadcast.load(env.exchange, layout.round_broadcast_key(round_index))
    # The checks aggregation would make, made where the update is still visible.
    env.algorithm.check_update(name, update, broadcast, env.job.limits.max_update_bytes)
    _check_sample_count(name, update.meta.get("num_samples"), env.job.limits.sample_cap(env.tenant))
    specs = env.algorithm.expected_update_shapes(broadcast)
    weight = _weight(env.job, int(update.meta["num_samples"]))
    encoded = fixedpoint.encode(
        vector.flatten(update.tensors, specs) * weight,
        env.job.secure_aggregation.frac_bits,
        len(roster.ads),
    )
    masked = p.mask(name, secrets_, roster, inbox["sharers"], encoded)
    meta = {**update.meta, "secagg": {"weight": weight, "unopened": sorted(problems)}}
    out = Update(tensors={MASKED: torch.from_numpy(masked.view(np.int64).copy())}, meta=meta)
    written = out.save(env.exchange, key)
    return {
        "seconds": time.perf_counter() - started,
        "bytes": written,
        "raw_bytes": update.nbytes,
        "mask_seconds": time.perf_counter() - mask_started,
        "meta": meta,
    }


def _weight(job: Any, num_samples: int) -> float:
    mode = getattr(job.algorithm, "aggregation_weights", "samples")
    return float(num_samples) if mode == "samples" else 1.0


def unmask_step(env: TenantEnv, round_index: int) -> dict[str, Any]:
    """Tenant: answer the round's one unmasking request (seed or key share per dealer)."""
    key = layout.secagg_key(round_index, "unmask")
    if env.exchange.exists(key):
        return {"skipped": True}
    started = time.perf_counter()
    request = env.exchange.get_json(layout.secagg_key(round_index, "unmask-request"))
    kept = _kept(env, round_index)
    held = {u: {k: int(v, 16) for k, v in pair.items()} for u, pair in kept.get("held", {}).items()}
    roster = p.Roster.from_json(env.exchange.get_json(layout.secagg_key(round_index, "roster")))
    answer = p.respond(
        env.tenant.name, held, request["sharers"], request["survivors"], roster.threshold, kept.get("answer")
    )
    env.own.put_json(layout.secagg_secrets_key(round_index), {**kept, "answer": answer})
    env.exchange.put_json(key, answer)
    return {"seconds": time.perf_counter() - started, "bytes": _json_size(answer)}


TENANT_STEPS: dict[str, Callable[[TenantEnv, int], dict[str, Any]]] = {
    "secagg-advertise": advertise_step,
    "secagg-share": share_step,
    "client": client_step,
    "secagg-unmask": unmask_step,
}


# -- provider side -----------------------------------------------------------------------------
def _read_each(env: ProviderEnv, names: list[str], key: str) -> tuple[dict[str, Any], dict[str, str]]:
    found: dict[str, Any] = {}
    missing: dict[str, str] = {}
    for name in names:
        store = env.stores.exchange(name)
        if not store.exists(key):
            missing[name] = f"no {key.rsplit('/', 1)[-1]} was delivered"
            continue
        try:
            found[name] = store.get_json(key)
        except FedtuneError as exc:
            missing[name] = str(exc)
    return found, missing


def _threshold(env: ProviderEnv, sampled: list[str]) -> int:
    return env.job.secure_aggregation.threshold_for(len(sampled))


def _too_few(what: str, got: list[str], threshold: int, missing: dict[str, str], round_index: int) -> SecureAggregationError:
    reasons = "; ".join(f"{n}: {r}" for n, r in sorted(missing.items()))
    return SecureAggregationError(
        f"round {round_index}: {len(got)} {what} {got}, fewer than secure_aggregation.threshold="
        f"{threshold}; missing: {reasons}",
        fix="Fix the named tenants and re-run with --resume, or lower secure_aggregation.threshold "
        "(it must stay above half the sampled tenants).",
    )


def route_keys_step(env: ProviderEnv, round_index: int, sampled: list[str]) -> dict[str, Any]:
    """Provider: gather the adverts; hand the roster to every advertiser."""
    started = time.perf_counter()
    t = _threshold(env, sampled)
    ads, missing = _read_each(env, sampled, layout.secagg_key(round_index, "advert"))
    if len(ads) < t:
        raise _too_few("key advertisement(s)", sorted(ads), t, missing, round_index)
    roster = p.Roster(
        _context(env.job.name, round_index), t, {n: p.Advertisement.from_json(a) for n, a in ads.items()}
    ).to_json()
    for name in ads:
        env.stores.exchange(name).put_json(layout.secagg_key(round_index, "roster"), roster)
    return {"seconds": time.perf_counter() - started, "bytes": _json_size(roster) * len(ads), "missing": missing}


def route_shares_step(env: ProviderEnv, round_index: int, sampled: list[str]) -> dict[str, Any]:
    """Provider: hand each sharer the sealed shares addressed to it (and the sharer list)."""
    started = time.perf_counter()
    roster = _roster(env, round_index, sampled)
    dealt, missing = _dealt(env, round_index, roster)
    if len(dealt) < roster.threshold:
        raise _too_few("share deal(s)", sorted(dealt), roster.threshold, missing, round_index)
    sharers = sorted(dealt)
    written = 0
    for v in sharers:
        inbox = {
            "sharers": sharers,
            "dealt": {
                u: p.Dealt(u, {v: d.sealed[v]}, {v: d.commitments[v]}, d.seed_hash).to_json()
                for u, d in dealt.items()
                if v in d.sealed and v in d.commitments
            },
        }
        env.stores.exchange(v).put_json(layout.secagg_key(round_index, "inbox"), inbox)
        written += _json_size(inbox)
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
        if item.dealer != name or sorted(item.sealed) != roster.names:
            missing[name] = f"its share deal is not addressed to the roster {roster.names}"
            continue
        dealt[name] = item
    return dealt, missing


def request_unmask_step(env: ProviderEnv, round_index: int, sampled: list[str]) -> dict[str, Any]:
    """Provider: tell every uploader who uploaded (U3) and who shared (U2)."""
    started = time.perf_counter()
    roster = _roster(env, round_index, sampled)
    dealt, _ = _dealt(env, round_index, roster)
    survivors = [n for n in sorted(dealt) if Update.stored(env.stores.exchange(n), layout.update_key(round_index))]
    request = {"sharers": sorted(dealt), "survivors": survivors}
    for name in survivors:
        env.stores.exchange(name).put_json(layout.secagg_key(round_index, "unmask-request"), request)
    return {"seconds": time.perf_counter() - started, "bytes": _json_size(request) * len(survivors)}


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
    rejected.update({n: "not in the round's roster (no key advertisement)" for n in sampled if n not in roster.ads})
    updates: dict[str, Update] = {}
    for name in sorted(dealt):
        exchange = env.stores.exchange(name)
        if Update.stored(exchange, layout.update_key(round_index)):
            updates[name] = Update.load(exchange, layout.update_key(round_index))
        else:
            rejected[name] = "dropped after sharing keys: no masked update was delivered"
    for name, reason in (extra or {}).items():
        if name not in updates:
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
    validate_update(SUM_NAME, mean_tensors, specs, env.job.limits.max_update_bytes)
    summed = Update(tensors=mean_tensors, meta={"num_samples": int(total_weight)})
    state = ServerState.load(store, layout.state_key(round_index - 1))
    new_state = fold_updates(env, state, {SUM_NAME: summed}, round_index, contributors=len(masked))
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
        "secagg": {"rejected_shares": result.rejected_shares},
    }



# -- one round in an engine that runs tenant tasks through a runner ---------------------------
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

    failed: dict[str, str] = {}
    extra_bytes = 0
    extra_seconds = 0.0

    def tenants(kind: str, names: list[str], callback: Callable[[Any], None]) -> dict[str, dict[str, Any]]:
        nonlocal extra_bytes, extra_seconds
        outcomes = runner.run([Task(kind, round_index, n) for n in names], callback)  # type: ignore[arg-type]
        failed.update({n: f"{kind}: {o.failure}" for n, o in outcomes.items() if o.result is None})
        ok = {n: dict(o.result) for n, o in outcomes.items() if o.result is not None}
        if kind != "client":
            extra_bytes += sum(int(r.get("bytes", 0)) for r in ok.values())
            extra_seconds += sum(float(r.get("seconds", 0.0)) for r in ok.values())
        return ok

    def provider(step: Callable[..., dict[str, Any]]) -> None:
        nonlocal extra_bytes, extra_seconds
        out = step(env, round_index, sampled)
        extra_bytes += int(out.get("bytes", 0))
        extra_seconds += float(out.get("seconds", 0.0))

    quiet: Callable[[Any], None] = lambda _: None
    advertised = tenants("secagg-advertise", sampled, quiet)
    provider(route_keys_step)
    shared = tenants("secagg-share", sorted(advertised), quiet)
    provider(route_shares_step)
    clients = tenants("client", sorted(shared), done)
    provider(request_unmask_step)
    tenants("secagg-unmask", sorted(clients), quiet)
    aggregate = aggregate_step(env, round_index, sampled, extra=failed)
    masked_bytes = sum(int(r.get("bytes", 0)) for r in clients.values())
    plain_bytes = sum(int(r.get("raw_bytes") or 0) for r in clients.values())
    aggregate["metrics"] = {
        **aggregate.get("metrics", {}),
        "secagg/protocol_bytes": extra_bytes,
        "secagg/protocol_seconds": extra_seconds,
        "secagg/masked_update_bytes": masked_bytes,
        "secagg/plain_update_bytes": plain_bytes,
        "secagg/mask_seconds": sum(float(r.get("mask_seconds", 0.0)) for r in clients.values()),
        "secagg/unmask_seconds": float(aggregate.get("compute_seconds", 0.0)),
    }
    return clients, aggregate
