"""Shamir secret sharing of 32-byte secrets over GF(p), p = 2^521 - 1 (a Mersenne prime).

No maintained PyPI library fits (those found share short strings over GF(256) or are
unmaintained), so this is a small implementation: a random polynomial of degree
``threshold - 1`` with the secret as constant term, evaluated at x = 1..n; Lagrange
interpolation at 0 recovers it from any ``threshold`` shares. Coefficients come from
:mod:`secrets`. Fewer than ``threshold`` shares are jointly uniform whatever the secret
(perfect secrecy), which the tests check by construction.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Mapping

PRIME = 2**521 - 1
SECRET_BYTES = 32


def split(secret: bytes, xs: Iterable[int], threshold: int) -> dict[int, int]:
    """Shares ``{x: f(x)}`` of ``secret`` for each x in ``xs`` (distinct, 1 <= x < p)."""
    points = list(xs)
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"a shared secret has {SECRET_BYTES} bytes, got {len(secret)}")
    if not 1 <= threshold <= len(points):
        raise ValueError(f"threshold {threshold} must be in 1..{len(points)} (the share count)")
    if len(set(points)) != len(points) or any(not 0 < x < PRIME for x in points):
        raise ValueError(f"share points must be distinct and in 1..p-1, got {points}")
    coeffs = [int.from_bytes(secret, "big")] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    return {x: _evaluate(coeffs, x) for x in points}


def _evaluate(coeffs: list[int], x: int) -> int:
    acc = 0
    for c in reversed(coeffs):
        acc = (acc * x + c) % PRIME
    return acc


def interpolate(shares: Mapping[int, int], at: int = 0) -> int:
    """The value at ``at`` of the polynomial of lowest degree through ``shares``."""
    total = 0
    for xi, yi in shares.items():
        num, den = 1, 1
        for xj in shares:
            if xj != xi:
                num = num * (at - xj) % PRIME
                den = den * (xi - xj) % PRIME
        total = (total + yi * num * pow(den, -1, PRIME)) % PRIME
    return total


def combine(shares: Mapping[int, int], threshold: int) -> bytes | None:
    """The secret from the first ``threshold`` shares, or None if they cannot hold one.

    Raises:
        ValueError: Fewer than ``threshold`` shares.
    """
    if len(shares) < threshold:
        raise ValueError(f"{len(shares)} share(s) given, {threshold} needed")
    chosen = dict(sorted(shares.items())[:threshold])
    value = interpolate(chosen)
    return value.to_bytes(SECRET_BYTES, "big") if value < 2 ** (8 * SECRET_BYTES) else None


def commitment(tag: str, x: int, y: int) -> str:
    """A hash binding share ``(x, y)`` of ``tag`` (y is uniform in GF(p): it hides y)."""
    return hashlib.sha256(f"{tag}|{x}|{y:x}".encode()).hexdigest()
