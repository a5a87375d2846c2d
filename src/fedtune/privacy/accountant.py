"""Epsilon at delta for the rounds a job has run, from ``dp-accounting``'s RDP accountant.

One round releases the sum of the sampled tenants' clipped deltas plus N(0, z^2 C^2): a
(sub)sampled Gaussian mechanism over tenants (client-level DP: the unit protected is a tenant's
whole dataset). The event matches how the engine samples, not an approximation of it:

- every tenant every round (``clients_per_round`` unset or equal to the tenants): no sampling,
  ``GaussianDpEvent(z)`` under add/remove-one-tenant adjacency (sensitivity C: a tenant's
  clipped delta is present or zero);
- ``m`` of ``N`` tenants drawn uniformly without replacement (``fedtune.engines.steps.
  sample_clients``): ``SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(z / 2))`` under
  replace-one adjacency, the only relation the library (and Wang, Balle, Kasiviswanathan 2019,
  Thm. 27) analyses for it; replacing one clipped delta by another moves the sum by up to 2C,
  hence ``z / 2``. Accounting the engine's fixed-size sample as Poisson sampling (what DP-FedAvg's
  Algorithm 1 samples) would understate epsilon (Lebeda et al. 2024), so we do not.

Rounds compose under RDP; runs of equal noise multipliers are composed at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

# dp_accounting (scipy underneath) is imported when epsilon is computed, not by every run of
# the engine that imports this module: about 0.6 s of start-up for jobs without DP.

ADD_REMOVE = "add/remove one tenant"
REPLACE_ONE = "replace one tenant"


@dataclass(frozen=True)
class Sampling:
    """How many tenants a round draws (``sampled``) out of how many (``population``)."""

    population: int
    sampled: int

    @property
    def adjacency(self) -> str:
        """The neighbouring relation epsilon is stated under."""
        return ADD_REMOVE if self.sampled >= self.population else REPLACE_ONE

    def event(self, noise_multiplier: float) -> dp_accounting.DpEvent:
        """The DP event of one round with noise std ``noise_multiplier * C`` on the sum."""
        import dp_accounting

        if self.sampled >= self.population:
            return dp_accounting.GaussianDpEvent(noise_multiplier)
        return dp_accounting.SampledWithoutReplacementDpEvent(
            self.population, self.sampled, dp_accounting.GaussianDpEvent(noise_multiplier / 2)
        )

    def accountant(self) -> RdpAccountant:
        """An empty RDP accountant under this sampling's adjacency."""
        import dp_accounting
        from dp_accounting.rdp import RdpAccountant

        relation = (
            dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
            if self.sampled >= self.population
            else dp_accounting.NeighboringRelation.REPLACE_ONE
        )
        return RdpAccountant(neighboring_relation=relation)


def epsilon(sampling: Sampling, noise_multipliers: Sequence[float], delta: float) -> float:
    """Epsilon at ``delta`` after rounds with these per-round noise multipliers (0 for none)."""
    accountant = sampling.accountant()
    for z, run in itertools.groupby(noise_multipliers):
        accountant.compose(sampling.event(z), len(list(run)))
    return float(accountant.get_epsilon(delta))


def rounds_within(
    sampling: Sampling, history: Sequence[float], planned: float, delta: float, target: float, most: int
) -> int:
    """How many rounds in all (at most ``most``) keep epsilon at or below ``target``:
    the rounds run (``history``, their actual multipliers) and then rounds at ``planned``."""
    done = len(history)
    if done and epsilon(sampling, history, delta) > target:
        return done  # already over (a round lost noise): no further round
    low, high = done, most  # epsilon grows with every round: the largest fitting count
    while low < high:
        mid = (low + high + 1) // 2
        if epsilon(sampling, [*history, *[planned] * (mid - done)], delta) <= target:
            low = mid
        else:
            high = mid - 1
    return low
