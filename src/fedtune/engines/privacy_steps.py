"""Differential privacy in the engine's steps (off unless the job has ``differential_privacy``).

Per round, beside the usual steps:

- provider, after ``configure``: :func:`publish_plan` writes the round's clip norm and noise
  share into each sampled tenant's exchange prefix (``round-NNNNNN/privacy.json``);
- tenant, inside ``train_client``: :func:`privatize_update` clips the adapter delta and adds
  the noise share (distributed placement) before the update is checked, masked or uploaded;
- provider, in ``aggregate``: :func:`fold` re-clips (central), sums, noises (central), divides by
  the expected count, lets the algorithm fold the noised mean, updates an adaptive clip norm
  and accounts the round. The round's record goes into the new server state's ``meta`` (saved
  with it, atomically), its numbers into the round's metrics (MLflow ``server/dp/*``).

Before a run, :func:`plan_rounds` shortens it to the rounds that fit ``target_epsilon``; before
each round :func:`check_budget` stops a run whose rounds lost noise (distributed shares of
tenants that dropped out). The local engine and the pipelines' server-init, configure-round
and aggregate steps call the same functions.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from fedtune.config.job import JobConfig
from fedtune.core.errors import ConfigError, PrivacyBudgetError, UpdateRejected
from fedtune.core.messages import Broadcast, ServerState, Update, prefixed
from fedtune.engines import layout
from fedtune.privacy.accountant import Sampling, epsilon, rounds_within
from fedtune.privacy.adaptive import next_clip_norm, noised_unclipped_fraction
from fedtune.privacy.mechanism import RoundPlan, clipped_sum, privatize, release
from fedtune.privacy.noise import secret_generator
from fedtune.storage.base import Store

if TYPE_CHECKING:  # annotations only: the tenant's side imports this module too
    from fedtune.engines.steps import ProviderEnv
    from fedtune.engines.tenant.env import TenantEnv

log = logging.getLogger(__name__)

DP_MEAN = "dp-mean"
ACCOUNTANT = "RDP (dp-accounting)"


def plan_key(round_index: int) -> str:
    """The round's privacy plan, inside a tenant's exchange prefix."""
    return layout.privacy_plan_key(round_index)


def sampling(job: JobConfig) -> Sampling:
    """How the job samples tenants, as the accountant sees it."""
    return Sampling(population=len(job.tenants), sampled=job.sampled_per_round)


def _dp(job: JobConfig) -> Any:
    if job.differential_privacy is None:
        raise ConfigError(f"job {job.name!r} has no differential_privacy section")
    return job.differential_privacy


def history(store: Store) -> list[dict[str, Any]]:
    """The privacy records of the rounds aggregated so far (rounds 1, 2, ... in order)."""
    records = []
    round_index = 1
    while store.exists(f"{layout.state_key(round_index)}.json"):
        record = store.get_json(f"{layout.state_key(round_index)}.json").get("privacy")
        if record is None:
            break
        records.append(dict(record))
        round_index += 1
    return records


def clip_norm(job: JobConfig, store: Store, round_index: int) -> float:
    """C of ``round_index``: the fixed norm, or the adaptive one the previous round set."""
    clipping = _dp(job).clipping
    if clipping.adaptive is None:
        return float(clipping.norm)
    if round_index == 1:
        return float(clipping.adaptive.initial_norm)
    meta = store.get_json(f"{layout.state_key(round_index - 1)}.json")
    return float(meta["privacy"]["next_clip_norm"])


# -- provider, before the tenants ----------------------------------------------------------
def publish_plan(env: ProviderEnv, round_index: int, sampled: list[str]) -> RoundPlan:
    """Provider: tell every sampled tenant the round's clip norm and noise share."""
    dp = _dp(env.job)
    m = env.job.sampled_per_round
    c = clip_norm(env.job, env.store(), round_index)
    share = dp.delta_noise_multiplier(m) * c / math.sqrt(m) if dp.placement == "distributed" else 0.0
    plan = RoundPlan(round_index, c, share, report_unclipped=dp.clipping.adaptive is not None)
    for name in sampled:
        env.stores.exchange(name).put_json(plan_key(round_index), plan.to_json())
    return plan


# -- tenant --------------------------------------------------------------------------------
def privatize_update(env: TenantEnv, round_index: int, update: Update) -> Update:
    """Tenant: the update with its adapter delta clipped (and its noise share added).

    Raises:
        PrivacyBudgetError: The round's plan is missing from the tenant's exchange prefix.
        UpdateRejected: The update has a non-finite value.
    """
    key = plan_key(round_index)
    if not env.exchange.exists(key):
        raise PrivacyBudgetError(
            f"tenant {env.tenant.name!r}: no differential-privacy plan for round {round_index} ({key})",
            fix="Re-run the round; the provider writes the plan before the tenants train.",
        )
    plan = RoundPlan.from_json(env.exchange.get_json(key))
    broadcast = Broadcast.load(env.exchange, layout.round_broadcast_key(round_index))
    try:
        adapter, fitted = privatize(
            update.group("adapter"), broadcast.group("adapter"), plan, secret_generator()
        )
    except ValueError as exc:  # a non-finite update: refused here, never uploaded
        raise UpdateRejected(f"tenant {env.tenant.name!r}: {exc}") from None
    tensors = {k: v for k, v in update.tensors.items() if not k.startswith("adapter/")}
    meta = dict(update.meta)
    if plan.report_unclipped:  # adaptive clipping only: one bit, never the norm itself
        meta["dp"] = {"unclipped": fitted}
    return Update(tensors=tensors | prefixed("adapter", adapter), meta=meta)


# -- provider, aggregation -----------------------------------------------------------------
def fold(
    env: ProviderEnv,
    state: ServerState,
    updates: dict[str, Update],
    round_index: int,
    contributors: int | None = None,
) -> ServerState:
    """Provider: the DP-FedAvg release of the round, folded in by the algorithm.

    ``updates`` are the tenants' own uploads, or (``contributors`` set) one update holding the
    mean of that many uploads, as secure aggregation unmasks it.
    """
    dp = _dp(env.job)
    store = env.store()
    m = env.job.sampled_per_round
    c = clip_norm(env.job, store, round_index)
    reference = Broadcast.load(store, layout.broadcast_key(round_index)).group("adapter")
    central = dp.placement == "central"
    names = sorted(updates)
    # Uploads seen one by one under central noise are re-clipped: a tenant that skipped its
    # clipping cannot exceed C. Distributed uploads carry noise shares, which clipping would cut.
    total = clipped_sum(
        [updates[n].group("adapter") for n in names],
        reference,
        c if central and contributors is None else None,
    )
    arrived = len(names) if contributors is None else contributors
    if contributors is not None:  # the mean of `contributors` uploads back to their sum
        total = {k: v * contributors for k, v in total.items()}
    z_delta = dp.delta_noise_multiplier(m)
    generator = secret_generator()
    mean = release(total, z_delta * c if central else 0.0, m, generator)
    adapter = {k: (reference[k].double() + mean[k]).to(reference[k].dtype) for k in reference}
    single = Update(tensors=prefixed("adapter", adapter), meta={"num_samples": 1})
    new_state = env.algorithm.aggregate(env.ctx, state, {DP_MEAN: single}, round_index)
    # Distributed shares of tenants that dropped out are missing from the sum: account the
    # noise that arrived (k of m shares: z * sqrt(k / m)).
    z_round = dp.noise_multiplier if central else z_delta * math.sqrt(min(arrived, m) / m)
    record: dict[str, Any] = {"clip_norm": c, "noise_multiplier": z_round, "contributors": arrived}
    metrics = {"dp/clip_norm": c, "dp/noise_multiplier": z_round}
    adaptive = dp.clipping.adaptive
    if adaptive is not None:
        bits = [updates[n].meta.get("dp", {}).get("unclipped") is True for n in names]
        fraction = noised_unclipped_fraction(bits, m, adaptive.count_noise_for(m), generator)
        record["next_clip_norm"] = next_clip_norm(c, fraction, adaptive.target_quantile, adaptive.learning_rate)
        metrics["dp/unclipped_fraction"] = fraction
    past = [r["noise_multiplier"] for r in history(store)[: round_index - 1]]
    record["epsilon"] = epsilon(sampling(env.job), [*past, z_round], dp.delta)
    metrics["dp/epsilon"] = record["epsilon"]
    new_state.meta["privacy"] = record
    new_state.meta["metrics"] = {**dict(new_state.meta.get("metrics") or {}), **metrics}
    return new_state


# -- the budget ----------------------------------------------------------------------------
def plan_rounds(job: JobConfig, store: Store, fresh: bool = False) -> tuple[JobConfig, dict[str, Any]]:
    """The job shortened to the rounds whose epsilon stays within ``target_epsilon``.

    Rounds already run count with their actual noise; the rest at the configured one.
    Returns the job to run and what the run summary says about the stop.

    Raises:
        PrivacyBudgetError: Not even the next round fits the target.
    """
    dp = _dp(job)
    if dp.target_epsilon is None:
        return job, {}
    done = [] if fresh else [r["noise_multiplier"] for r in history(store)]
    s = sampling(job)
    fits = rounds_within(s, done, dp.noise_multiplier, dp.delta, dp.target_epsilon, job.rounds)
    if fits >= job.rounds:
        return job, {}
    over = epsilon(s, [*done, *[dp.noise_multiplier] * (fits + 1 - len(done))], dp.delta)
    if fits == 0:
        raise PrivacyBudgetError(
            f"job {job.name!r}: one round already gives epsilon={over:.3f} at delta={dp.delta:g}, "
            f"above differential_privacy.target_epsilon={dp.target_epsilon:g}",
            fix="Raise noise_multiplier or target_epsilon, or sample fewer tenants per round.",
        )
    note = {
        "rounds_requested": job.rounds,
        "stopped_before_round": fits + 1,
        "epsilon_if_continued": over,
        "reason": f"round {fits + 1} would raise epsilon to {over:.3f} > target_epsilon="
        f"{dp.target_epsilon:g} at delta={dp.delta:g}",
    }
    log.warning(
        "job %s: differential_privacy.target_epsilon=%g allows %d of its %d rounds; the run stops "
        "before round %d (%s) and exports the model of round %d",
        job.name, dp.target_epsilon, fits, job.rounds, fits + 1, note["reason"], fits,
    )
    return job.model_copy(update={"rounds": fits}), note


def check_budget(env: ProviderEnv, round_index: int) -> None:
    """Stop before ``round_index`` if it would exceed the target given the rounds run.

    Raises:
        PrivacyBudgetError: The round would exceed ``target_epsilon`` (rounds that lost noise
            spent more than planned).
    """
    dp = _dp(env.job)
    if dp.target_epsilon is None:
        return
    past = [r["noise_multiplier"] for r in history(env.store())[: round_index - 1]]
    after = epsilon(sampling(env.job), [*past, dp.noise_multiplier], dp.delta)
    if after > dp.target_epsilon:
        raise PrivacyBudgetError(
            f"job {env.job.name!r}: round {round_index} would raise epsilon to {after:.3f} > "
            f"target_epsilon={dp.target_epsilon:g} at delta={dp.delta:g} (earlier rounds lost "
            "noise shares of tenants that dropped out)",
            fix="Run the same command with --resume: the run then evaluates, exports and "
            f"registers the model of round {round_index - 1}.",
        )


def summary(job: JobConfig, store: Store, note: dict[str, Any]) -> dict[str, Any]:
    """The run summary's ``privacy`` section."""
    dp = _dp(job)
    records = history(store)[: job.rounds]
    s = sampling(job)
    return {
        "accountant": ACCOUNTANT,
        "adjacency": s.adjacency,
        "sampling": {"population": s.population, "per_round": s.sampled, "without_replacement": True},
        "delta": dp.delta,
        "noise_multiplier": dp.noise_multiplier,
        "placement": dp.placement,
        "clipping": "adaptive" if dp.clipping.adaptive is not None else "fixed",
        "target_epsilon": dp.target_epsilon,
        "epsilon": records[-1]["epsilon"] if records else 0.0,
        "rounds": [{"round": i + 1, **r} for i, r in enumerate(records)],
        **note,
    }
