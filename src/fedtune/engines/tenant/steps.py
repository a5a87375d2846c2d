"""The tenant's federated steps: its client step (whole or in parts) and its final evaluation.

Each reads the tenant's inputs from its exchange prefix and its own store and writes its
outputs there, as :mod:`fedtune.engines.steps` (which re-exports these for the engines) does
for the provider's steps; a step whose output already exists is skipped.
"""

from __future__ import annotations

import time
from typing import Any

from fedtune.core.messages import Broadcast, ClientState, Update
from fedtune.engines import layout
from fedtune.engines.publish import stored_size
from fedtune.engines.tenant.env import TenantEnv


def client_step(env: TenantEnv, round_index: int) -> dict[str, Any]:
    """Tenant: train on its own data; update to its exchange prefix, state to its own store."""
    exchange = env.exchange
    key = layout.update_key(round_index)
    if Update.stored(exchange, key):  # a retry after the upload: report what it reported
        return {"skipped": True, **stored_update_result(exchange, key)}
    started = time.perf_counter()
    update = train_client(env, round_index)
    written = update.save(exchange, key)
    return {
        "seconds": time.perf_counter() - started,
        "bytes": written,
        "raw_bytes": update.nbytes,
        "meta": update.meta,
    }


def client_step_part(
    env: TenantEnv, round_index: int, start: int, stop: int | None
) -> dict[str, Any]:
    """Tenant: local steps ``start`` to ``stop`` (None: the end) of its client step.

    A part that stops early saves its training state in the tenant's own store and returns
    ``{"suspended": steps}``; the part that reaches the end returns what :func:`client_step`
    returns. Run one after the other, the parts give the uninterrupted step's bits.
    """
    from fedtune.core.messages import Message
    from fedtune.training.local import Segment, Suspended, segment

    key = layout.partial_step_key(round_index)

    def save(checkpoint: tuple[dict[str, Any], dict[str, Any]]) -> None:
        Message(tensors=checkpoint[0], meta=checkpoint[1]).save(env.own, key)

    def load() -> tuple[dict[str, Any], dict[str, Any]]:
        saved = Message.load(env.own, key)
        return saved.tensors, saved.meta

    try:
        with segment(Segment(start=start, stop=stop, load=load, save=save)):
            out = client_step(env, round_index)
    except Suspended as cut:
        return {"suspended": cut.steps}
    if start:
        for suffix in (".json", ".safetensors"):
            env.own.delete(key + suffix)
    return out


def train_client(env: TenantEnv, round_index: int) -> Update:
    """Tenant: the algorithm's client step on the round's broadcast; keeps its client state."""
    own = env.own
    broadcast = Broadcast.load(env.exchange, layout.round_broadcast_key(round_index))
    previous = layout.latest_round(own.list("client-state/"), before=round_index)
    client_state = (
        ClientState.load(own, layout.client_state_key(previous)) if previous is not None else None
    )
    from fedtune.engines.tenant import (
        dp_sgd as dp_sgd_steps,  # the tenant's own example-level DP-SGD, if any
    )

    with dp_sgd_steps.example_privacy(env, round_index) as private:
        update, new_state = env.algorithm.client_step(env.ctx, broadcast, env.data(), client_state)
    update = dp_sgd_steps.finish(env, round_index, private, update)
    # Kept state is versioned by round, so re-running a round after a crash reads the same
    # input state and rewrites the same output: the step stays idempotent.
    if new_state is not None:
        for name, data in sorted(new_state.files.items()):
            own.put_bytes(name, data)
        new_state.save(own, layout.client_state_key(round_index))
        _prune_client_states(own, keep_from=previous if previous is not None else round_index)
    if env.job.client_level_dp:  # clipped (and noised) before anything sees it
        from fedtune.engines.privacy_steps import privatize_update

        update = privatize_update(env, round_index, update)
    return update


def _prune_client_states(store: Any, keep_from: int) -> None:
    """Drop kept states older than the one this round read (a re-run of it still needs that)."""
    for key in store.list("client-state/"):
        found = layout.latest_round([key], before=keep_from)
        if found is not None:
            store.delete(key)


def evaluate_step(env: TenantEnv) -> dict[str, float]:
    """Tenant: metrics of the final model on its held-out split, from the final broadcast,
    and, where the algorithm says tenants keep a model of their own, that model's metrics and
    its export into the tenant's own store (:mod:`fedtune.engines.tenant.export`).

    The metrics (scalars only) go to the tenant's exchange prefix for the provider.
    """
    rounds = env.job.rounds
    out_key = layout.final_eval_key(rounds)
    if env.exchange.exists(out_key):
        return dict(env.exchange.get_json(out_key))
    broadcast = Broadcast.load(env.exchange, layout.final_tenant_broadcast_key(rounds))
    metrics = env.algorithm.evaluate(env.ctx, broadcast, env.data())
    if env.algorithm.tenant_keeps_model:
        # The tenant's own model (FedMKT's small model): scored and exported here, in the
        # tenant's process, into its own store; only the scalars go to the exchange.
        from fedtune.engines.tenant import export as tenant_export

        kept = tenant_export.finished_state(env)  # the last round finished (finish_kept)
        if kept is not None:
            metrics.update(env.algorithm.evaluate_kept(env.ctx, env.data(), kept))
            tenant_export.export_kept(env, kept)
    env.exchange.put_json(out_key, metrics)
    return metrics


def stored_update_result(store: Any, key: str) -> dict[str, Any]:
    """What the client step that stored the update at ``key`` reported: its stored bytes, the
    plain update's bytes (a masked upload records them in its meta) and its meta. A retried
    step (or pod) that finds its upload reports the same."""
    update = Update.load(store, key)
    plain = update.meta.get("secagg", {}).get("plain_bytes")
    return {"bytes": stored_size(store, key),
            "raw_bytes": update.nbytes if plain is None else plain, "meta": update.meta}
