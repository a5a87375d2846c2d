"""Publishing a provider's recorded message into each sampled tenant's exchange prefix.

The tensors enter the exchange once per call and are copied server-side to every other
tenant (hard links on a file store, ``CopyObject`` on S3); a link planted at a tenant's key
is removed and the copy written afresh.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fedtune.core.errors import StoreUnavailable
from fedtune.core.messages import Broadcast
from fedtune.storage.base import Store

if TYPE_CHECKING:
    from fedtune.engines.steps import ProviderEnv

log = logging.getLogger("fedtune.engines.steps")  # where these lines were always logged

__all__ = ["publish", "stored_size"]


def _stored_or_cleared(exchange: Store, tenant: str, tenant_key: str) -> bool:
    """Whether the tenant's copy is stored; what the store refuses at the key (a link planted
    in the tenant's prefix) is removed, so the provider writes its copy afresh."""
    from fedtune.core.errors import StoreError

    try:
        return Broadcast.stored(exchange, tenant_key)
    except StoreError as exc:
        if isinstance(exc, StoreUnavailable):
            raise
        # The key is the provider's: what the store refuses there goes.
        log.warning("tenant %s: replacing what its prefix holds at %s: %s", tenant, tenant_key, exc)
        for half in (f"{tenant_key}.safetensors", f"{tenant_key}.json"):
            exchange.delete(half)
        return False


def publish(env: ProviderEnv, record_key: str, tenants: list[str], tenant_key: str) -> int:
    """Put the provider's recorded message into each tenant's exchange prefix where missing;
    return the size of the first tenant's copy.

    The tensors enter the exchange once per call: the first missing copy is copied from the
    record (:meth:`~fedtune.storage.blobstore.BlobStore.copy`: through this process where
    the provider store and the exchange are different backends), every other one from that
    copy inside the exchange (a hard link on a file store, ``CopyObject`` on S3), so the
    bytes the provider writes do not grow with the tenants. The JSON is copied the same way,
    or written per tenant where the algorithm builds it for each (JSON last: its presence
    marks a copy complete). Keys and confinement are as before: each copy sits in its
    tenant's prefix, and a tenant reads it through its own confined store or pre-signed
    URLs. On one filesystem the copies share the record's inode; every store write replaces
    a file by rename, so no write through one name changes another, and damage in place is
    caught by the checksums. The source is never a copy found from an earlier, interrupted
    call; the record's JSON is read (verified) at most once.
    """
    store = env.store()
    record: dict[str, Any] | None = None
    first: Store | None = None  # the copy written from the record by this call
    sizes: list[int] = []
    for name in tenants:
        exchange = env.stores.exchange(name)
        if not _stored_or_cleared(exchange, name, tenant_key):
            record = record if record is not None else store.get_json(f"{record_key}.json")
            meta = env.algorithm.tenant_broadcast_meta(record, name)
            source, source_key = (first, tenant_key) if first is not None else (store, record_key)
            source.copy(f"{source_key}.safetensors", exchange, f"{tenant_key}.safetensors")
            if meta is None:
                source.copy(f"{source_key}.json", exchange, f"{tenant_key}.json")
            else:
                exchange.put_json(f"{tenant_key}.json", meta)
            first = first or exchange
        if not sizes:  # the copies' tensors are one blob; the first copy's size stands for all
            sizes.append(stored_size(exchange, tenant_key))
    return sizes[0] if sizes else 0


def stored_size(store: Any, key: str) -> int:
    """Bytes of a stored message (tensors and JSON), as its writer counted them."""
    return len(store.get_bytes(f"{key}.safetensors")) + len(store.get_bytes(f"{key}.json"))
