"""The accountant's epsilon equals dp-accounting's for the same mechanism, built here directly."""

from __future__ import annotations

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

from fedtune.privacy.accountant import ADD_REMOVE, REPLACE_ONE, Sampling, epsilon, rounds_within


def _library_every_tenant(z: float, rounds: int, delta: float) -> float:
    accountant = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), rounds))
    return float(accountant.get_epsilon(delta))


def _library_sampled(n: int, m: int, z: float, rounds: int, delta: float) -> float:
    # Replace-one: one clipped delta swapped for another moves the sum by 2C.
    accountant = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    event = dp_accounting.SampledWithoutReplacementDpEvent(n, m, dp_accounting.GaussianDpEvent(z / 2))
    for _ in range(rounds):
        accountant.compose(event)
    return float(accountant.get_epsilon(delta))


@pytest.mark.parametrize(("z", "rounds", "delta"), [(1.0, 1, 1e-5), (0.7, 10, 1e-5), (2.5, 40, 1e-6)])
def test_every_tenant_every_round_is_the_gaussian_mechanism(z: float, rounds: int, delta: float) -> None:
    sampling = Sampling(population=4, sampled=4)
    assert sampling.adjacency == ADD_REMOVE
    assert epsilon(sampling, [z] * rounds, delta) == pytest.approx(_library_every_tenant(z, rounds, delta), rel=1e-9)


@pytest.mark.parametrize(("n", "m", "z", "rounds"), [(10, 3, 1.0, 5), (100, 10, 2.0, 20)])
def test_sampling_without_replacement_is_accounted_as_such(n: int, m: int, z: float, rounds: int) -> None:
    sampling = Sampling(population=n, sampled=m)
    assert sampling.adjacency == REPLACE_ONE
    assert epsilon(sampling, [z] * rounds, 1e-5) == pytest.approx(_library_sampled(n, m, z, rounds, 1e-5), rel=1e-9)


def test_rounds_with_less_noise_cost_more() -> None:
    sampling = Sampling(population=3, sampled=3)
    assert epsilon(sampling, [1.0, 0.5], 1e-5) > epsilon(sampling, [1.0, 1.0], 1e-5)


def test_the_budget_allows_exactly_the_rounds_that_fit() -> None:
    sampling = Sampling(population=3, sampled=3)
    target = (_library_every_tenant(1.0, 4, 1e-5) + _library_every_tenant(1.0, 5, 1e-5)) / 2
    assert rounds_within(sampling, [], 1.0, 1e-5, target, most=50) == 4
    assert rounds_within(sampling, [1.0, 1.0], 1.0, 1e-5, target, most=50) == 4
    assert rounds_within(sampling, [], 1.0, 1e-5, target, most=3) == 3
    assert rounds_within(sampling, [], 1.0, 1e-5, 0.01, most=50) == 0
