"""Secure aggregation for every algorithm whose aggregation needs only a sum of tensors.

Per algorithm, one round twice, plain and secure: the mean the provider unmasks equals the
weighted mean of the very updates the tenants computed (to fixed-point precision), and the
state the algorithm folds from it matches the plain run's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from fedtune.algorithms.base import SecureSum
from fedtune.algorithms.registry import get_algorithm
from fedtune.config import JobConfig
from fedtune.config.algorithms import summed_update_algorithms
from fedtune.core.messages import ServerState
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.engines.tenant import secagg as secagg_steps
from fedtune.tracking.base import NullTracker
from tests.helpers.algorithms import one_per_section, smoke
from tests.integration.test_algorithm_table import JOB_OVERRIDES, TABLE

pytestmark = pytest.mark.slow
QUIET = RunOptions(progress=False)
FRAC = 24
#: Every algorithm secure aggregation accepts, one per config section (two whole jobs a row),
#: but those that run a single tenant (offsite-tuning), which it refuses: one update's sum is
#: that update.
SUMMED = [n for n in one_per_section(summed_update_algorithms()) if not smoke(n).single_tenant]


def _record(monkeypatch: pytest.MonkeyPatch, name: str) -> tuple[dict[str, Any], list[SecureSum]]:
    """Capture each tenant's update as it enters masking, and the sum the provider unmasks."""
    parts: dict[str, Any] = {}
    sums: list[SecureSum] = []
    prepare = secagg_steps.prepare_update

    def recording_prepare(env, update, broadcast, parties):  # type: ignore[no-untyped-def]
        encoded, weight = prepare(env, update, broadcast, parties)
        specs = env.algorithm.expected_update_shapes(broadcast)
        parts[env.tenant.name] = ({k: update.tensors[k].clone() for k in specs}, weight)
        return encoded, weight

    monkeypatch.setattr(secagg_steps, "prepare_update", recording_prepare)
    cls = get_algorithm(name)
    fold = cls.aggregate_sum

    def recording_sum(self, ctx, state, summed, round_index):  # type: ignore[no-untyped-def]
        sums.append(summed)
        return fold(self, ctx, state, summed, round_index)

    monkeypatch.setattr(cls, "aggregate_sum", recording_sum)
    return parts, sums


@pytest.mark.parametrize("name", SUMMED)
def test_the_unmasked_mean_is_the_plain_weighted_mean(
    name: str, make_job: Callable[..., JobConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    fields = {"rounds": 1, "algorithm": TABLE[name], **JOB_OVERRIDES.get(name, {})}
    plain = make_job(**fields)
    run_job(plain, NullTracker(), QUIET)
    parts, sums = _record(monkeypatch, name)
    secure = make_job(**fields, secure_aggregation={"enabled": True, "frac_bits": FRAC})
    summary = run_job(secure, NullTracker(), QUIET)
    assert summary["completed"] and len(summary["rounds"][0]["accepted"]) == len(secure.tenants)
    # 1. The sum: sum_i w_i x_i / sum_i w_i from the tenants' own tensors, in float64.
    (summed,) = sums
    total = sum(w for _, w in parts.values())
    assert summed.total_weight == total and sorted(summed.metas) == sorted(parts)
    bound = len(parts) * 2.0 ** -(FRAC + 1) / total
    for key, got in summed.mean.items():
        want = sum(t[key].to(torch.float64) * w for t, w in parts.values()) / total
        err = (got.to(torch.float64) - want).abs() - 2.0**-23 * want.abs()  # float32 storage
        assert float(err.max()) <= bound, (key, float(err.max()), bound)
    # 2. What the algorithm folds from it: the plain run's next state.
    store_p, store_s = (layout.JobStores(j).provider() for j in (plain, secure))
    a, b = ServerState.load(store_p, layout.state_key(1)), ServerState.load(store_s, layout.state_key(1))
    assert sorted(a.tensors) == sorted(b.tensors)
    for key in a.tensors:
        assert torch.allclose(a.tensors[key].double(), b.tensors[key].double(), atol=1e-4, rtol=0), key
    if name == "fedbiot":
        assert a.meta["holders"] == b.meta["holders"]  # per-tenant package versions, from clear metadata
    assert np.isfinite(summary["rounds"][0]["server_metrics"]["secagg/protocol_bytes"])
