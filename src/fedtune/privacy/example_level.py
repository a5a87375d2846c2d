"""Epsilon of a tenant's example-level DP-SGD, from Opacus' own accountants.

Each local step of DP-SGD (Abadi et al. 2016, Algorithm 1) is a Poisson-subsampled Gaussian
mechanism: every training example joins the step's batch independently with probability
``q = batch_size / N`` (Opacus' ``UniformWithReplacementSampler``, the sampling its accountants
assume), and the sum of clipped per-example gradients gets N(0, sigma^2 C^2) noise. Adjacency
is add/remove one example of the tenant's training set. Steps compose over all rounds the
tenant trained in; the history of ``(sigma, q, steps)`` per round is all an accountant needs,
so it is what the tenant keeps (in its own store) and epsilon is recomputed from it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

Step = tuple[float, float, int]  # (noise multiplier, sample rate, steps) of one round
ADJACENCY = "add/remove one training example of the tenant"
SAMPLING = "Poisson (each example independently with probability batch_size / N per step)"


def sample_rate(batch_size: int, num_examples: int) -> float:
    """q of Poisson sampling with an expected batch of ``batch_size`` (1: every example)."""
    return min(1.0, batch_size / num_examples)


def epsilon(history: Sequence[Step], delta: float, accountant: str = "rdp") -> float:
    """Epsilon at ``delta`` after the DP-SGD steps in ``history`` (0 when it is empty)."""
    if not history:
        return 0.0
    from opacus.accountants import create_accountant

    acc = create_accountant(accountant)
    acc.history = [(float(z), float(q), int(k)) for z, q, k in history]
    with warnings.catch_warnings():  # few steps: the best RDP order is the smallest (still valid)
        warnings.filterwarnings("ignore", message="Optimal order is the")
        return float(acc.get_epsilon(delta=delta))
