"""Fixed-point encoding of float vectors into the ring Z_2^64 (two's complement in uint64).

Masks are added modulo 2^64, so a sum of encodings decodes to the sum of the values as long
as that sum stays inside +-2^62 / 2^frac_bits (:func:`bound`); each tenant checks its own
share of that headroom before it uploads.
"""

from __future__ import annotations

import numpy as np

from fedtune.core.errors import SecureAggregationError

RING = np.uint64
_LIMIT = 2.0**62  # headroom below 2^63 so that a sum of in-range parts cannot wrap


def bound(frac_bits: int, parties: int) -> float:
    """Largest |value| one of ``parties`` may encode so their sum cannot wrap around."""
    return _LIMIT / 2.0**frac_bits / max(parties, 1)


def encode(values: np.ndarray, frac_bits: int, parties: int = 1) -> np.ndarray:
    """``round(values * 2^frac_bits)`` as uint64 (negatives in two's complement).

    Raises:
        SecureAggregationError: A value is not finite or exceeds :func:`bound`.
    """
    values = np.asarray(values, dtype=np.float64)
    limit = bound(frac_bits, parties)
    if values.size:
        worst = float(np.max(np.abs(values)))
        if not np.isfinite(worst) or worst > limit:
            raise SecureAggregationError(
                f"a weighted update value of magnitude {worst!r} cannot be encoded with "
                f"frac_bits={frac_bits} for {parties} parties (limit {limit:.3g})",
                fix="Lower secure_aggregation.frac_bits, use aggregation_weights: uniform, or "
                "fix the diverged local training that produced the value.",
            )
    return np.rint(values * 2.0**frac_bits).astype(np.int64).view(RING)


def decode(ring: np.ndarray, frac_bits: int) -> np.ndarray:
    """Inverse of :func:`encode` (for a single value or a sum of encodings)."""
    return np.asarray(ring, dtype=RING).view(np.int64).astype(np.float64) / 2.0**frac_bits
