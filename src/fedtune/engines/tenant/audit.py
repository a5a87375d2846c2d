"""The tenant's half of the memorization audit (see :mod:`fedtune.engines.provider.audit`):
score the final model (or the tenant's own) on a seeded sample of its training records; the
numbers go to its exchange prefix, the full report to its private store."""

from __future__ import annotations

from typing import Any

from fedtune.core.errors import ConfigError
from fedtune.core.messages import Broadcast
from fedtune.data.loader import read_numbered_examples
from fedtune.engines import layout
from fedtune.engines.tenant.env import TenantEnv
from fedtune.training.context import derive_seed, split_indices


def audit_step(env: TenantEnv) -> dict[str, Any]:
    """Tenant: audit the final model on a sample of its own training records.

    Returns ``{"scores": {...}}`` (numbers only), as written to the exchange.
    """
    from fedtune.eval.audit import audit_model  # generation needs torch: the tenant's step only

    job = env.job
    if job.audit is None:
        raise ConfigError(
            f"tenant {env.tenant.name!r} is not audited in this job (audit.enabled, audit.tenants)",
            fix="Run the audit step only for the tenants the job's audit section names.",
        )
    out_key = layout.final_audit_key(job.rounds)
    if env.exchange.exists(out_key):
        return {"scores": dict(env.exchange.get_json(out_key)), "skipped": True}
    fmt = None if env.tenant.data_format == "auto" else env.tenant.data_format
    numbered = read_numbered_examples(env.tenant.data_uri, fmt, limits=job.limits, named="data_uri")
    # The training split only: held-out records were never trained on.
    train, _ = split_indices(len(numbered), job.training.eval_fraction, job.seed, env.tenant.name)
    model, tokenizer = _audited_model(env)
    outcome = audit_model(
        model,
        tokenizer,
        [numbered[i] for i in sorted(train)],
        max_records=job.audit.records,
        seed=derive_seed(job.seed, "audit", env.tenant.name),
        threshold=job.audit.threshold,
        max_new_tokens=job.audit.max_new_tokens,
    )
    env.own.put_json(layout.audit_report_key(job.rounds), outcome.private_json())
    scores = outcome.scores.to_json()
    env.exchange.put_json(out_key, scores)
    return {"scores": scores}


def _audited_model(env: TenantEnv) -> tuple[Any, Any]:
    """The tenant's own final model where it keeps one (FedMKT's small model, the last round
    finished: :func:`~fedtune.engines.tenant.export.finished_state`), else the model its final
    broadcast lets it run."""
    if env.algorithm.tenant_keeps_model:
        from fedtune.engines.tenant import export as tenant_export

        kept = tenant_export.finished_state(env)
        if kept is None:
            raise ConfigError(
                f"tenant {env.tenant.name!r} trained in no round, so it keeps no model to audit",
                fix="Audit only tenants that took part (audit.tenants), or run more rounds.",
            )
        return env.algorithm.kept_model(env.ctx, kept)
    broadcast = Broadcast.load(env.exchange, layout.final_tenant_broadcast_key(env.job.rounds))
    return env.algorithm.tenant_model(env.ctx, broadcast)
