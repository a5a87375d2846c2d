"""Who takes part in a round and how much each may weigh: the seeded sample of tenants and
the cap on the sample count a tenant claims. The provider draws and checks with these, and so
does a tenant's secure-aggregation step (its roster and its own update).
"""

from __future__ import annotations

import random

from fedtune.core.errors import UpdateRejected
from fedtune.training.context import derive_seed


def sample_names(names: list[str], k: int, seed: int, round_index: int) -> list[str]:
    """A seeded sample of ``k`` of ``names`` for ``round_index``, sorted (what
    :func:`~fedtune.engines.steps.sample_clients` draws; a secure-aggregation tenant draws it
    too)."""
    names = sorted(names)
    if k >= len(names):
        return names
    rng = random.Random(derive_seed(seed, "sample", round_index))
    return sorted(rng.sample(names, k))


def check_sample_count(tenant: str, value: object, cap: int) -> None:
    """Refuse an update whose ``num_samples`` is not a positive integer within ``cap``.

    Raises:
        UpdateRejected: Not a positive integer, or above the cap.
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UpdateRejected(f"tenant {tenant!r}: num_samples must be a positive integer, got {value!r}")
    if value > cap:
        raise UpdateRejected(
            f"tenant {tenant!r}: num_samples={value} exceeds its cap of {cap} (tenants[].max_samples "
            "or limits.max_samples_per_tenant); a larger claim would dominate the weighted mean"
        )
