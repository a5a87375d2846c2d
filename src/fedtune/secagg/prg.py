"""Masks from a 32-byte seed: the ChaCha20 keystream read as little-endian uint64 words."""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

SEED_BYTES = 32
_NONCE = bytes(16)  # each seed is used for exactly one mask, so a fixed nonce is safe


def mask(seed: bytes, length: int) -> np.ndarray:
    """``length`` pseudo-random uint64 words determined by ``seed`` (32 bytes)."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a mask seed has {SEED_BYTES} bytes, got {len(seed)}")
    stream = Cipher(algorithms.ChaCha20(seed, _NONCE), mode=None).encryptor()
    return np.frombuffer(stream.update(bytes(8 * length)), dtype="<u8").astype(np.uint64)
