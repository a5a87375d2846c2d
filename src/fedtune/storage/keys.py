"""Object keys: the one place that decides which keys and prefixes a store accepts.

A key is relative and ``/``-separated. Every rule here exists so that a key means the same
object on a local disk and in a bucket, and so that no key can leave the prefix a store is
confined to (``..``, absolute paths, backslashes that Windows tools read as separators) or
collide with a file the store writes for itself (checksum sidecars, temporary files).
"""

from __future__ import annotations

import hashlib

from fedtune.core.errors import StoreError

SIDECAR_SUFFIX = ".sha256"
"""Suffix of the file beside each blob that holds the blob's sha256 in hex."""

TEMP_SUFFIX = ".fedtune-tmp"
"""Suffix of the temporary files a local write renames into place."""

MAX_KEY_BYTES = 1024
"""S3's limit on a whole object name; applied to every backend so keys stay portable."""

_RESERVED_SUFFIXES = (SIDECAR_SUFFIX, TEMP_SUFFIX)
_KEY_FIX = (
    "Use a relative key of '/'-separated names, such as 'rounds/3/update.safetensors': "
    "no leading '/', no '..' or '.' parts, no empty parts, no backslashes or control characters."
)


def _check_path(value: object, what: str) -> str:
    """Apply the rules shared by keys and prefixes; return the value unchanged."""
    if not isinstance(value, str):
        raise StoreError(
            f"{what} must be a string, got {type(value).__name__}: {value!r}", fix=_KEY_FIX
        )
    if value == "":
        raise StoreError(f"{what} is empty", fix=_KEY_FIX)
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
        raise StoreError(f"{what} {value!r} contains a NUL or control character", fix=_KEY_FIX)
    if "\\" in value:
        raise StoreError(f"{what} {value!r} contains a backslash", fix=_KEY_FIX)
    if value.startswith("/"):
        raise StoreError(f"{what} {value!r} is absolute (starts with '/')", fix=_KEY_FIX)
    if len(value.encode("utf-8")) > MAX_KEY_BYTES:
        raise StoreError(
            f"{what} {value[:60]!r}... is longer than {MAX_KEY_BYTES} bytes", fix=_KEY_FIX
        )
    for part in value.split("/"):
        if part == "":
            raise StoreError(
                f"{what} {value!r} has an empty part ('//' or a trailing '/')", fix=_KEY_FIX
            )
        if part in (".", ".."):
            raise StoreError(f"{what} {value!r} has a {part!r} part", fix=_KEY_FIX)
    return value


def validate_key(key: object) -> str:
    """Return ``key`` if it is a valid blob key, else raise ``StoreError`` saying why.

    Args:
        key: The key to check.

    Returns:
        The key, unchanged.

    Raises:
        StoreError: The key is not a string, or breaks one of the module's rules, or ends in a
            suffix the store reserves for itself.
    """
    checked = _check_path(key, "key")
    for suffix in _RESERVED_SUFFIXES:
        if checked.endswith(suffix):
            raise StoreError(
                f"key {checked!r} ends in {suffix!r}, which the store reserves for its own files",
                fix=f"Choose a key that does not end in {suffix!r}.",
            )
    return checked


def validate_prefix(prefix: object) -> str:
    """Return a folder prefix without its trailing ``/``; ``""`` stands for the whole store.

    Args:
        prefix: A key prefix such as ``"tenants/a"`` or ``"tenants/a/"``.

    Returns:
        The prefix without trailing ``/`` (``""`` for the root).

    Raises:
        StoreError: The prefix breaks the key rules.
    """
    if prefix == "":
        return ""
    if isinstance(prefix, str) and len(prefix) > 1 and prefix[-1] == "/" and prefix[-2] != "/":
        prefix = prefix[:-1]
    return _check_path(prefix, "prefix")


def join_key(prefix: str, key: str) -> str:
    """Join an already validated prefix and key (either may be ``""``) with ``/``."""
    return f"{prefix}/{key}" if prefix and key else prefix or key


def sidecar_key(key: str) -> str:
    """The key of the checksum sidecar that sits beside ``key``."""
    return validate_key(key) + SIDECAR_SUFFIX


def split_sidecar(key: object) -> tuple[str, bool]:
    """Validate a key that may name a sidecar; return the blob key and whether it did.

    Used where callers may address sidecars on purpose (pre-signed URLs for an uploader that
    must also send the checksum).
    """
    if isinstance(key, str) and key.endswith(SIDECAR_SUFFIX):
        return validate_key(key[: -len(SIDECAR_SUFFIX)]), True
    return validate_key(key), False


def sha256_hex(data: bytes) -> str:
    """The lowercase hex sha256 of ``data``, as written in sidecars."""
    return hashlib.sha256(data).hexdigest()
