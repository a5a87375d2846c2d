"""Reading a dataset named by a store URI (a tenant's bucket or a local file).

The object is streamed, never read whole: a line longer than ``limits.max_record_bytes``
(default 1 MiB) is skipped as it arrives, so one huge record costs neither minutes nor
gigabytes. S3 requests wait within the job's ``limits`` too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse
from urllib.request import url2pathname

from fedtune.core.errors import StoreError
from fedtune.data.formats import Example, Format, load_examples, load_numbered_examples
from fedtune.data.jsonl import DEFAULT_MAX_RECORD_BYTES, read_jsonl

if TYPE_CHECKING:
    from fedtune.config.job import LimitsConfig

__all__ = ["read_examples", "read_numbered_examples", "read_records"]

T = TypeVar("T")
DATASET = "the dataset"  # what gave the URI, when the caller does not say


def _local_path(uri: str) -> Path | None:
    """The file a local URI (a path or ``file://``) names; None for other schemes."""
    if uri.startswith("file://"):
        return Path(url2pathname(urlparse(uri).path))
    return None if "://" in uri else Path(uri)


def _check_local(uri: str, named: str) -> None:
    """A local dataset must be a file: say so, naming what gave it, before a store is opened
    (the store would only find no blob at that key)."""
    path = _local_path(uri)
    if path is None or path.is_file():
        return
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.suffix in (".jsonl", ".json"))[:3]
        raise StoreError(
            f"{named} {uri!r} is a folder, not a file",
            fix=f"Point {named} at one JSONL file"
            + (f" in it (e.g. {', '.join(inside)})." if inside else "."),
        )
    raise StoreError(
        f"{named} {uri!r}: no such file",
        fix=f"Check the path given as {named}: it must name an existing JSONL file "
        "(a path, file:// or s3:// URI).",
    )


@contextmanager
def _stream(
    uri: str, endpoint_url: str | None, limits: LimitsConfig | None, named: str
) -> Iterator[Any]:
    # Imported here so formats, templates and partitioners load without a store backend.
    from fedtune.storage import open_store, split_object_uri
    from fedtune.storage.s3 import S3Bounds

    _check_local(uri, named)
    root, key = split_object_uri(uri)
    store = open_store(root, endpoint_url=endpoint_url, bounds=S3Bounds.of(limits))
    with store.reading(key) as stream:  # type: ignore[attr-defined]
        yield stream


def _load(
    uri: str,
    endpoint_url: str | None,
    limits: LimitsConfig | None,
    parse: Callable[..., T],
    named: str,
    **kwargs: Any,
) -> T:
    bound = limits.max_record_bytes if limits is not None else DEFAULT_MAX_RECORD_BYTES
    with _stream(uri, endpoint_url, limits, named) as stream:
        return parse(stream, source=uri, max_record_bytes=bound, **kwargs)


def read_records(
    uri: str,
    *,
    endpoint_url: str | None = None,
    limits: LimitsConfig | None = None,
    named: str = DATASET,
) -> list[dict[str, Any]]:
    """The raw JSON objects of the JSON Lines file at ``uri`` (errors name the URI and line;
    ``named`` is what gave the URI, e.g. ``data_uri`` or ``--data``).

    Raises:
        StoreError: If the object cannot be read.
        DataError: On a malformed line.
    """
    return _load(uri, endpoint_url, limits, read_jsonl, named)


def read_examples(
    uri: str,
    format: Format | None = None,
    *,
    endpoint_url: str | None = None,
    limits: LimitsConfig | None = None,
    named: str = DATASET,
) -> list[Example]:
    """The examples of the dataset at ``uri``, format detected unless given.

    Raises:
        StoreError: If the object cannot be read.
        DataError: On a malformed line or record, or an empty file.
    """
    return _load(uri, endpoint_url, limits, load_examples, named, format=format)


def read_numbered_examples(
    uri: str,
    format: Format | None = None,
    *,
    endpoint_url: str | None = None,
    limits: LimitsConfig | None = None,
    named: str = DATASET,
) -> list[tuple[int, Example]]:
    """The examples at ``uri``, each with its line number in the file (from 1).

    Raises:
        StoreError: If the object cannot be read.
        DataError: On a malformed line or record, or an empty file.
    """
    return _load(uri, endpoint_url, limits, load_numbered_examples, named, format=format)
