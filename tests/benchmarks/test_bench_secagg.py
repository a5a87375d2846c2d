"""The secure-aggregation overhead benchmark and its generated table in docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.benchmarks.report import secagg_lines
from fedtune.benchmarks.secagg import SecAggSpec, secagg_overhead

ROOT = Path(__file__).resolve().parents[2]


def test_secagg_rows_measure_plain_and_secure_side_by_side() -> None:
    spec = SecAggSpec(tenants=(3, 10), neighbours=("all", "auto", "4"), tensors=2, tensor_size=256, reps=1)
    said: list[str] = []
    out = secagg_overhead(spec, said.append)
    rows = {(r["tenants"], r["neighbours"]): r for r in out["rows"]}
    # n=3: auto and 4 are the complete graph already, so only "all" is measured.
    assert sorted(rows) == [(3, "all"), (10, "4"), (10, "all"), (10, "auto")]
    for r in rows.values():
        assert r["max_abs_diff"] < 1e-6  # the secure mean is the plain one
        assert r["secure_up_bytes"] > 2 * 512 * 4  # an int64 word per float32 parameter
        assert r["up_ratio"] == pytest.approx(r["secure_up_bytes"] / r["plain_up_bytes"], rel=1e-3)
        assert r["time_ratio"] > 0 and len(said) == len(rows)
    # Shares go to neighbourhoods: fewer neighbours, less to download.
    assert rows[(10, "4")]["secure_down_bytes"] < rows[(10, "all")]["secure_down_bytes"]
    assert rows[(10, "4")]["degree"] == 4 and rows[(10, "4")]["threshold"] == 3
    assert "| 10 | 4 | 4 | 3 |" in "\n".join(secagg_lines(out))
