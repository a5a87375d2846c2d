"""A secure-aggregation round in a pipeline: the bodies of its extra KFP components.

The round's steps and their order are :data:`fedtune.engines.provider.secagg.SECURE_SEQUENCE`,
the very sequence the local engine runs: tenant steps (``secagg-advertise``, ``secagg-share``,
``client``, ``secagg-unmask``) fan out over the tenants still in the round, each through the
tenant launcher (a Job in the tenant's namespace in a cluster); provider steps
(``route-keys``, ``route-shares``, ``request-unmask``) run between them. Each provider task
replays the markers of the tenant step before it into a
:class:`~fedtune.engines.provider.secagg.RoundLog`, runs its step, and passes the log on in its
marker; its ``Output`` lists the tenants of the next tenant step. The secure aggregate step
replays the last markers, unmasks and folds the round, and stores the same round record the
local engine stores. Messages go through the exchange store only; markers carry names,
reasons, bytes and seconds.
"""

from __future__ import annotations

from typing import Any

from fedtune.config.job import JobConfig
from fedtune.core.errors import FedtuneError, QuorumError
from fedtune.engines import steps
from fedtune.engines.provider import secagg as secagg_provider
from fedtune.engines.tenant.pod_io import StepKind
from fedtune.entrypoints import aggregate, client_step, common

PREVIOUS_TENANT_STEP = {
    "route-keys": "secagg-advertise",
    "route-shares": "secagg-share",
    "request-unmask": "client",
    "aggregate": "secagg-unmask",
}
"""The tenant step whose markers each provider step (and the aggregation) reads."""


def _replay(
    log: secagg_provider.RoundLog, kind: str, markers: list[dict[str, Any]], round_index: int
) -> list[str]:
    """Record a tenant step's markers in ``log``; return who goes on (sorted)."""
    ok: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    for marker in sorted(markers, key=lambda m: str(m.get("tenant"))):
        if marker.get("round") != round_index or marker.get("kind", "client") != kind:
            raise FedtuneError(
                f"round {round_index}: got a {marker.get('kind')!r} marker of round "
                f"{marker.get('round')!r} where the {kind!r} step's markers belong",
                fix="Recompile the pipeline (`fedtune compile`); its tasks are wired wrongly.",
            )
        if marker.get("ok"):
            ok[str(marker["tenant"])] = dict(marker.get("result") or {})
        else:
            failures[str(marker["tenant"])] = str(marker.get("reason") or f"{kind} step failed")
    return log.tenants(kind, ok, failures)


def tenant_component(kind: StepKind, job_path: str, after_path: str, tenant: str, run_key: str, out_path: str) -> None:
    """Body of the ``secagg-tenant`` component: one tenant step of the round (``after_path``
    is the marker of the provider step it follows, which names the round)."""

    def body() -> None:
        round_index = int(common.read_marker(after_path)["round"])
        job = common.read_job_artifact(job_path)
        common.write_marker(out_path, client_step.run(job, round_index, tenant, run_key, kind=kind))

    common.setup_logging()
    common.guarded(body)


def provider_run(
    job: JobConfig, step: str, previous: dict[str, Any], markers: list[dict[str, Any]]
) -> dict[str, Any]:
    """Run provider step ``step`` after the tenant step whose ``markers`` are given; return
    the marker that carries the round's log on, with ``next``: the next step's tenants."""
    round_index = int(previous["round"])
    env = steps.ProviderEnv.create(job)
    sampled = steps.sample_clients(job, round_index)
    log = secagg_provider.RoundLog.from_json(previous.get("log") or {})
    names = _replay(log, PREVIOUS_TENANT_STEP[step], markers, round_index)
    out: dict[str, Any] = {}
    if aggregate.stored_round(job, round_index) is None:
        out = log.run_provider(env, round_index, sampled, step)
    if step == "request-unmask" and not names:
        # Nobody to ask for unmasking, and a pipeline cannot loop over no tenants.
        raise QuorumError(
            f"round {round_index}: no masked update of {len(sampled)} sampled, fewer than "
            f"min_clients={job.min_clients}; rejected: {dict(sorted(log.failed.items()))}"
        )
    return {
        "round": round_index,
        "step": step,
        "started_at": previous.get("started_at"),
        "configure": previous.get("configure", {}),
        "bytes": out.get("bytes", 0),
        "seconds": out.get("seconds", 0.0),
        "log": log.to_json(),
        "next": names,
    }


def provider_component(step: str, job_path: str, previous_path: str, marker_paths: list[str], out_path: str) -> list[str]:
    """Body of the ``secagg-provider`` component: the next tenant step's tenants."""

    def body() -> list[str]:
        job = common.read_job_artifact(job_path)
        marker = provider_run(
            job, step, common.read_marker(previous_path), [common.read_marker(p) for p in marker_paths]
        )
        common.write_marker(out_path, marker)
        return list(marker["next"])

    common.setup_logging()
    return common.guarded(body)


def aggregate_run(job: JobConfig, previous: dict[str, Any], markers: list[dict[str, Any]]) -> dict[str, Any]:
    """Unmask and fold the round after the unmasking answers; store its record; return the
    state marker (that of :mod:`fedtune.entrypoints.aggregate`)."""
    round_index = int(previous["round"])
    stored = aggregate.stored_round(job, round_index, log=True)
    if stored is not None:
        return stored
    env = steps.ProviderEnv.create(job)
    log = secagg_provider.RoundLog.from_json(previous.get("log") or {})
    _replay(log, PREVIOUS_TENANT_STEP["aggregate"], markers, round_index)
    result = log.finish(env, round_index, steps.sample_clients(job, round_index))
    return aggregate.record_round(env, round_index, previous, log.clients, result)


def aggregate_component(
    job_path: str,
    previous_path: str,
    marker_paths: list[str],
    state_path: str,
    metrics: common.MetricsSink | None = None,
) -> None:
    """Body of the ``secure-aggregate`` component."""

    def body() -> None:
        job = common.read_job_artifact(job_path)
        result = aggregate_run(
            job, common.read_marker(previous_path), [common.read_marker(p) for p in marker_paths]
        )
        common.write_marker(state_path, result)
        common.log_metrics(metrics, {"round": result["round"], **result["metrics"]})

    common.setup_logging()
    common.guarded(body)
