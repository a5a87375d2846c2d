"""Adaptive clipping: Andrew et al. 2021, "Differentially Private Learning with Adaptive
Clipping", Algorithm 1.

Each tenant reports whether its delta fitted under the round's clip norm,
``b_i = 1[||Delta_i|| <= C]``. The provider estimates the unclipped fraction with noise and
moves C geometrically towards the ``gamma`` quantile of the update norms:

    b~ = (sum_i (b_i - 1/2) + N(0, sigma_b^2)) / m + 1/2         (centred bits: sensitivity 1/2)
    C  <- C * exp(-eta_C (b~ - gamma))

``m`` is the expected number of contributions (the sampled count, a public constant), as in
the paper's fixed-denominator estimate; the bits are centred as in its Theorem 1, whose budget
split :meth:`fedtune.config.privacy.DifferentialPrivacyConfig.delta_noise_multiplier` applies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def noised_unclipped_fraction(
    unclipped: Sequence[bool], expected: int, count_noise: float, generator: torch.Generator
) -> float:
    """``b~``: the noised share of updates that were not clipped."""
    centred = sum(1.0 if b else 0.0 for b in unclipped) - 0.5 * len(unclipped)
    noise = float(torch.normal(0.0, count_noise, (1,), generator=generator, dtype=torch.float64))
    return (centred + noise) / expected + 0.5


def next_clip_norm(clip_norm: float, fraction: float, target_quantile: float, learning_rate: float) -> float:
    """The geometric update ``C * exp(-eta_C (b~ - gamma))``."""
    return clip_norm * math.exp(-learning_rate * (fraction - target_quantile))
