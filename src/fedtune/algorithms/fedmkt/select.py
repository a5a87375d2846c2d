"""DualMinCE: which sender's knowledge a receiver distils, per public sample (paper 003,
Section 3.2 and Algorithm 2).

For each sample the sender with the smallest CE is picked; its knowledge enters the receiver's
selective set only if that CE is strictly smaller than the receiver's own CE on the sample.
The same rule runs on both sides: on the provider the senders are the tenants' SLMs and the
receiver the LLM; on a tenant the sender is the LLM and the receiver its SLM. Ties between
senders go to the first in the given order (tenants sorted by name). A sample a sender could
not score (absent from its message) counts as CE = +inf.
"""

from __future__ import annotations

import numpy as np

NONE = -1


def dual_min_ce(own_ce: np.ndarray, sender_ce: np.ndarray) -> np.ndarray:
    """Per sample, the index of the chosen sender, or :data:`NONE` (-1).

    Args:
        own_ce: (N,) the receiver's CE per sample.
        sender_ce: (K, N) each sender's CE per sample (+inf where it has none).
    """
    own = np.asarray(own_ce, dtype=np.float64)
    senders = np.atleast_2d(np.asarray(sender_ce, dtype=np.float64))
    if senders.shape[1] != own.shape[0]:
        raise ValueError(f"sender_ce has {senders.shape[1]} samples, own_ce {own.shape[0]}")
    if senders.shape[0] == 0:
        return np.full(own.shape[0], NONE, dtype=np.int64)
    best = np.argmin(np.where(np.isnan(senders), np.inf, senders), axis=0)
    best_ce = senders[best, np.arange(own.shape[0])]
    return np.where(best_ce < own, best, NONE).astype(np.int64)


def ce_by_sample(samples: np.ndarray, ce: np.ndarray, n: int) -> np.ndarray:
    """A message's CE spread over the ``n`` public samples (+inf where it has none)."""
    out = np.full(n, np.inf, dtype=np.float64)
    out[np.asarray(samples, dtype=np.int64)] = ce
    return out
