"""The Store protocol: atomic, checksummed, prefix-confined blobs addressed by key.

Implementations: :mod:`fedtune.storage.local` (``file://``) and :mod:`fedtune.storage.s3`
(``s3://``). :func:`fedtune.storage.open_store` picks one by URI scheme.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


@runtime_checkable
class Store(Protocol):
    """A flat namespace of blobs under one root prefix.

    Every ``put_*`` writes atomically (a reader never sees half a blob) and stores the blob's
    sha256 beside it as ``<key>.sha256``; every ``get_*`` verifies it and raises
    :class:`fedtune.core.errors.IntegrityError` on mismatch. Keys are relative, ``/``-separated,
    with no ``..``, no empty or absolute parts; anything else raises ``StoreError`` before any I/O
    (the rules live in :mod:`fedtune.storage.keys`).
    """

    @property
    def uri(self) -> str:
        """The root URI of this store (``file:///...`` or ``s3://bucket/prefix``)."""
        ...

    def put_bytes(self, key: str, data: bytes) -> int:
        """Write ``data`` at ``key`` atomically with its checksum; return bytes written."""
        ...

    def get_bytes(self, key: str, *, verify: bool = True) -> bytes:
        """Read the blob at ``key``; ``StoreError`` if missing.

        With ``verify=True`` a blob without its checksum sidecar counts as incomplete and raises
        ``StoreError``. ``verify=False`` also reads blobs that have no sidecar (files that people
        uploaded, such as a tenant's data); a sidecar that exists is checked either way.
        """
        ...

    def copy(self, key: str, dst: Store, dst_key: str) -> int:
        """Put the blob at ``key`` with its checksum at ``dst_key`` of ``dst`` (server-side
        where both are on one backend); return the bytes that passed through this process."""
        ...

    def exists(self, key: str) -> bool:
        """True when the blob and its checksum are both present (a complete write)."""
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys of complete blobs under the folder ``prefix`` (``""``: all).

        Keys are relative to this store (pass them straight to ``get_*``); sidecars and blobs
        whose sidecar is missing are left out.
        """
        ...

    def delete(self, key: str) -> None:
        """Remove a blob and its checksum; no error if absent."""
        ...

    def child(self, prefix: str) -> Store:
        """A store confined to ``prefix`` under this one (same backend and credentials)."""
        ...

    def put_json(self, key: str, obj: Any) -> int:
        """Write a JSON document (sorted keys, UTF-8)."""
        ...

    def get_json(self, key: str) -> Any:
        """Read a JSON document."""
        ...

    def put_tensors(
        self, key: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
    ) -> int:
        """Write tensors as one safetensors blob; return bytes written."""
        ...

    def get_tensors(self, key: str) -> dict[str, torch.Tensor]:
        """Read a safetensors blob written by :meth:`put_tensors`."""
        ...

    def presigned_url(
        self, key: str, *, method: Literal["get", "put"], expires_s: int = 3600
    ) -> str:
        """A URL that lets a holder without credentials GET or PUT the one object at ``key``.

        ``key`` may also name a sidecar (``<key>.sha256``) so that an uploader can send the
        checksum too. Stores without such URLs (local folders) raise ``StoreError``.
        """
        ...

    def removal_command(self, keys: Sequence[str]) -> str:
        """A shell command that deletes ``keys`` and their sidecars: what a fix tells a user
        to run (``rm -f`` for a folder, ``aws s3 rm`` for S3)."""
        ...
