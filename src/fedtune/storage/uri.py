"""Pick a store by URI scheme, and read single objects named by URI.

``file:///abs/path`` or a plain path -> :class:`~fedtune.storage.local.LocalStore`;
``s3://bucket/prefix`` -> :class:`~fedtune.storage.s3.S3Store`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

from fedtune.core.errors import StoreError
from fedtune.storage.base import Store
from fedtune.storage.keys import SIDECAR_SUFFIX, validate_key, validate_prefix
from fedtune.storage.local import LocalStore
from fedtune.storage.s3 import S3Bounds, S3Store, resolve_endpoint, validate_bucket

SUPPORTED = "file:///absolute/path, s3://bucket/prefix, or a plain local path"
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_FIX = f"Use one of: {SUPPORTED}."


def _scheme(uri: object) -> str:
    """The lower-case scheme of ``uri`` (``""`` for a plain path); rejects non-strings."""
    if not isinstance(uri, str) or not uri.strip():
        raise StoreError(f"store URI must be a non-empty string, got {uri!r}", fix=_FIX)
    match = _SCHEME.match(uri)
    if match:
        return match.group(1).lower()
    head = uri.split(":", 1)[0].lower()
    if ":" in uri and head in ("s3", "file"):
        raise StoreError(f"malformed store URI {uri!r}: {head}: must be followed by //", fix=_FIX)
    return ""


def _local_path(uri: str, scheme: str) -> Path:
    """The absolute path named by a ``file://`` URI or a plain path."""
    if scheme == "":
        return Path(uri).expanduser().absolute()
    parts = urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise StoreError(
            f"file URI {uri!r} names host {parts.netloc!r}; file URIs must be absolute paths",
            fix="Write three slashes, as in file:///data/fedtune (or pass a plain path).",
        )
    if parts.query or parts.fragment:
        raise StoreError(f"file URI {uri!r} has a '?' or '#' part", fix=_FIX)
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise StoreError(f"file URI {uri!r} has no absolute path", fix=_FIX)
    return Path(path)


def _in_uri(uri: str, check: Callable[[str], str], value: str) -> str:
    """Run a key/prefix check, naming the whole URI in the error it raises."""
    try:
        return check(value)
    except StoreError as exc:
        raise StoreError(f"in URI {uri!r}: {exc}", fix=exc.fix) from None


def _s3_parts(uri: str) -> tuple[str, str]:
    """Bucket and path (without leading ``/``) of an ``s3://`` URI."""
    parts = urlsplit(uri)
    if "@" in parts.netloc:
        # Not echoed: what precedes '@' would be credentials.
        raise StoreError(
            "S3 URI has credentials before '@' in it; they were not used (URI not shown)",
            fix="Remove them from the URI; put credentials in AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY (a Kubernetes secret) instead.",
        )
    if parts.query or parts.fragment:
        raise StoreError(f"S3 URI {uri!r} has a '?' or '#' part", fix=_FIX)
    return validate_bucket(parts.netloc), parts.path.removeprefix("/")


def open_store(
    uri: str, *, endpoint_url: str | None = None, bounds: S3Bounds | None = None
) -> Store:
    """Open the store rooted at ``uri``.

    Args:
        uri: ``file:///abs/path``, a plain local path, or ``s3://bucket[/prefix]``.
        endpoint_url: S3 endpoint (for MinIO etc.); default ``$FEDTUNE_S3_ENDPOINT_URL``,
            else boto3's own settings. Ignored for local stores, so callers can pass their
            deployment setting whatever the URI.
        bounds: Timeouts and attempts of an S3 store's requests (the job's ``limits``).

    Returns:
        A store confined to ``uri``.

    Raises:
        StoreError: The scheme is unknown or the URI is malformed.
    """
    scheme = _scheme(uri)
    if scheme in ("", "file"):
        return LocalStore(_local_path(uri, scheme))
    if scheme == "s3":
        bucket, path = _s3_parts(uri)
        return S3Store(
            bucket, _in_uri(uri, validate_prefix, path), endpoint_url=endpoint_url, bounds=bounds
        )
    raise StoreError(f"unsupported store URI scheme {scheme + '://'!r} in {uri!r}", fix=_FIX)


def split_object_uri(uri: str) -> tuple[str, str]:
    """Split a URI that names one object into its folder's store URI and the object's key.

    ``s3://b/tenants/a/train.jsonl`` -> ``("s3://b/tenants/a", "train.jsonl")``;
    ``/data/train.jsonl`` -> ``("file:///data", "train.jsonl")``.

    Raises:
        StoreError: The URI names a folder (ends in ``/``) or a bucket, or is malformed.
    """
    scheme = _scheme(uri)
    if uri.endswith("/"):
        raise StoreError(
            f"{uri!r} names a folder, not an object", fix="Give the full URI of one file."
        )
    if scheme in ("", "file"):
        path = _local_path(uri, scheme)
        return path.parent.as_uri(), _in_uri(uri, validate_key, path.name)
    if scheme == "s3":
        bucket, path_part = _s3_parts(uri)
        if not path_part:
            raise StoreError(
                f"{uri!r} names a bucket, not an object",
                fix="Give the full URI of one object, as in s3://bucket/tenants/a/train.jsonl.",
            )
        folder, _, key = _in_uri(uri, validate_key, path_part).rpartition("/")
        return (f"s3://{bucket}/{folder}" if folder else f"s3://{bucket}"), key
    raise StoreError(f"unsupported object URI scheme {scheme + '://'!r} in {uri!r}", fix=_FIX)


def read_object(
    uri: str,
    *,
    verify: bool = False,
    endpoint_url: str | None = None,
    bounds: S3Bounds | None = None,
) -> bytes:
    """Read the one object ``uri`` names, such as a tenant's uploaded data file.

    Args:
        uri: Object URI (see :func:`split_object_uri`).
        verify: Require a ``.sha256`` sidecar; without it, a sidecar that exists is still
            checked.
        endpoint_url, bounds: As for :func:`open_store`.
    """
    root, key = split_object_uri(uri)
    return open_store(root, endpoint_url=endpoint_url, bounds=bounds).get_bytes(key, verify=verify)


def removal_command(store_uri: str, keys: list[str]) -> str:
    """A shell command that deletes ``keys`` of the store at ``store_uri`` with their sidecars.

    ``rm -f`` of the files for a local store, ``aws s3 rm`` of the objects for S3: what a
    fix tells a user to run.
    """
    import shlex

    names = [name for key in keys for name in (key, key + SIDECAR_SUFFIX)]
    scheme = _scheme(store_uri)
    if scheme in ("", "file"):
        root = _local_path(store_uri, scheme)
        return "rm -f " + " ".join(shlex.quote(str(root.joinpath(*n.split("/")))) for n in names)
    base = store_uri.rstrip("/")
    endpoint = resolve_endpoint(None)
    flag = f" --endpoint-url {shlex.quote(endpoint)}" if endpoint else ""
    return " && ".join(f"aws s3 rm{flag} {shlex.quote(f'{base}/{n}')}" for n in names)
