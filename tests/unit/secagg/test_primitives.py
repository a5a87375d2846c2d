"""Fixed-point encoding, the mask PRG and the key agreement."""

from __future__ import annotations

import numpy as np
import pytest

from fedtune.core.errors import SecureAggregationError
from fedtune.secagg import fixedpoint, keys, prg


def test_encoding_round_trips_and_sums_to_fixed_point_precision() -> None:
    rng = np.random.default_rng(0)
    parts = [rng.normal(size=100) * 50 for _ in range(5)]
    total = sum(fixedpoint.encode(p, 24, 5) for p in parts)
    assert np.abs(fixedpoint.decode(total, 24) - sum(parts)).max() <= 5 * 2.0**-25
    assert np.all(fixedpoint.decode(fixedpoint.encode(-parts[0], 24), 24) == -fixedpoint.decode(fixedpoint.encode(parts[0], 24), 24))


@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e20])
def test_unencodable_values_are_refused_with_the_value(bad: float) -> None:
    with pytest.raises(SecureAggregationError, match="magnitude") as info:
        fixedpoint.encode(np.array([0.0, bad]), 24, 3)
    assert "frac_bits=24" in str(info.value) and "secure_aggregation.frac_bits" in info.value.fix


def test_masks_are_deterministic_and_differ_by_seed() -> None:
    a = prg.mask(bytes(32), 1000)
    assert a.dtype == np.uint64 and np.array_equal(a, prg.mask(bytes(32), 1000))
    assert not np.array_equal(a, prg.mask(b"\1" * 32, 1000))
    assert np.array_equal(prg.mask(bytes(32), 10), a[:10])
    assert 0.45 < float(np.mean(a >> np.uint64(63))) < 0.55
    with pytest.raises(ValueError, match="32 bytes"):
        prg.mask(bytes(16), 4)


def test_both_ends_agree_and_contexts_separate() -> None:
    a, b, c = keys.generate(), keys.generate(), keys.generate()
    assert keys.agree(a.private, b.public, b"x") == keys.agree(b.private, a.public, b"x")
    assert keys.agree(a.private, b.public, b"x") != keys.agree(a.private, b.public, b"y")
    assert keys.agree(a.private, b.public, b"x") != keys.agree(a.private, c.public, b"x")
    assert keys.public_of(a.private) == a.public


def test_sealed_shares_detect_tampering_and_misaddressing() -> None:
    key = bytes(range(32))
    blob = keys.seal(key, b"share", b"u->v")
    assert keys.open_sealed(key, blob, b"u->v") == b"share"
    assert keys.open_sealed(key, blob, b"u->w") is None
    assert keys.open_sealed(key, blob[:-1] + bytes([blob[-1] ^ 1]), b"u->v") is None
