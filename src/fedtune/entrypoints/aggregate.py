"""Provider, end of a round: validate the updates, aggregate, record the round.

``python -m fedtune.entrypoints.aggregate --job JOB.yaml --round N [--client-marker PATH ...]``

The client markers say which tenants delivered and why the others did not; the quorum rule
and update validation are those of :func:`fedtune.engines.steps.aggregate_step`. The round's
record (the same :class:`~fedtune.engines.summary.RoundRecord` the local engine writes) goes
to the provider-private store and its metrics to the tracker.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.core.errors import FedtuneError
from fedtune.engines import layout, retention, steps
from fedtune.engines.provider import ranks
from fedtune.engines.summary import RoundRecord
from fedtune.entrypoints import common
from fedtune.storage.base import Store


def _split(
    markers: list[dict[str, Any]], round_index: int, sampled: list[str]
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Client results of the tenants that delivered, and reasons for those that did not."""
    clients: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    for marker in markers:
        tenant = marker.get("tenant")
        if marker.get("round") != round_index or tenant not in sampled:
            raise FedtuneError(
                f"round {round_index}: got a client marker for tenant {tenant!r} of round "
                f"{marker.get('round')!r}, but this round samples {sampled}",
                fix="Recompile the pipeline from the job file; it was wired for another job.",
            )
        if marker.get("ok"):
            clients[tenant] = dict(marker.get("result") or {})
        else:
            failed[tenant] = str(marker.get("reason") or "client step failed")
    return clients, failed


def run(
    job: JobConfig,
    round_index: int,
    configure: dict[str, Any],
    client_markers: list[dict[str, Any]],
) -> dict[str, Any]:
    """Aggregate round ``round_index`` and store its record; return the state marker."""
    stored = stored_round(job, round_index, log=True)
    if stored is not None:
        return stored
    env = steps.ProviderEnv.create(job)
    sampled = steps.sample_clients(job, round_index)
    clients, failed = _split(client_markers, round_index, sampled)
    aggregate = ranks.provider_step(env, "aggregate", round_index, sampled, failed)
    return record_round(env, round_index, configure, clients, aggregate)


def stored_round(job: JobConfig, round_index: int, *, log: bool = False) -> dict[str, Any] | None:
    """The state marker of a round an earlier run completed, or None.

    With ``log``, its metrics are logged from its record too: the run that stored the
    record may have been killed before it logged them (the tracker skips what the run holds).
    """
    store = steps.ProviderEnv.create(job).store()
    summary_key = layout.summary_key(round_index)
    if retention.round_recorded(store, round_index):  # completed by an earlier run
        record = RoundRecord.from_json(store.get_json(summary_key))
        if log:
            _log_round(job, store, round_index, record)
        return {"round": round_index, "skipped": True, "metrics": record.metrics()}
    return None


def _log_round(job: JobConfig, store: Store, round_index: int, record: RoundRecord) -> None:
    common.resume_tracker(job, store).log_metrics(record.metrics(), step=round_index)


def record_round(
    env: steps.ProviderEnv,
    round_index: int,
    configure: dict[str, Any],
    clients: dict[str, dict[str, Any]],
    aggregate: dict[str, Any],
) -> dict[str, Any]:
    """Store the round's record (as the local engine does), log its metrics; return the
    state marker."""
    job, store = env.job, env.store()
    sampled = steps.sample_clients(job, round_index)
    started_at = configure.get("started_at")
    total = time.time() - float(started_at) if started_at else float(aggregate.get("seconds", 0.0))
    record = RoundRecord.build(
        round_index, sampled, configure.get("configure", {}), clients, aggregate, total
    )
    store.put_json(layout.summary_key(round_index), record.to_json())
    retention.prune(env, round_index)  # the round is recorded: older states may go
    _log_round(job, store, round_index, record)
    return {
        "round": round_index,
        "accepted": record.accepted,
        "rejected": record.rejected,
        "metrics": record.metrics(),
    }


def component(
    job_path: str,
    broadcast_path: str,
    update_paths: list[str],
    state_path: str,
    metrics: common.MetricsSink | None = None,
) -> None:
    """Body of the ``aggregate`` KFP component (the round is the broadcast's)."""

    def body() -> None:
        job = common.read_job_artifact(job_path)
        broadcast = common.read_marker(broadcast_path)
        markers = [common.read_marker(p) for p in update_paths]
        result = run(job, int(broadcast["round"]), broadcast, markers)
        common.write_marker(state_path, result)
        common.log_metrics(metrics, {"round": result["round"], **result["metrics"]})

    common.setup_logging()
    common.guarded(body)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = common.job_parser(__doc__.splitlines()[0], "aggregate")
    parser.add_argument("--round", type=int, required=True, help="round number (from 1)")
    parser.add_argument("--configure-marker", metavar="PATH", help="marker of configure_round")
    parser.add_argument(
        "--client-marker", metavar="PATH", action="append", default=[], help="a client marker"
    )
    return parser.parse_args(argv)


def _body(args: argparse.Namespace) -> dict[str, Any]:
    job = common.read_job(args.job, args.job_json)
    configure = common.read_marker(args.configure_marker) if args.configure_marker else {}
    markers = [common.read_marker(p) for p in args.client_marker]
    if not args.client_marker:
        # From a shell, the stored updates speak for themselves: every sampled tenant counts.
        sampled = steps.sample_clients(job, args.round)
        markers = [{"round": args.round, "tenant": t, "ok": True} for t in sampled]
    return run(job, args.round, configure, markers)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of the step."""
    common.run_main(_parse, _body, argv)


if __name__ == "__main__":
    main()
