"""Shamir sharing: any t shares reconstruct; fewer reveal nothing (checked by construction)."""

from __future__ import annotations

import itertools
import os
import random

import pytest

from fedtune.secagg import shamir


def test_every_threshold_subset_reconstructs() -> None:
    for n, t in [(1, 1), (3, 2), (5, 3), (7, 7)]:
        secret = os.urandom(32)
        shares = shamir.split(secret, range(1, n + 1), t)
        for subset in itertools.combinations(shares, t):
            assert shamir.combine({x: shares[x] for x in subset}, t) == secret


def test_fewer_than_threshold_shares_are_consistent_with_any_secret() -> None:
    # Perfect secrecy by construction: for t-1 shares and ANY candidate secret there is
    # exactly one degree t-1 polynomial through them, so t-1 shares rule nothing out.
    secret, other = os.urandom(32), os.urandom(32)
    shares = shamir.split(secret, range(1, 6), 3)
    partial = {1: shares[1], 2: shares[2]}
    for candidate in (secret, other):
        points = {0: int.from_bytes(candidate, "big"), **partial}
        share_3 = shamir.interpolate(points, at=3)
        assert shamir.interpolate({**partial, 3: share_3}) == int.from_bytes(candidate, "big")


def test_shares_below_threshold_look_uniform() -> None:
    # The same secret shared 400 times: a single share's top bit is a fair coin.
    secret = bytes(32)
    tops = [shamir.split(secret, [1, 2, 3], 2)[1] >> 520 for _ in range(400)]
    assert 140 < sum(tops) < 260


def test_corrupted_share_gives_another_value() -> None:
    secret = os.urandom(32)
    shares = shamir.split(secret, range(1, 4), 2)
    shares[1] = (shares[1] + 1) % shamir.PRIME
    assert shamir.combine(shares, 2) != secret


def test_commitment_binds_point_and_value() -> None:
    c = shamir.commitment("t", 1, 5)
    assert c != shamir.commitment("t", 1, 6) and c != shamir.commitment("t", 2, 5)


@pytest.mark.parametrize(
    ("secret", "xs", "t", "message"),
    [
        (bytes(31), [1, 2], 1, "32 bytes"),
        (bytes(32), [1, 2], 3, "threshold 3"),
        (bytes(32), [1, 1], 1, "distinct"),
        (bytes(32), [0, 1], 1, "distinct"),
    ],
)
def test_bad_arguments_are_refused(secret: bytes, xs: list[int], t: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        shamir.split(secret, xs, t)


def test_too_few_shares_to_combine() -> None:
    with pytest.raises(ValueError, match="1 share"):
        shamir.combine({1: random.randrange(shamir.PRIME)}, 2)
