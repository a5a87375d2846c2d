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

import hashlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedtune.aggregation.validation import check_update_bound
from fedtune.config.tenant_view import TenantSecureAggregation
from fedtune.core.errors import ConfigError, SecureAggregationError
from fedtune.core.messages import Broadcast, Update
from fedtune.engines import layout
from fedtune.engines.participation import check_sample_count, sample_names
from fedtune.engines.tenant.env import TenantEnv
from fedtune.engines.tenant.steps import stored_update_result, train_client
from fedtune.secagg import fixedpoint, identity, protocol as p, vector

log = logging.getLogger(__name__)
MASKED = "secagg/masked"


def context(job_name: str, round_index: int) -> str:
    """The string every key, share and signature of one round is bound to."""
    return f"fedtune-secagg|{job_name}|{layout.round_tag(round_index)}"


def expected_roster(
    job_name: str, seed: int, facts: TenantSecureAggregation, round_index: int
) -> dict[str, Any]:
    """What every party derives alone from the job: the round's context, sampled tenants,
    threshold, graph degree and graph seed (the provider cannot choose them)."""
    sampled = sample_names(facts.names, facts.clients_per_round, seed, round_index)
    sa = facts.settings
    k = sa.degree_for(len(sampled))
    graph = hashlib.sha256(f"fedtune-secagg-graph|{job_name}|{seed}|{round_index}".encode()).hexdigest()
    return {
        "context": context(job_name, round_index),
        "sampled": tuple(sampled),
        "threshold": sa.threshold_for(len(sampled)),
        "degree": None if k >= len(sampled) - 1 else k,
        "graph_seed": graph,
    }


def registered_identities(facts: TenantSecureAggregation) -> dict[str, bytes | None]:
    """Each tenant's identity key as the job registers it (None: not registered)."""
    return {name: bytes.fromhex(key) if key else None for name, key in facts.identities.items()}


def _facts(env: TenantEnv) -> TenantSecureAggregation:
    facts = env.job.secure_aggregation
    if facts is None:
        raise ConfigError(
            f"tenant {env.tenant.name!r}: a secure-aggregation step, but the job does not "
            "enable secure_aggregation",
            fix="Launcher and tenant image must be the same fedtune version.",
        )
    return facts


def json_size(data: Any) -> int:
    """Bytes of a JSON message as stored."""
    return len(json.dumps(data, sort_keys=True).encode())


# -- tenant side -------------------------------------------------------------------------------
def signing_key(env: TenantEnv) -> bytes:
    """The tenant's private identity key from its own store (made there if none is registered).

    Raises:
        SecureAggregationError: The job registers a key for the tenant and its store holds
            none, or one that does not match.
    """
    name = env.tenant.name
    registered = env.tenant.identity_key
    if env.own.exists(identity.STORE_KEY):
        private = bytes.fromhex(env.own.get_json(identity.STORE_KEY)["private"])
    elif registered is None:
        private, _ = identity.generate()
        env.own.put_json(identity.STORE_KEY, {"private": private.hex()})
    else:
        raise SecureAggregationError(
            f"tenant {name!r} has a registered identity key but none in its store ({identity.STORE_KEY})",
            fix=f"Create the key in the tenant's store with `fedtune identity JOB --tenant {name}` and "
            "register the public key it prints as tenants[].identity_key.",
        )
    if registered is not None and identity.public_of(private).hex() != registered:
        raise SecureAggregationError(
            f"tenant {name!r}'s identity key in its store does not match its registered identity_key",
            fix=f"Register the key `fedtune identity JOB --tenant {name}` prints as tenants[].identity_key.",
        )
    return private


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
    """Tenant: fresh key pairs for the round; publish the public halves, signed."""
    key = layout.secagg_key(round_index, "advert")
    if env.exchange.exists(key):
        return {"skipped": True}
    started = time.perf_counter()
    secrets_ = p.TenantSecrets.new()
    env.own.put_json(layout.secagg_secrets_key(round_index), {"secrets": secrets_.to_json()})
    ad = secrets_.advertisement(env.tenant.name, context(env.job.job_name, round_index), signing_key(env)).to_json()
    env.exchange.put_json(key, ad)
    return {"seconds": time.perf_counter() - started, "bytes": json_size(ad)}


def _roster(env: TenantEnv, round_index: int) -> tuple[p.Roster, dict[str, bytes]]:
    """The routed roster, checked against what the tenant derives from the job itself, and
    the identity key of each advertiser."""
    roster = p.Roster.from_json(env.exchange.get_json(layout.secagg_key(round_index, "roster")))
    expected = expected_roster(env.job.job_name, env.job.seed, _facts(env), round_index)
    got = {
        "context": roster.context,
        "sampled": roster.sampled,
        "threshold": roster.threshold,
        "degree": roster.degree,
        "graph_seed": roster.graph_seed,
    }
    wrong = {k: (got[k], v) for k, v in expected.items() if got[k] != v}
    strangers = sorted(set(roster.ads) - set(expected["sampled"]))
    if wrong or strangers:
        raise SecureAggregationError(
            f"tenant {env.tenant.name!r} refuses the routed roster of round {round_index}: "
            + "; ".join(f"{k} is {g!r}, the job says {e!r}" for k, (g, e) in sorted(wrong.items()))
            + (f"; advertisements of tenants not sampled: {strangers}" if strangers else ""),
            fix="The provider must route the round's roster as the job defines it; re-run the round.",
        )
    keys_, _ = p.identities_of(roster, registered_identities(_facts(env)))
    return roster, keys_


def share_step(env: TenantEnv, round_index: int) -> dict[str, Any]:
    """Tenant: check the routed roster, then deal signed, sealed shares of its seed and mask key."""
    key = layout.secagg_key(round_index, "dealt")
    if env.exchange.exists(key):
        return {"skipped": True}
    started = time.perf_counter()
    kept = _kept(env, round_index)
    roster, keys_ = _roster(env, round_index)
    secrets_, dealt = p.deal(
        env.tenant.name, p.TenantSecrets.from_json(kept["secrets"]), roster, keys_, signing_key(env)
    )
    env.own.put_json(layout.secagg_secrets_key(round_index), {**kept, "secrets": secrets_.to_json()})
    out = dealt.to_json()
    env.exchange.put_json(key, out)
    return {"seconds": time.perf_counter() - started, "bytes": json_size(out)}


def prepare_update(env: TenantEnv, update: Update, broadcast: Broadcast, parties: int) -> tuple[np.ndarray, float]:
    """Tenant: the checks aggregation would make, made where the update is still visible, then
    the weighted update as one fixed-point vector (what gets masked) and its weight.

    The provider sees only the masked sum, so a tenant refuses to upload an update that fails
    them (keys, shapes, NaN/Inf, size, L2 norm of change, sample cap, fixed-point range). A transform of the
    update before masking (e.g. clipping and noise) belongs here, after the checks.

    Raises:
        UpdateRejected: The update fails a check (named, with the tenant).
        SecureAggregationError: A weighted value does not fit the fixed-point range.
    """
    name = env.tenant.name
    env.algorithm.check_update(name, update, broadcast, env.job.limits.max_update_bytes)
    check_update_bound(name, update.tensors, broadcast.tensors, env.job.limits)
    check_sample_count(name, update.meta.get("num_samples"), env.job.limits.sample_cap(env.tenant))
    specs = env.algorithm.expected_update_shapes(broadcast)
    weight = env.algorithm.sum_weight(update)
    flat = vector.flatten(update.tensors, specs) * weight
    return fixedpoint.encode(flat, _facts(env).settings.frac_bits, parties), weight


def client_step(env: TenantEnv, round_index: int) -> dict[str, Any]:
    """Tenant: train, check the update here (the provider cannot), mask it and upload."""
    key = layout.update_key(round_index)
    if Update.stored(env.exchange, key):  # a retry after the upload: report what it reported
        return {"skipped": True, **stored_update_result(env.exchange, key)}
    started = time.perf_counter()
    name = env.tenant.name
    roster, keys_ = _roster(env, round_index)
    inbox = env.exchange.get_json(layout.secagg_key(round_index, "inbox"))
    kept = _kept(env, round_index)
    secrets_ = p.TenantSecrets.from_json(kept["secrets"])
    dealt = {u: p.Dealt.from_json(d) for u, d in inbox["dealt"].items()}
    held, problems = p.open_shares(name, secrets_, roster, dealt, keys_)
    for dealer, why in sorted(problems.items()):  # the reasons stay in the tenant's log
        log.warning("tenant %s: a share of %s was not opened: %s", name, dealer, why)
    env.own.put_json(
        layout.secagg_secrets_key(round_index),
        {**kept, "held": {u: {k: f"{v:x}" for k, v in pair.items()} for u, pair in held.items()}},
    )
    update = train_client(env, round_index)
    mask_started = time.perf_counter()
    broadcast = Broadcast.load(env.exchange, layout.round_broadcast_key(round_index))
    encoded, weight = prepare_update(env, update, broadcast, len(roster.ads))
    masked = p.mask(name, secrets_, roster, inbox["sharers"], encoded)
    # plain_bytes: the unmasked update's size (the provider knows its shapes anyway), kept so
    # that a retried step reports the same sizes as the attempt that uploaded.
    meta = {**update.meta,
            "secagg": {"weight": weight, "unopened": sorted(problems), "plain_bytes": update.nbytes}}
    out = Update(tensors={MASKED: torch.from_numpy(masked.view(np.int64).copy())}, meta=meta)
    written = out.save(env.exchange, key)
    return {
        "seconds": time.perf_counter() - started,
        "bytes": written,
        "raw_bytes": update.nbytes,
        "mask_seconds": time.perf_counter() - mask_started,
        "meta": meta,
    }


def unmask_step(env: TenantEnv, round_index: int) -> dict[str, Any]:
    """Tenant: answer the round's one unmasking request (seed or key share per dealer)."""
    key = layout.secagg_key(round_index, "unmask")
    if env.exchange.exists(key):
        return {"skipped": True}
    started = time.perf_counter()
    request = env.exchange.get_json(layout.secagg_key(round_index, "unmask-request"))
    kept = _kept(env, round_index)
    held = {u: {k: int(v, 16) for k, v in pair.items()} for u, pair in kept.get("held", {}).items()}
    roster, _ = _roster(env, round_index)
    answer = p.respond(env.tenant.name, held, request["sharers"], request["survivors"], roster, kept.get("answer"))
    env.own.put_json(layout.secagg_secrets_key(round_index), {**kept, "answer": answer})
    env.exchange.put_json(key, answer)
    return {"seconds": time.perf_counter() - started, "bytes": json_size(answer)}


TENANT_STEPS: dict[str, Callable[[TenantEnv, int], dict[str, Any]]] = {
    "secagg-advertise": advertise_step,
    "secagg-share": share_step,
    "client": client_step,
    "secagg-unmask": unmask_step,
}
