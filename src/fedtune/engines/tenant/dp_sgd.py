"""A tenant's own example-level DP-SGD in the engine's client step (off unless asked for).

Where the setting comes from, first found wins:

1. ``dp-sgd.json`` in the tenant's own store (the :class:`~fedtune.config.dp_sgd.DpSgdConfig`
   fields): the tenant's own policy. The job file is the provider's; a tenant that wants its
   own guarantee writes this file, and no job can turn it off (a job whose algorithm cannot
   apply it makes the tenant's step refuse, never train without it);
2. ``tenants[].dp_sgd`` in the job.

What the tenant keeps in its own store: ``dp-sgd/secret.json``, a random seed made once, from
which each round's batch and noise generators are derived (so a resumed round redraws the same
batches and noise, bitwise, and the provider, which knows the job seed, cannot); and
``dp-sgd/ledger.json``, one entry per round trained: the DP-SGD parameters, the epsilon after
it, and the losses the provider does not get (also logged to the tenant's own MLflow when its
entry has ``tracking``).

What leaves for the provider: the noised adapter update; the epsilon and the public DP-SGD
parameters in the update's metrics (``dp_sgd/*``) unless ``share_epsilon: false``; the losses
and token count only with ``share_losses: true``; ``num_samples`` (the training-set size, which
the weighted mean needs) always.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError

from fedtune.config.dp_sgd import DpSgdConfig, dp_sgd_problem
from fedtune.config.loading import format_validation_errors
from fedtune.core.errors import ConfigError, StoreError, StoreUnavailable
from fedtune.core.messages import Update
from fedtune.engines.tenant.env import TenantEnv
from fedtune.privacy.example_level import Step
from fedtune.training.dp_sgd import PrivateRun, running

POLICY_KEY = "dp-sgd.json"
SECRET_KEY = "dp-sgd/secret.json"
LEDGER_KEY = "dp-sgd/ledger.json"
#: Update metadata computed from the private data outside the DP guarantee.
DATA_SCALARS = ("train_loss", "eval_loss", "tokens")


def setting(env: TenantEnv) -> tuple[DpSgdConfig | None, str]:
    """The DP-SGD the tenant's step applies, and where it came from (``tenant`` or ``job``).

    Raises:
        ConfigError: The tenant's own policy is malformed, or the job's algorithm cannot
            apply it (the tenant then refuses to train).
    """
    name = env.tenant.name
    try:  # a file the tenant uploaded itself has no checksum sidecar
        raw = env.own.get_bytes(POLICY_KEY, verify=False)
    except StoreUnavailable:
        raise
    except StoreError:
        return env.tenant.dp_sgd, "job"
    try:
        policy = DpSgdConfig.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        lines = format_validation_errors(exc) if isinstance(exc, ValidationError) else [str(exc)]
        raise ConfigError(
            f"tenant {name!r}: its own {POLICY_KEY} is invalid: " + "; ".join(lines),
            fix=f"The tenant corrects {POLICY_KEY} in its store (fields of tenants[].dp_sgd, as JSON).",
        ) from None
    if problem := dp_sgd_problem(env.job.algorithm.name):
        raise ConfigError(f"tenant {name!r} sets {POLICY_KEY} in its own store, but {problem}",
                          fix="The tenant takes no part in this job, or removes its policy.")
    return policy, "tenant"


def _secret(env: TenantEnv) -> int:
    """The tenant's secret seed (made once, kept in its own store)."""
    if not env.own.exists(SECRET_KEY):
        env.own.put_json(SECRET_KEY, {"seed": secrets.randbits(63)})
    return int(env.own.get_json(SECRET_KEY)["seed"])


def _seed(secret: int, *parts: object) -> int:
    """A 63-bit seed of (secret, parts): not searchable the way a 31-bit one is."""
    digest = hashlib.sha256(repr((secret, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


def ledger(env: TenantEnv) -> dict[str, Any]:
    """The tenant's record of the rounds it trained under DP-SGD (``{"rounds": {...}}``)."""
    if not env.own.exists(LEDGER_KEY):
        return {"rounds": {}}
    return dict(env.own.get_json(LEDGER_KEY))


def _history(book: dict[str, Any], before: int) -> list[Step]:
    rounds = sorted((int(r), e) for r, e in book["rounds"].items() if int(r) < before)
    return [(e["noise_multiplier"], e["sample_rate"], e["steps"]) for _, e in rounds]


@contextmanager
def example_privacy(env: TenantEnv, round_index: int) -> Iterator[PrivateRun | None]:
    """Run the block's client step under the tenant's DP-SGD, if it has one."""
    config, source = setting(env)
    if config is None:
        with running(None):
            yield None
        return
    secret = _secret(env)
    run = PrivateRun(
        tenant=env.tenant.name,
        config=config,
        history=_history(ledger(env), round_index),
        sample_seed=_seed(secret, "dp-sgd-sample", round_index),
        noise_seed=_seed(secret, "dp-sgd-noise", round_index),
        source=source,
    )
    with running(run):
        yield run


def _log_to_own_tracking(env: TenantEnv, round_index: int, book: dict[str, Any]) -> None:
    """The round's entry into the tenant's own MLflow (``tenants[].tracking``), if it has one:
    one run per job and tenant, its id kept in the ledger; every number, losses included."""
    tracking = env.tenant.tracking
    if tracking is None or tracking.backend != "mlflow":
        return
    from fedtune.tracking.mlflow_tracker import MlflowTracker

    tracker = MlflowTracker(tracking.tracking_uri, tracking.experiment,
                            timeout_s=env.job.limits.tracking_timeout_s,
                            max_retries=env.job.limits.tracking_max_retries)
    book["mlflow_run_id"] = tracker.start(
        run_name=f"{env.job.job_name}-{env.tenant.name}-dp-sgd", params={},
        tags={"fedtune.tenant": env.tenant.name}, run_id=book.get("mlflow_run_id"),
    )
    entry = book["rounds"][str(round_index)]
    tracker.log_metrics({f"dp_sgd/{k}": float(v) for k, v in entry.items()
                         if isinstance(v, int | float) and not isinstance(v, bool)}, step=round_index)
    tracker.end("FINISHED")


def finish(env: TenantEnv, round_index: int, run: PrivateRun | None, update: Update) -> Update:
    """Record the round in the tenant's ledger; the update with only what the tenant shares.

    Raises:
        ConfigError: The client step did not train through DP-SGD (fail closed: nothing leaves).
    """
    if run is None:
        return update
    if run.applied is None:
        raise ConfigError(
            f"tenant {env.tenant.name!r}: its client step of round {round_index} did not train "
            "through DP-SGD, so its update is withheld",
            fix="Use an algorithm that supports dp_sgd (see fedtune.config.dp_sgd).",
        )
    cfg = run.config
    meta = dict(update.meta)
    book = ledger(env)
    book["rounds"][str(round_index)] = {
        **run.applied,
        "source": run.source,
        **{k: meta.get(k) for k in DATA_SCALARS},
    }
    _log_to_own_tracking(env, round_index, book)
    env.own.put_json(LEDGER_KEY, book)
    metrics = {k: v for k, v in dict(meta.get("metrics") or {}).items() if k.startswith("bytes")}
    if cfg.share_losses:
        metrics = dict(meta.get("metrics") or {})
    else:
        for key in DATA_SCALARS:
            meta.pop(key, None)
    if cfg.share_epsilon:
        applied = run.applied
        metrics.update({
            "dp_sgd/epsilon": applied["epsilon"],
            "dp_sgd/delta": applied["delta"],
            "dp_sgd/noise_multiplier": applied["noise_multiplier"],
            "dp_sgd/max_grad_norm": applied["max_grad_norm"],
            "dp_sgd/sample_rate": applied["sample_rate"],
        })
        flag = "dp-sgd/epsilon-shared"
    else:
        flag = "dp-sgd/epsilon-kept"
    meta["metrics"] = metrics
    meta["flags"] = [*list(meta.get("flags") or []), flag]
    return Update(tensors=update.tensors, meta=meta)
