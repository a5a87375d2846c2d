"""Client weights of a weighted mean: by claimed sample counts, or uniform.

FedAvg (McMahan et al. 2017) weights client k by n_k / n. A tenant reports n_k itself, so a
provider that cannot audit it may prefer equal weights; the counts are capped before they get
here (update validation rejects a claim above the tenant's declared bound).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

WeightMode = Literal["samples", "uniform"]


def client_weights(mode: WeightMode, sample_counts: Sequence[int]) -> list[float]:
    """One weight per client, in the order of ``sample_counts`` (normalised by the caller).

    Raises:
        ValueError: An unknown mode, or a non-positive count under ``samples``.
    """
    if mode == "uniform":
        return [1.0] * len(sample_counts)
    if mode != "samples":
        raise ValueError(f"unknown aggregation weights {mode!r}; use 'samples' or 'uniform'")
    if any(n < 1 for n in sample_counts):
        raise ValueError(f"sample counts must be positive, got {list(sample_counts)}")
    return [float(n) for n in sample_counts]
