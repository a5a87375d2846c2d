"""Long-term tenant identities (Ed25519, from the ``cryptography`` library).

Each tenant keeps a private signing key in its own store; its public key is registered out
of band in the job's tenant entry (``tenants[].identity_key``). Advertisements and share
messages carry a signature that the receiving tenants verify against that registered key, so
a provider that routes the messages cannot substitute its own keys (the man-in-the-middle
the malicious-server variant of Bonawitz et al. 2017, section 6, closes with a PKI).
"""

from __future__ import annotations

import json
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

KEY_BYTES = 32
STORE_KEY = "secagg/identity.json"
"""Where a tenant keeps its private identity key in its own store."""


def generate() -> tuple[bytes, bytes]:
    """A fresh (private, public) Ed25519 key pair, raw 32 bytes each."""
    key = Ed25519PrivateKey.generate()
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()), public_of(
        key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    )


def public_of(private: bytes) -> bytes:
    """The public key of a raw private key."""
    return Ed25519PrivateKey.from_private_bytes(private).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def canonical(kind: str, payload: Any) -> bytes:
    """The bytes a signature covers: the message kind and its JSON, keys sorted."""
    return json.dumps({"kind": kind, "payload": payload}, sort_keys=True, separators=(",", ":")).encode()


def sign(private: bytes, kind: str, payload: Any) -> str:
    """Hex Ed25519 signature of ``canonical(kind, payload)``."""
    return Ed25519PrivateKey.from_private_bytes(private).sign(canonical(kind, payload)).hex()


def verify(public: bytes, kind: str, payload: Any, signature: str) -> bool:
    """Whether ``signature`` is the holder of ``public``'s over ``canonical(kind, payload)``."""
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(bytes.fromhex(signature), canonical(kind, payload))
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True
