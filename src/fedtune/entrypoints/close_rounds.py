"""Provider, after a run's round loop: check the rounds are stored, tabulate them, go on or stop.

``python -m fedtune.entrypoints.close_rounds --job JOB.yaml [--stop-after-round K]``

The round loop of a pipeline has one iteration per round still to train; each iteration
trains the first round not yet stored. This step checks that every round up to the run's end
(the job's last round, or ``stop_after_round``) now is, writes the rounds as a Markdown table
for the run page, and says whether the job is complete (so the final evaluation, export and
audit follow) and which tenants the final evaluation covers.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.core.errors import FedtuneError
from fedtune.engines import layout, retention
from fedtune.engines.summary import RoundRecord
from fedtune.entrypoints import common


def _loss(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def rounds_table(records: list[RoundRecord]) -> str:
    """The run's rounds as a Markdown table (what the KFP run page shows)."""
    lines = [
        "| round | sampled | accepted | rejected | train loss | eval loss | seconds |",
        "|---:|---|---|---|---:|---:|---:|",
    ]
    for r in records:
        rejected = ", ".join(f"{t} ({why})" for t, why in sorted(r.rejected.items()))
        lines.append(
            f"| {r.round} | {', '.join(r.sampled)} | {', '.join(r.accepted)} | {rejected} | "
            f"{_loss(r.train_loss)} | {_loss(r.eval_loss)} | {float(r.wall_time['total']):.1f} |"
        )
    return "\n".join(lines) + "\n"


def run(job: JobConfig, last: int) -> dict[str, Any]:
    """Check rounds ``1..last`` are stored; return the records, completeness and tenants.

    Raises:
        FedtuneError: A round of the run is not stored (the loop ran iterations concurrently).
    """
    store = layout.JobStores(job).provider()  # records only: no algorithm, no torch
    missing = [
        r
        for r in range(1, last + 1)
        if not retention.round_recorded(store, r)
    ]
    if missing:
        raise FedtuneError(
            f"the round loop ended but rounds {missing} of job {job.name!r} are not stored in "
            f"{store.uri}: the loop's iterations did not run one at a time",
            fix="Use a KFP backend that honours ParallelFor parallelism (2.2 or later), then "
            "create a run with resume_run_id set to this run's id: stored rounds are kept.",
        )
    records = [RoundRecord.from_json(store.get_json(layout.summary_key(r))) for r in range(1, last + 1)]
    return {
        "last": last,
        "complete": last == job.rounds,
        "tenants": sorted(t.name for t in job.tenants),
        "records": records,
    }


def component(
    job_path: str,
    init_path: str,
    state_path: str,
    table_path: str,
    metrics: common.MetricsSink | None = None,
) -> tuple[bool, list[str]]:
    """Body of the ``close-rounds`` KFP component: (complete, tenants)."""

    def body() -> tuple[bool, list[str]]:
        job = common.read_job_artifact(job_path)
        init = common.read_marker(init_path)  # server init's marker lists the run's rounds
        rounds = [int(r) for r in init.get("rounds", [job.rounds])]
        result = run(job, rounds[-1])
        records: list[RoundRecord] = result["records"]
        Path(table_path).parent.mkdir(parents=True, exist_ok=True)
        Path(table_path).write_text(rounds_table(records), "utf-8")
        common.log_metrics(metrics, {**records[-1].metrics(), "rounds_completed": result["last"]})
        common.write_marker(state_path, {"round": result["last"], "complete": result["complete"]})
        return result["complete"], result["tenants"]

    common.setup_logging()
    return common.guarded(body)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = common.job_parser(__doc__.splitlines()[0], "close_rounds")
    parser.add_argument("--stop-after-round", type=int, default=0, metavar="K", help="last round")
    return parser.parse_args(argv)


def _body(args: argparse.Namespace) -> dict[str, Any]:
    job = common.read_job(args.job, args.job_json)
    result = run(job, args.stop_after_round or job.rounds)
    return {"last": result["last"], "complete": result["complete"], "tenants": result["tenants"]}


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of the step."""
    common.run_main(_parse, _body, argv)


if __name__ == "__main__":
    main()
