"""Paired comparisons over seeds: the mean difference of two methods and its 95% interval.

Two methods run with the same seed share the suite, the LoRA initialisation, the batch
order and the client sampling, so their difference on that seed is one observation of the
effect with the seed's luck cancelled; the seeds give ``n`` such differences ``d_i``. The
interval is Student's t-interval over them:

    d_bar +- t_{1 - (1 - level)/2, n - 1} * s_d / sqrt(n)

with ``s_d`` the sample standard deviation of the ``d_i`` (the one-sample t-interval of a
paired design, e.g. Wasserman, *All of Statistics*, 10.1). A deterministic method (one run
without a seed: Zero-Shot) pairs with every seed of the other. The t quantile comes from
scipy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

__all__ = ["LEVEL", "PairedDifference", "paired_difference"]

#: Confidence level of every interval the benchmarks report.
LEVEL: Final = 0.95

Seed = int | None


@dataclass(frozen=True)
class PairedDifference:
    """``a - b`` over the paired seeds: mean, its interval (``low``, ``high``), the standard
    deviation of the differences, and the seeds paired (``n`` of them)."""

    mean: float
    low: float
    high: float
    sd: float
    n: int
    seeds: tuple[Seed, ...]
    level: float = LEVEL

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        data = asdict(self)
        data["seeds"] = list(self.seeds)
        return data


def _pairs(a: Mapping[Seed, float], b: Mapping[Seed, float]) -> list[tuple[Seed, float, float]]:
    """(seed, a, b) for every seed both ran; a deterministic side (only key None) pairs
    with every seed of the other."""
    if list(a) == [None]:
        return [(s, a[None], v) for s, v in b.items()]
    if list(b) == [None]:
        return [(s, v, b[None]) for s, v in a.items()]
    return [(s, a[s], b[s]) for s in a if s in b]


def paired_difference(
    a: Mapping[Seed, float], b: Mapping[Seed, float], level: float = LEVEL
) -> PairedDifference | None:
    """The paired difference ``a - b`` (values by seed), or None when no seed pairs.

    With one pair the interval is the point itself and ``sd`` is 0: a verdict must not rest
    on it (see :func:`fedtune.benchmarks.claims.verdict`).
    """
    from scipy.stats import t

    pairs = sorted(_pairs(a, b), key=lambda p: (p[0] is None, p[0] or 0))
    if not pairs:
        return None
    diffs = [x - y for _, x, y in pairs]
    mean = statistics.fmean(diffs)
    n = len(diffs)
    if n < 2:
        return PairedDifference(mean, mean, mean, 0.0, n, tuple(p[0] for p in pairs), level)
    sd = statistics.stdev(diffs)
    half = float(t.ppf(1 - (1 - level) / 2, n - 1)) * sd / math.sqrt(n)
    return PairedDifference(mean, mean - half, mean + half, sd, n, tuple(p[0] for p in pairs), level)
