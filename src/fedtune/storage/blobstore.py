"""What every backend shares: key checks, checksum sidecars, write order, JSON and tensors.

A backend subclasses :class:`BlobStore` and supplies a few raw operations on *names* (keys
already validated and joined to the store's prefix). Everything a caller can observe about
integrity and atomicity is decided here once, so the local and S3 stores cannot drift apart.
"""

from __future__ import annotations

import hashlib
import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, Protocol

from fedtune.core import killpoints
from fedtune.core.errors import IntegrityError, StoreError
from fedtune.storage import codec
from fedtune.storage.keys import (
    SIDECAR_SUFFIX,
    join_key,
    sha256_hex,
    split_sidecar,
    validate_key,
    validate_prefix,
)

if TYPE_CHECKING:
    import torch

    from fedtune.storage.base import Store

logger = logging.getLogger(__name__)

_HEX64 = re.compile(r"[0-9a-f]{64}")


def _is_key(name: str) -> bool:
    try:
        validate_key(name)
    except StoreError:
        return False
    return True


class Readable(Protocol):
    """A binary stream read in pieces: a file, or an S3 object's body."""

    def read(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


class _HashingReader:
    """Passes reads through and hashes them, so a stream is checked without holding it."""

    def __init__(self, raw: Readable) -> None:
        self._raw = raw
        self.digest = hashlib.sha256()
        self.at_end = False

    def read(self, size: int = -1, /) -> bytes:
        data = self._raw.read(size)
        self.digest.update(data)
        if not data or size < 0:
            self.at_end = True
        return data

    def close(self) -> None:
        self._raw.close()


class BlobStore(ABC):
    """Base of the checksummed stores; implements :class:`fedtune.storage.base.Store`.

    Args:
        prefix: The folder, relative to the backend's root, this store is confined to.
    """

    def __init__(self, prefix: str = "") -> None:
        self._prefix = validate_prefix(prefix)

    # -- raw operations a backend supplies -------------------------------------------------

    @abstractmethod
    def _write(self, name: str, data: bytes) -> None:
        """Write ``data`` at ``name`` so that a reader sees the old object or all of the new."""

    @abstractmethod
    def _read(self, name: str) -> bytes | None:
        """The object at ``name``, or ``None`` when there is none."""

    def _open(self, name: str) -> Readable | None:
        """A stream of the object at ``name``, or ``None`` when there is none.

        Backends that can stream override this; the fallback reads the object whole.
        """
        import io

        data = self._read(name)
        return None if data is None else io.BytesIO(data)

    @abstractmethod
    def _has(self, name: str) -> bool:
        """Whether an object exists at ``name``."""

    @abstractmethod
    def _remove(self, name: str) -> None:
        """Remove the object at ``name``; nothing happens when there is none."""

    @abstractmethod
    def _names(self, prefix: str) -> list[str]:
        """All object names (sidecars included) under the folder ``prefix`` (``""``: all)."""

    @abstractmethod
    def _child(self, prefix: str) -> BlobStore:
        """A store of the same backend confined to the joined, validated ``prefix``."""

    @abstractmethod
    def _presign(self, name: str, method: Literal["get", "put"], expires_s: int) -> str:
        """A pre-signed URL for ``name``."""

    def _copy_within(self, name: str, dst: BlobStore, dst_name: str) -> bool:
        """Copy the object ``name`` to ``dst_name`` of ``dst`` without its bytes passing
        through this process, where the backend can (True); False where it cannot."""
        return False

    @property
    @abstractmethod
    def uri(self) -> str:
        """The root URI of this store."""

    # -- the Store protocol ----------------------------------------------------------------

    def _name(self, key: str) -> str:
        return join_key(self._prefix, validate_key(key))

    def put_bytes(self, key: str, data: bytes) -> int:
        """Write ``data`` at ``key`` atomically with its checksum; return bytes written."""
        name = self._name(key)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise StoreError(
                f"cannot write {key!r}: data must be bytes, got {type(data).__name__}",
                fix="Use put_json for documents and put_tensors for tensors.",
            )
        data = bytes(data)
        digest = sha256_hex(data).encode("ascii")
        recorded = self._read(name + SIDECAR_SUFFIX)
        if recorded is not None and recorded.strip() == digest and self._read(name) == data:
            # The same bytes are already stored whole: leave them be. Two tasks that publish one
            # deterministic message at once (the per-tenant final steps of a KFP run) then never
            # take the checksum away from each other's readers.
            killpoints.stored(f"{self.uri}/{key}")  # the full location: a tenant store is rooted at its prefix
            return len(data)
        if recorded is not None:
            # Sidecar off first, so that while the blob is being replaced readers see the key
            # as incomplete rather than a new blob against the old checksum (a false
            # IntegrityError). A missing sidecar is not removed: a writer of the same bytes
            # may have put it there since it was read.
            self._remove(name + SIDECAR_SUFFIX)
        self._write(name, data)
        self._write(name + SIDECAR_SUFFIX, digest)
        logger.debug("wrote %s/%s (%d bytes)", self.uri, key, len(data))
        killpoints.stored(f"{self.uri}/{key}")  # the full location: a tenant store is rooted at its prefix
        return len(data)

    def copy(self, key: str, dst: Store, dst_key: str) -> int:
        """Put the blob at ``key`` and its checksum at ``dst_key`` of ``dst``; return the bytes
        that passed through this process.

        Where both stores are on one backend the copy is made there (a hard link on one
        filesystem, S3 ``CopyObject`` on one endpoint) and 0 is returned: sending one message
        to many tenants then costs one write, not one per tenant. The source is not read, so
        not verified here; the copied sidecar is, by every reader. Elsewhere the blob is read
        (verified) and written. The sidecar lands last either way, as :meth:`put_bytes` does.
        """
        if isinstance(dst, BlobStore) and self.exists(key):
            name, target = self._name(key), dst._name(dst_key)
            recorded = dst._read(target + SIDECAR_SUFFIX)
            if recorded is not None:
                if recorded == self._read(name + SIDECAR_SUFFIX) and dst._has(target):
                    return 0  # already there (as put_bytes, never take a reader's sidecar away)
                dst._remove(target + SIDECAR_SUFFIX)  # incomplete while the blob is replaced
            if self._copy_within(name, dst, target) and self._copy_within(
                name + SIDECAR_SUFFIX, dst, target + SIDECAR_SUFFIX
            ):
                logger.debug("copied %s/%s to %s/%s", self.uri, key, dst.uri, dst_key)
                killpoints.stored(f"{dst.uri}/{dst_key}")
                return 0
        return dst.put_bytes(dst_key, self.get_bytes(key))

    def get_bytes(self, key: str, *, verify: bool = True) -> bytes:
        """Read the blob at ``key``, checking it against its sidecar (see the protocol)."""
        name = self._name(key)
        data = self._read(name)
        if data is None:
            raise StoreError(
                f"no blob at key {key!r} in {self.uri}",
                fix="Check the key and the store URI, or run the step that writes it first.",
            )
        recorded = self._read(name + SIDECAR_SUFFIX)
        if recorded is None:
            if verify:
                raise StoreError(
                    f"blob {key!r} in {self.uri} has no {SIDECAR_SUFFIX} checksum beside it: "
                    "its write did not finish, or it was not written by fedtune",
                    fix="Re-run the step that writes it; for files people upload (a tenant's "
                    "data) read with verify=False.",
                )
            return data
        self._check(key, data, recorded)
        return data

    @contextmanager
    def reading(self, key: str, *, verify: bool = False) -> Iterator[Readable]:
        """Stream the blob at ``key`` in pieces (a large dataset never sits in memory whole).

        The checksum rules are those of :meth:`get_bytes`; the sidecar is compared once the
        caller has read to the end, and a mismatch raises ``IntegrityError`` then.
        """
        name = self._name(key)
        recorded = self._read(name + SIDECAR_SUFFIX)
        if recorded is None and verify:
            self.get_bytes(key, verify=True)  # raises the missing-sidecar error
        raw = self._open(name)
        if raw is None:
            raise StoreError(
                f"no blob at key {key!r} in {self.uri}",
                fix="Check the key and the store URI, or run the step that writes it first.",
            )
        stream = _HashingReader(raw)
        try:
            yield stream
        finally:
            raw.close()
        if recorded is not None and stream.at_end:
            self._check(key, None, recorded, actual=stream.digest.hexdigest())

    def _check(
        self, key: str, data: bytes | None, recorded: bytes, *, actual: str | None = None
    ) -> None:
        expected = recorded.decode("ascii", errors="replace").strip()
        actual = actual if actual is not None else sha256_hex(data or b"")
        if not _HEX64.fullmatch(expected):
            raise IntegrityError(
                f"checksum sidecar of {key!r} in {self.uri} is malformed: {expected[:80]!r} "
                "(expected 64 lowercase hex digits)"
            )
        if expected != actual:
            raise IntegrityError(
                f"blob {key!r} in {self.uri} does not match its checksum: "
                f"sidecar says sha256 {expected}, blob has sha256 {actual}"
            )

    def exists(self, key: str) -> bool:
        """True when the blob and its checksum are both present (a complete write)."""
        name = self._name(key)
        return self._has(name + SIDECAR_SUFFIX) and self._has(name)

    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys of complete blobs under the folder ``prefix`` (``""``: all)."""
        folder = validate_prefix(prefix)
        names = set(self._names(join_key(self._prefix, folder)))
        strip = len(self._prefix) + 1 if self._prefix else 0
        complete = [n[strip:] for n in names if not n.endswith(SIDECAR_SUFFIX) and n + SIDECAR_SUFFIX in names]
        keys = [k for k in complete if _is_key(k)]
        if len(keys) < len(complete):
            # Objects no fedtune key names (a planted 'x/../../other-tenant/y' in a bucket, a
            # backslash in a file name): listing them would hand callers keys that every
            # get/delete refuses, so a hostile name could stop whoever lists the prefix.
            odd = sorted(set(complete) - set(keys))
            logger.warning("%s holds %d object(s) whose names are not valid keys, left out of "
                           "its listing: %s", self.uri, len(odd), ", ".join(repr(k) for k in odd[:5]))
        return sorted(keys)

    def delete(self, key: str) -> None:
        """Remove a blob and its checksum; no error if absent."""
        name = self._name(key)
        # Sidecar first: if we stop half-way the blob is left incomplete, never "verified".
        self._remove(name + SIDECAR_SUFFIX)
        self._remove(name)
        logger.debug("deleted %s/%s", self.uri, key)

    def child(self, prefix: str) -> BlobStore:
        """A store confined to the folder ``prefix`` under this one."""
        folder = validate_prefix(prefix)
        if not folder:
            raise StoreError(
                "child() needs a non-empty prefix, got ''",
                fix="Pass the folder to confine the new store to, such as 'tenants/a'.",
            )
        return self._child(join_key(self._prefix, folder))

    def put_json(self, key: str, obj: Any) -> int:
        """Write a JSON document (sorted keys, UTF-8)."""
        return self.put_bytes(key, codec.encode_json(obj, key=key))

    def get_json(self, key: str) -> Any:
        """Read and verify a JSON document."""
        return codec.decode_json(self.get_bytes(key), key=key)

    def put_tensors(
        self, key: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
    ) -> int:
        """Write tensors (any layout, shared storage allowed) as one safetensors blob."""
        return self.put_bytes(key, codec.encode_tensors(tensors, metadata, key=key))

    def get_tensors(self, key: str) -> dict[str, torch.Tensor]:
        """Read and verify a safetensors blob written by :meth:`put_tensors`."""
        return codec.decode_tensors(self.get_bytes(key), key=key)

    def presigned_url(
        self, key: str, *, method: Literal["get", "put"], expires_s: int = 3600
    ) -> str:
        """A URL for one object (or its ``.sha256`` sidecar); see the protocol."""
        blob_key, is_sidecar = split_sidecar(key)
        name = self._name(blob_key) + (SIDECAR_SUFFIX if is_sidecar else "")
        if method not in ("get", "put"):
            raise StoreError(
                f"presigned_url method must be 'get' or 'put', got {method!r}",
                fix="Pass method='get' to let the holder read, method='put' to let it write.",
            )
        if (
            isinstance(expires_s, bool)
            or not isinstance(expires_s, int)
            or not (1 <= expires_s <= 7 * 24 * 3600)
        ):
            raise StoreError(
                f"presigned_url expires_s must be 1..604800 seconds, got {expires_s!r}",
                fix="S3 signatures last at most 7 days; pass a shorter expiry.",
            )
        return self._presign(name, method, expires_s)

    def removal_command(self, keys: Sequence[str]) -> str:
        """A shell command that deletes ``keys`` and their sidecars; see the protocol."""
        from fedtune.storage.uri import removal_command  # uri imports the stores: not at top

        return removal_command(self.uri, [*keys])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"
