"""The memorization audit as a job step: tenants score, the provider combines and tags.

After export and registration, each tenant named by ``audit.tenants`` runs
:func:`~fedtune.engines.tenant.audit.audit_step` on its own side, like the final evaluation: it builds the model its final
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

from fedtune.core.errors import DataError
from fedtune.engines import layout, steps
from fedtune.eval.memorization import AuditScores, pool_scores
from fedtune.serving.gate import AUDIT_TAG
from fedtune.tracking.base import Tracker

log = logging.getLogger(__name__)

SUBJECT_TAG = "fedtune.audit.subject"
"""Version tag saying what the audit ran: the model the tenants' final broadcast carries."""


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
