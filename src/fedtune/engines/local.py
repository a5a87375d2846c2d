"""The in-process engine: rounds -> tenants -> aggregation in one process, with progress bars.

It runs the very step functions the KFP components run, so a local run and a cluster run
share their behaviour, store layout and resume logic.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from fedtune.config.job import JobConfig, TrainingConfig
from fedtune.core.errors import ConfigError, FedtuneError, StopRequested
from fedtune.core.update_meta import check_eval_metrics
from fedtune.engines import layout, privacy_steps, retention, steps, stopping
from fedtune.engines.fingerprint import check_resumable, run_record
from fedtune.engines.preflight import run_checks
from fedtune.engines.provider import ranks, secagg as secagg_provider
from fedtune.engines.provider.audit import record_audit
from fedtune.engines.summary import RoundRecord, build_summary
from fedtune.engines.tenant.tasks import TenantKind
from fedtune.engines.workers import (
    InProcessRunner,
    Outcome,
    Task,
    WorkerPool,
    peak_memory,
    pool_plan,
    tenant_runner,
)
from fedtune.tracking.base import Tracker
from fedtune.training.progress import rich_progress

log = logging.getLogger(__name__)

Events = Callable[[dict[str, Any]], None]
"""Receives one event per tenant step and per round as it happens (see :func:`step_event`)."""


@dataclass(frozen=True)
class RunOptions:
    """How to run: resume or start fresh, stop early, show progress, report events."""

    resume: bool = False
    fresh: bool = False
    until_round: int | None = None  # stop after this round (chained runs, tests)
    progress: bool = True
    workers: int | str = 1  # tenant steps at once in spawned processes ("auto": one per core)
    events: Events | None = None  # e.g. the CLI's line log when stdout is not a terminal


def discard_stored_run(env: steps.ProviderEnv) -> None:
    """``--fresh``: delete the job's provider-private state and every tenant's exchange prefix."""
    for store in (env.store(), env.stores.exchange_root()):
        for key in store.list():
            store.delete(key)


def _prepare_run(env: steps.ProviderEnv, options: RunOptions) -> tuple[dict[str, Any], bool]:
    """The run's record, and whether a stored run must be discarded (``--fresh``) first.

    Writes nothing: the caller stores the record once the preflight checks pass.
    """
    store = env.store()
    new = {**run_record(env.job), "run_id": None}
    # A run that stored no initial state never started (it failed or was killed first):
    # nothing of it is worth keeping, so it does not block a plain run.
    if store.exists(layout.RUN_KEY) and store.exists(f"{layout.state_key(0)}.json"):
        if options.fresh:
            return new, True
        if not options.resume:
            raise ConfigError(
                f"job {env.job.name!r} already has stored state at {store.uri}",
                fix="Pass --resume to continue it, --fresh to discard it, or rename the job.",
            )
        return check_resumable(store.get_json(layout.RUN_KEY), env.job, store.uri), False
    return new, False


def preflight(tenants: steps.TenantEnvs) -> list[str]:
    """Read every tenant's data once, so bad data fails before any training, all at once.

    Returns warnings about data that trains but poorly (fewer records than a batch, nothing
    held out for evaluation); the run summary lists them.

    A simulation convenience of the engines that run every tenant in this process; on a
    cluster each tenant's pod reads only its own data.
    """
    problems: list[str] = []
    warnings: list[str] = []
    kinds: list[type[FedtuneError]] = []
    for name in tenants.names:
        try:
            warnings += data_warnings(tenants[name].job.training, tenants[name].data())
        except FedtuneError as exc:
            # Each tenant's own details stay in its store; the run reports only the redacted kind.
            where = steps.keep_failure_details(tenants[name], "preflight", exc)
            problems.append(f"tenant {name}: {exc.redacted().render()}; details: {where}")
            kinds.append(type(exc))
    if problems:
        # The first problem's kind sets the exit code; each kind's own fix is fixed text, so
        # it may be shown here (the instance's fix may quote the tenant's values: details file).
        fixes = " ".join(dict.fromkeys(k.fix for k in kinds))
        raise kinds[0](
            f"{len(problems)} tenant dataset(s) cannot be used:\n  " + "\n  ".join(problems),
            fix=f"{fixes} Each tenant reads its exact error and fix in the details file named "
            "above; after it corrects its data, run again.",
        )
    for warning in warnings:
        log.debug("%s", warning)
    return warnings


def data_warnings(training: TrainingConfig, data: steps.TenantData) -> list[str]:
    """What makes a tenant's data train poorly without failing: too few records, no eval split."""
    out = []
    batch = training.batch_size
    if len(data.train) < batch:
        out.append(
            f"tenant {data.tenant}: {len(data.train)} training record(s), fewer than "
            f"training.batch_size={batch}; every step sees the same records (add data or "
            "lower batch_size)"
        )
    if not data.eval:
        out.append(
            f"tenant {data.tenant}: no held-out records (training.eval_fraction="
            f"{training.eval_fraction}); its eval loss is not measured (add data or raise "
            "eval_fraction)"
        )
    return out


def run_job(job: JobConfig, tracker: Tracker, options: RunOptions = RunOptions()) -> dict[str, Any]:
    """Run (or resume) a job to its last round and export; return the run summary."""
    env = steps.ProviderEnv.create(job)
    info, discard = _prepare_run(env, options)
    privacy_note: dict[str, Any] = {}
    if job.differential_privacy is not None:  # stop before a round that would exceed the target
        job, privacy_note = privacy_steps.plan_rounds(job, env.store(), fresh=discard)
        env = steps.ProviderEnv.create(job)
    finished_key = layout.run_summary_key(job.rounds)
    if not discard and env.store().exists(finished_key):
        log.warning("job %r already finished its %d rounds; nothing to do", job.name, job.rounds)
        return dict(env.store().get_json(finished_key))
    tenants = steps.TenantEnvs(job)
    # Nothing of the run is stored before they pass; missing hub models are fetched first.
    warnings = run_checks(job, tenants=tenants, download=True)
    pool_plan(job, options.workers)  # as are the workers and their devices
    if discard:
        discard_stored_run(env)
    env.store().put_json(layout.RUN_KEY, info)
    # Workers start now, so their imports and warm-up overlap the provider's initialisation.
    with tenant_runner(job, tenants, options.workers) as runner:
        summary = _run_rounds(env, runner, tracker, options, info)
    if isinstance(runner, WorkerPool):
        summary["workers"] = runner.report()  # device and peak memory of each worker
    summary["engine_peak_rss_mib"] = peak_memory("cpu")["peak_rss_mib"]  # this process's
    summary["warnings"] = warnings
    if job.differential_privacy is not None:
        summary["privacy"] = privacy_steps.summary(job, env.store(), privacy_note)
    if summary["completed"]:
        env.store().put_json(finished_key, summary)
    return summary


def _run_rounds(
    env: steps.ProviderEnv,
    runner: InProcessRunner | WorkerPool,
    tracker: Tracker,
    options: RunOptions,
    info: dict[str, Any],
) -> dict[str, Any]:
    job = env.job
    store = env.store()
    run_id = tracker.start(
        run_name=job.name,
        params={"job": job.model_dump(mode="json"), "algorithm": env.algorithm.params()},
        tags={"fedtune.algorithm": job.algorithm.name, "fedtune.engine": "local"},
        run_id=info.get("run_id"),
    )
    if info.get("run_id") != run_id:
        store.put_json(layout.RUN_KEY, {**info, "run_id": run_id})
    last = min(job.rounds, options.until_round or job.rounds)
    run_info: dict[str, Any] = {}
    try:
        ranks.provider_step(env, "init")
        run_info = log_initial_state(env, tracker)
        summary_extra: dict[str, Any] = {}
        emit = options.events or _ignore
        with _progress(options.progress) as bar:
            if options.progress and isinstance(runner, InProcessRunner):
                runner.tenants.show_progress(rich_progress(bar))
            rounds_task = bar.add_task("rounds", total=last)
            for round_index in range(1, last + 1):
                stopping.check(f"before round {round_index} of {job.rounds}")
                _run_round(env, runner, round_index, tracker, bar, emit)
                bar.advance(rounds_task)
            if last == job.rounds:
                stopping.check("before the final evaluation and export")
                summary_extra = _finish(env, runner, tracker, bar, emit)
        tracker.end("FINISHED")
    except BaseException as exc:
        tracker.end("KILLED" if isinstance(exc, StopRequested | KeyboardInterrupt) else "FAILED")
        raise
    records = [
        RoundRecord.from_json(store.get_json(layout.summary_key(r)))
        for r in range(1, last + 1)
    ]
    return build_summary(
        job, records, run_id=run_id, completed=last == job.rounds, run_info=run_info, **summary_extra
    )


def log_initial_state(env: steps.ProviderEnv, tracker: Tracker) -> dict[str, Any]:
    """Log what the algorithm's initial state records: ``run_info`` as params, metrics at 0.

    Returns ``run_info`` (facts such as FedBiOT's layer split) for the run summary.
    """
    meta = env.store().get_json(f"{layout.state_key(0)}.json")
    run_info = dict(meta.get("run_info") or {})
    if run_info:
        tracker.log_params({"run_info": run_info})
    metrics = {
        f"server/{k}": float(v)
        for k, v in (meta.get("metrics") or {}).items()
        if isinstance(v, int | float) and math.isfinite(v)
    }
    if metrics:
        tracker.log_metrics(metrics, step=0)
    return run_info


def _run_round(
    env: steps.ProviderEnv,
    runner: InProcessRunner | WorkerPool,
    round_index: int,
    tracker: Tracker,
    bar: Progress,
    emit: Events,
) -> None:
    store = env.store()
    if retention.round_recorded(store, round_index):  # completed before a restart
        # A kill after the record was stored may have cut its metrics off: log them from
        # the record (the tracker skips what the run already holds).
        record = RoundRecord.from_json(store.get_json(layout.summary_key(round_index)))
        tracker.log_metrics(record.metrics(), step=round_index)
        return
    dp = env.job.differential_privacy is not None
    if dp:
        privacy_steps.check_budget(env, round_index)
    started = time.perf_counter()
    configure = steps.configure_step(env, round_index)
    sampled = steps.sample_clients(env.job, round_index)
    if dp:
        privacy_steps.publish_plan(env, round_index, sampled)
    task = bar.add_task(f"round {round_index}", total=len(sampled))

    def done(outcome: Outcome) -> None:
        bar.update(task, description=f"round {round_index}: {outcome.task.tenant} done")
        bar.advance(task)
        emit(step_event(outcome, env.job.rounds))
        stopping.check(f"in round {round_index}, after tenant {outcome.task.tenant}'s step")

    if env.job.secure_aggregation.enabled:
        clients, aggregate = secagg_provider.run_round(env, runner, round_index, sampled, done)
    else:
        # A tenant's failure costs its update, not the round: the quorum decides.
        outcomes = runner.run([Task("client", round_index, name) for name in sampled], done)
        clients = {n: o.result for n, o in outcomes.items() if o.result is not None}
        failed = {n: str(o.failure) for n, o in outcomes.items() if o.result is None}
        aggregate = ranks.provider_step(env, "aggregate", round_index, sampled, failed)
    bar.remove_task(task)
    record = RoundRecord.build(
        round_index, sampled, configure, clients, aggregate, time.perf_counter() - started
    )
    store.put_json(layout.summary_key(round_index), record.to_json())
    retention.prune(env, round_index)  # the round is recorded: older states may go
    tracker.log_metrics(record.metrics(), step=round_index)
    emit({
        "event": "round", "round": round_index, "rounds": env.job.rounds,
        "sampled": len(sampled), "accepted": len(record.accepted), "rejected": record.rejected,
        "train_loss": record.train_loss, "eval_loss": record.eval_loss,
        "seconds": record.wall_time["total"],
    })


def step_event(outcome: Outcome, rounds: int) -> dict[str, Any]:
    """The event of a finished tenant step: which, of whom, whether it produced a result."""
    seconds = (outcome.result or {}).get("seconds")
    return {
        "event": "tenant_step", "round": outcome.task.round_index, "rounds": rounds,
        "kind": outcome.task.kind, "tenant": outcome.task.tenant,
        "ok": outcome.result is not None,
        "seconds": seconds if isinstance(seconds, int | float) else None,
        **({"failure": outcome.failure} if outcome.failure else {}),
    }


def _ignore(event: dict[str, Any]) -> None:
    return None


def _finish(
    env: steps.ProviderEnv,
    runner: InProcessRunner | WorkerPool,
    tracker: Tracker,
    bar: Progress,
    emit: Events,
) -> dict[str, Any]:
    """Evaluate the final model on every tenant, export, log and register it, then audit it."""
    names = [t.name for t in env.job.tenants]
    steps.final_broadcast_step(env)
    evaluated = _final_tenant_steps(runner, "evaluate", env.job.rounds, names, bar, emit)
    # Numbers under declared keys only: a tenant's evaluation goes into MLflow and the summary.
    final_eval = {n: check_eval_metrics(n, evaluated[n]["metrics"]) for n in names}
    env.store().put_json(layout.FINAL_EVAL_KEY, final_eval)
    artifacts = export_and_register(env, tracker, final_eval)
    out: dict[str, Any] = {"artifacts": artifacts, "final_eval": final_eval}
    audited = env.job.audited_tenants
    if audited:
        _final_tenant_steps(runner, "audit", env.job.rounds, audited, bar, emit)
        out["audit"] = record_audit(env, tracker, artifacts)
    return out


def _final_tenant_steps(
    runner: InProcessRunner | WorkerPool,
    kind: TenantKind,
    rounds: int,
    names: list[str],
    bar: Progress,
    emit: Events,
) -> dict[str, dict[str, Any]]:
    """Run an after-training tenant step for ``names``; every one must succeed."""
    task = bar.add_task(kind, total=len(names))

    def done(outcome: Outcome) -> None:
        bar.advance(task)
        emit(step_event(outcome, rounds))

    outcomes = runner.run([Task(kind, rounds, n) for n in names], done)
    bar.remove_task(task)
    failures = {n: o.failure for n, o in outcomes.items() if o.result is None}
    if failures:
        raise FedtuneError(
            f"the final {kind} step failed for {sorted(failures)}: "
            + "; ".join(f"{n}: {f}" for n, f in sorted(failures.items())),
            fix=f"Each tenant reads its details in its own store (errors/{kind}.txt); after "
            "fixing them, run again with --resume.",
        )
    return {n: dict(outcomes[n].result or {}) for n in names}


def export_and_register(
    env: steps.ProviderEnv, tracker: Tracker, final_eval: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """Log the final metrics, export the final models and register those marked so.

    Shared by the local engine and the KFP export step, so both name models alike.
    Returns each artifact's store URI, local path and registered version.
    """
    job = env.job
    tracker.log_metrics(
        {f"final/{k}/{t}": v for t, m in final_eval.items() for k, v in m.items()},
        step=job.rounds,
    )
    exported = steps.export_step(env, env.stores.workdir / "artifacts" / job.name)
    # Several registered models of one run (e.g. FedBiOT's AdapEmu and AdapFu) each get a
    # registered model of their own, `<name>-<artifact>`, so one alias cannot point at two;
    # an artifact called "model" is the run's main model and keeps `<name>` (FedPT's
    # proxy-tuned composite beside `<name>-small`).
    several = sum(1 for artifact, _ in exported.values() if artifact.register) > 1
    artifacts: dict[str, Any] = {}
    for name, (artifact, uri) in exported.items():
        entry: dict[str, Any] = {"uri": uri, "local_path": str(artifact.path), "kind": artifact.kind}
        if artifact.register:
            base_name = job.registered_model_name
            ref = tracker.log_model(
                artifact.path,
                name=name,
                registered_name=base_name if not several or name == "model" else f"{base_name}-{name}",
                alias=job.tracking.alias,
                tags=artifact.tags,
            )
            entry["model_uri"] = ref.model_uri
            entry["registered_name"] = ref.registered_name
            entry["registered_version"] = ref.version
        artifacts[name] = entry
    return artifacts


class _Quiet:
    """Stand-in for a rich Progress when progress bars are off."""

    def __enter__(self) -> _Quiet:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def _progress(enabled: bool) -> Any:
    if not enabled:
        return _Quiet()
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        transient=False,
    )


def default_summary_path(job: JobConfig) -> Path:
    """Where the CLI writes the summary unless told otherwise."""
    return Path(job.workdir) / "runs" / job.name / "summary.json"
