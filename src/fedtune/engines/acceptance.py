"""The provider's record of what it accepted from a tenant pod, checked on every later read.

A launched tenant pod writes its outputs (an update, a secure-aggregation message, its final
metrics) into its exchange prefix through pre-signed PUT URLs. Those URLs stay valid until
they expire, so a tenant (or whoever copied the URLs out of its pod) could overwrite an
output after the provider took it, blob and checksum sidecar alike: a replaced update would
then enter a re-aggregation (a resumed run, a retried task) unnoticed.

So when the launcher accepts a step's outputs (its Job succeeded and the outputs are
stored), it records each blob's sha256 and length in the provider-private store, which no
tenant can write, under ``accepted/<tenant>/<exchange key>.json``. Every later provider read
of such a blob is checked against that record (:func:`verify`); a changed blob is refused
with an :class:`~fedtune.core.errors.IntegrityError` naming the tenant, the object and both
digests. The first acceptance wins: a retried launcher that finds a record verifies against
it instead of recording again. Blobs without a record (the local engines, where tenants
hold no URLs) are read as before.
"""

from __future__ import annotations

import hashlib
from typing import Any

from fedtune.core.errors import IntegrityError
from fedtune.storage.base import Store

RECORD_PREFIX = "accepted"


def record_key(tenant: str, key: str) -> str:
    """Where the provider store keeps its record of ``tenant``'s exchange blob ``key``."""
    return f"{RECORD_PREFIX}/{tenant}/{key}.json"


def digest(data: bytes) -> dict[str, Any]:
    """The record of one blob: its sha256 and its length in bytes."""
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def accept(provider: Store, exchange: Store, tenant: str, keys: list[str]) -> None:
    """Record the blobs ``keys`` of ``tenant``'s exchange prefix as accepted.

    Raises:
        IntegrityError: A blob was accepted before and has changed since.
    """
    for key in keys:
        if verify(provider, exchange, tenant, key) is None:  # no record yet: this is the first
            provider.put_json(record_key(tenant, key), digest(exchange.get_bytes(key)))


def verify(provider: Store, exchange: Store, tenant: str, key: str) -> bytes | None:
    """Check ``tenant``'s exchange blob ``key`` against its acceptance record, if it has one;
    return the blob's bytes (None when nothing was recorded).

    Raises:
        IntegrityError: The blob differs from what the provider accepted.
    """
    if not provider.exists(record_key(tenant, key)):
        return None
    accepted = provider.get_json(record_key(tenant, key))
    data = exchange.get_bytes(key, verify=False)
    found = digest(data)
    if found != accepted:
        raise IntegrityError(
            f"tenant {tenant!r}: exchange object {key!r} was changed after the provider "
            f"accepted it (accepted sha256 {accepted['sha256']}, {accepted['bytes']} bytes; "
            f"now sha256 {found['sha256']}, {found['bytes']} bytes); it is refused",
            fix="Someone overwrote it through the step's pre-signed URL after the step ended. "
            "Ask the tenant why; to train that round again, delete the tenant's object and the "
            f"provider's record {record_key(tenant, key)!r}, then resume the run.",
        )
    return data


def verify_message(provider: Store, exchange: Store, tenant: str, key: str) -> None:
    """:func:`verify` both blobs of the message at ``key`` (tensors and JSON)."""
    for suffix in (".safetensors", ".json"):
        verify(provider, exchange, tenant, key + suffix)
