"""Key agreement (X25519 + HKDF-SHA256) and authenticated share channels (ChaCha20-Poly1305),
all from the ``cryptography`` library."""

from __future__ import annotations

import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

KEY_BYTES = 32
_NONCE_BYTES = 12


@dataclass(frozen=True)
class KeyPair:
    """Raw X25519 keys (32 bytes each)."""

    private: bytes
    public: bytes


def generate() -> KeyPair:
    """A fresh X25519 key pair."""
    key = X25519PrivateKey.generate()
    return KeyPair(
        private=key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()),
        public=public_of(key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())),
    )


def public_of(private: bytes) -> bytes:
    """The public key of a raw private key."""
    key = X25519PrivateKey.from_private_bytes(private)
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def agree(private: bytes, peer_public: bytes, info: bytes) -> bytes:
    """A 32-byte secret both ends derive: HKDF-SHA256 of the X25519 shared secret.

    Raises:
        ValueError: ``peer_public`` is not a usable X25519 key (e.g. a low-order point).
    """
    shared = X25519PrivateKey.from_private_bytes(private).exchange(
        X25519PublicKey.from_public_bytes(peer_public)
    )
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(shared)


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """Encrypt and authenticate ``plaintext`` (random nonce in front)."""
    nonce = os.urandom(_NONCE_BYTES)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, plaintext, aad)


def open_sealed(key: bytes, blob: bytes, aad: bytes) -> bytes | None:
    """The plaintext of :func:`seal`, or None when ``blob`` was altered or misaddressed."""
    try:
        return ChaCha20Poly1305(key).decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], aad)
    except (InvalidTag, ValueError):
        return None
