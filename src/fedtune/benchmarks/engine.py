"""Engine overhead and bytes per round, read from a run summary (``fedtune bench engine``)."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["engine_report"]


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
        ratios = [
            t["bytes_received"] / t["raw_update_bytes"] for t in tenants if t["raw_update_bytes"]
        ]
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
