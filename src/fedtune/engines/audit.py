"""The memorization audit as a job step: tenants score, the provider combines and tags.

After export and registration, each tenant named by ``audit.tenants`` runs
:func:`audit_step` on its own side, like the final evaluation: it builds the model its final
broadcast lets it run (:meth:`~fedtune.algorithms.base.Algorithm.tenant_model`; never a
server state) or, where the tenant keeps a model of its own (FedMKT's small model), that model
(:meth:`~fedtune.algorithms.base.Algorithm.kept_model`; the provider's registered versions are
then not tagged), prompts it with a seeded sample of its own training records and writes

- the numbers only (:class:`~fedtune.eval.memorization.AuditScores`) to its exchange prefix,
- the full report (line numbers, per-record Rouge-L, generations) to its private store.

The provider's :func:`record_audit` reads every tenant's numbers (strictly parsed: a tenant
is not trusted to send well-formed ones), pools them with a record-weighted mean
(:func:`~fedtune.eval.memorization.pool_scores`), tags every version the run registered with
:data:`~fedtune.serving.gate.AUDIT_TAG` so that ``fedtune promote --max-leakage`` gates on
it, logs the metrics and stores the result in its private store. Both steps are skipped when
their output already exists, so a resumed run repeats neither.
"""

from __future__ import annotations

import logging
from typing import Any

from fedtune.core.errors import ConfigError, DataError
from fedtune.core.messages import Broadcast
from fedtune.data.loader import read_numbered_examples
from fedtune.engines import layout, steps
from fedtune.eval.memorization import AuditScores, pool_scores
from fedtune.serving.gate import AUDIT_TAG
from fedtune.tracking.base import Tracker
from fedtune.training.context import derive_seed, split_indices

log = logging.getLogger(__name__)

SUBJECT_TAG = "fedtune.audit.subject"
"""Version tag saying what the audit ran: the model the tenants' final broadcast carries."""


def audit_step(env: steps.TenantEnv) -> dict[str, Any]:
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


def _audited_model(env: steps.TenantEnv) -> tuple[Any, Any]:
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


def collect_scores(env: steps.ProviderEnv, tenants: list[str]) -> dict[str, AuditScores]:
    """Provider: every audited tenant's numbers from its exchange prefix, strictly parsed.

    Raises:
        DataError: A tenant delivered no scores, or malformed ones (named).
    """
    key = layout.final_audit_key(env.job.rounds)
    parts: dict[str, AuditScores] = {}
    for name in tenants:
        store = env.stores.exchange(name)
        if not store.exists(key):
            raise DataError(
                f"tenant {name!r} delivered no memorization-audit scores ({key} in its exchange "
                "prefix)",
                fix="Its audit step failed or did not run: the tenant reads the reason in its "
                "own store (errors/audit.txt); run the job again with --resume.",
            )
        try:
            parts[name] = AuditScores.from_json(store.get_json(key))
        except DataError as exc:
            raise DataError(f"tenant {name!r}: {exc}", fix=exc.fix) from None
    return parts


def record_audit(
    env: steps.ProviderEnv, tracker: Tracker, artifacts: dict[str, Any]
) -> dict[str, Any]:
    """Provider: pool the tenants' scores, tag the registered versions, log, store.

    ``artifacts`` is what export-and-register returned (registered names and versions).
    The stored record is written last: its presence marks the step done.
    """
    store = env.store()
    if store.exists(layout.AUDIT_KEY):
        return dict(store.get_json(layout.AUDIT_KEY))
    job = env.job
    parts = collect_scores(env, job.audited_tenants)
    pooled = pool_scores(parts)
    kept = env.algorithm.tenant_keeps_model
    subject = (
        f"each audited tenant's own model ({job.algorithm.name}), not the provider's"
        if kept else f"what the final broadcast of {job.algorithm.name} lets a tenant run"
    )
    tags = {
        AUDIT_TAG: f"{pooled['mean']:.6f}",
        f"{AUDIT_TAG}.max": f"{pooled['max']:.6f}",
        f"{AUDIT_TAG}.records": str(int(pooled["n"])),
        f"{AUDIT_TAG}.threshold": str(job.audit.threshold),
        SUBJECT_TAG: subject,
    }
    tagged = []
    for entry in artifacts.values():
        # The tenants' own models were audited, not the provider's: its versions stay
        # untagged, so a promotion gate on them cannot pass on another model's score.
        if entry.get("registered_version") and not kept:
            tracker.tag_model_version(entry["registered_name"], entry["registered_version"], tags)
            tagged.append({"name": entry["registered_name"], "version": entry["registered_version"]})
    metrics = {f"audit/memorization/{k}": v for k, v in pooled.items()}
    for name, scores in parts.items():
        for key, value in scores.to_json().items():
            if key != "threshold":
                metrics[f"audit/memorization/{key}/{name}"] = float(value)
    tracker.log_metrics(metrics, step=job.rounds)
    record = {
        "pooled": pooled,
        "tenants": {n: s.to_json() for n, s in parts.items()},
        "threshold": job.audit.threshold,
        "subject": subject,
        "tagged": tagged,
    }
    store.put_json(layout.AUDIT_KEY, record)
    log.info(
        "memorization audit: mean Rouge-L %.4f over %d records of %d tenant(s)",
        pooled["mean"],
        int(pooled["n"]),
        len(parts),
    )
    return record
