"""The numbers an audit lets leave a tenant: quantiles, strict parsing, pooling across tenants."""

from __future__ import annotations

from typing import Any

import pytest

from fedtune.core.errors import DataError
from fedtune.eval.memorization import AuditScores, memorization_audit, pool_scores, quantile


def scores(n: int, mean: float, p90: float, top: float, hits: int) -> AuditScores:
    return AuditScores(n=n, mean=mean, p50=mean, p90=p90, max=top, num_at_or_above=hits,
                       threshold=0.7)


def test_quantiles_interpolate_between_order_statistics() -> None:
    values = [0.0, 0.1, 0.2, 0.3, 1.0]
    assert quantile(values, 0.5) == 0.2
    assert quantile(values, 0.9) == pytest.approx(0.3 + 0.6 * 0.7)
    assert quantile([0.4], 0.9) == 0.4


def test_scores_of_a_report_hold_numbers_only() -> None:
    examples = [(f"p{i}", "a b c" if i % 2 else "x y z") for i in range(6)]
    report = memorization_audit(lambda prompt: "a b c", examples, threshold=0.7)
    got = AuditScores.of(report)
    assert (got.n, got.mean, got.max, got.num_at_or_above) == (6, 0.5, 1.0, 3)
    assert AuditScores.from_json(got.to_json()) == got
    assert all(isinstance(v, int | float) for v in got.to_json().values())


@pytest.mark.parametrize(
    "raw",
    [
        {"n": 3, "mean": 0.1, "p50": 0.1, "p90": 0.1, "max": 0.1, "num_at_or_above": 0},
        {"n": 3, "mean": 0.1, "p50": 0.1, "p90": 0.1, "max": 0.1, "num_at_or_above": 0,
         "threshold": 0.7, "generations": ["leak"]},
        {"n": 3, "mean": 1.5, "p50": 0.1, "p90": 0.1, "max": 0.1, "num_at_or_above": 0,
         "threshold": 0.7},
        {"n": 3, "mean": 0.1, "p50": 0.1, "p90": 0.1, "max": 0.1, "num_at_or_above": 4,
         "threshold": 0.7},
        {"n": 0, "mean": 0.1, "p50": 0.1, "p90": 0.1, "max": 0.1, "num_at_or_above": 0,
         "threshold": 0.7},
        {"n": True, "mean": 0.1, "p50": 0.1, "p90": 0.1, "max": 0.1, "num_at_or_above": 0,
         "threshold": 0.7},
        ["not", "an", "object"],
    ],
    ids=["missing-field", "extra-field", "mean-above-one", "more-hits-than-records",
         "no-records", "boolean-count", "not-an-object"],
)
def test_malformed_scores_from_a_tenant_are_refused(raw: Any) -> None:
    with pytest.raises(DataError):
        AuditScores.from_json(raw)


def test_pooling_weights_the_mean_by_records_and_keeps_the_worst_tenant() -> None:
    pooled = pool_scores({
        "a": scores(n=100, mean=0.1, p90=0.2, top=0.5, hits=0),
        "b": scores(n=10, mean=0.9, p90=1.0, top=1.0, hits=9),
    })
    assert pooled["mean"] == pytest.approx((100 * 0.1 + 10 * 0.9) / 110)
    assert (pooled["n"], pooled["num_at_or_above"], pooled["max"]) == (110, 9, 1.0)
    assert (pooled["worst_tenant_mean"], pooled["worst_tenant_p90"]) == (0.9, 1.0)


def test_pooling_one_tenant_returns_its_own_numbers() -> None:
    one = scores(n=5, mean=0.3, p90=0.6, top=0.8, hits=1)
    pooled = pool_scores({"a": one})
    assert (pooled["mean"], pooled["max"], pooled["n"]) == (0.3, 0.8, 5)
