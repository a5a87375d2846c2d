"""``fedtune bench``: measured ratios, printed side by side from one run (never timed tests)."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fedtune.config import load_job
from fedtune.engines.local import RunOptions, run_job
from fedtune.tracking.base import NullTracker

out = Console(highlight=False)


def engine_report(summary: dict[str, Any]) -> dict[str, Any]:
    """Overhead and byte ratios of every round of a run summary.

    ``overhead`` = round wall time / (local training + aggregation compute);
    ``overhead_with_eval`` also counts the tenants' held-out evaluation as compute.
    ``bytes_ratio`` = bytes a tenant's update occupies in the store / its raw tensor bytes.
    """
    rows = []
    for record in summary["rounds"]:
        tenants = record["tenants"].values()
        train = sum(t["train_seconds"] or 0.0 for t in tenants)
        evals = sum(t.get("eval_seconds") or 0.0 for t in tenants)
        aggregate = record["wall_time"]["aggregate_compute"]
        wall = record["wall_time"]["total"]
        ratios = [t["bytes_received"] / t["raw_update_bytes"] for t in tenants if t["raw_update_bytes"]]
        rows.append(
            {
                "round": record["round"],
                "wall_seconds": wall,
                "compute_seconds": train + aggregate,
                "overhead": wall / (train + aggregate),
                "overhead_with_eval": wall / (train + evals + aggregate),
                "bytes_per_tenant": statistics.mean(t["bytes_received"] for t in tenants),
                "raw_bytes_per_tenant": statistics.mean(t["raw_update_bytes"] for t in tenants),
                "bytes_ratio": max(ratios),
            }
        )
    steady = rows[1:] or rows  # round 1 also pays for building the model and tokenizer
    return {
        "rounds": rows,
        "steady_overhead": statistics.mean(r["overhead"] for r in steady),
        "steady_overhead_with_eval": statistics.mean(r["overhead_with_eval"] for r in steady),
        "bytes_ratio": max(r["bytes_ratio"] for r in rows),
    }


def _bench_engine(args: argparse.Namespace) -> int:
    job = load_job(args.job)
    with tempfile.TemporaryDirectory() as workdir:
        update: dict[str, Any] = {"workdir": workdir, "exchange_uri": None}
        if args.rounds:
            update["rounds"] = args.rounds
        job = job.model_copy(update=update)
        job = job.model_copy(
            update={"tenants": [t.model_copy(update={"store_uri": None}) for t in job.tenants]}
        )
        summary = run_job(job, NullTracker(), RunOptions(progress=not args.no_progress))
    report = engine_report(summary)
    table = Table(title=f"engine benchmark: {job.name} ({job.algorithm.name})")
    for column in ("round", "wall s", "train+agg s", "overhead", "w/ eval", "bytes/tenant", "raw", "bytes ratio"):
        table.add_column(column, justify="right")
    for row in report["rounds"]:
        table.add_row(
            str(row["round"]),
            f"{row['wall_seconds']:.2f}",
            f"{row['compute_seconds']:.2f}",
            f"{row['overhead']:.3f}",
            f"{row['overhead_with_eval']:.3f}",
            f"{row['bytes_per_tenant']:,.0f}",
            f"{row['raw_bytes_per_tenant']:,.0f}",
            f"{row['bytes_ratio']:.4f}",
        )
    out.print(table)
    out.print(
        f"steady-state overhead {report['steady_overhead']:.3f} (aim <= 1.10), "
        f"with eval as compute {report['steady_overhead_with_eval']:.3f}; "
        f"bytes {report['bytes_ratio']:.4f} x raw (aim <= 1.01)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


def register_bench(sub: Any) -> None:
    """Add ``fedtune bench`` to the CLI."""
    p = sub.add_parser("bench", help="benchmarks that print measured ratios")
    kinds = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    engine = kinds.add_parser(
        "engine",
        help="engine overhead and bytes per round versus raw tensor bytes",
        description="Run JOB.yaml in a temporary work directory (no tracking) and report, per "
        "round, wall time / (local training + aggregation compute) and the bytes each tenant's "
        "update takes in the store / its raw tensor bytes.",
    )
    engine.add_argument("job", help="path of the job YAML file")
    engine.add_argument("--rounds", type=int, help="override the number of rounds")
    engine.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    engine.add_argument("--no-progress", action="store_true", help="no progress bars")
    engine.set_defaults(handler=_bench_engine)
