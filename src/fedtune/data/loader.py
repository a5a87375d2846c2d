"""Reading a dataset named by a store URI (a tenant's bucket or a local file).

JSON Lines is streamed, never read whole: a line longer than ``limits.max_record_bytes``
(default 1 MiB) is skipped as it arrives, so one huge record costs neither minutes nor
gigabytes. JSON, CSV, Parquet and ``save_to_disk`` folders are read by the ``datasets``
library (:mod:`fedtune.data.files`, which says how each is told apart). S3 requests wait
within the job's ``limits`` too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse
from urllib.request import url2pathname

from fedtune.core.errors import StoreError
from fedtune.data.formats import (
    Example,
    Format,
    load_examples,
    load_numbered_examples,
    numbered_examples,
)
from fedtune.data.jsonl import DEFAULT_MAX_RECORD_BYTES, read_jsonl

if TYPE_CHECKING:
    from fedtune.config.job import LimitsConfig

__all__ = ["read_examples", "read_numbered_examples", "read_records"]

T = TypeVar("T")
Rows = list[tuple[int, dict[str, Any]]]
DATASET = "the dataset"  # what gave the URI, when the caller does not say
#: What a folder may hold that is a dataset file (named in the fix for a folder given).
_DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
#: A folder holding one of these is a datasets folder; fedtune.data.files reads or refuses it.
_FOLDER_MARKERS = ("state.json", "dataset_dict.json")


def _local_path(uri: str) -> Path | None:
    """The file a local URI (a path or ``file://``) names; None for other schemes."""
    if uri.startswith("file://"):
        return Path(url2pathname(urlparse(uri).path))
    return None if "://" in uri else Path(uri)


def _check_local(uri: str, named: str) -> None:
    """A local dataset must be a file or a ``save_to_disk`` folder: say so, naming what gave
    it, before a store is opened (the store would only find no blob at that key)."""
    path = _local_path(uri)
    if path is None or path.is_file() or any((path / f).is_file() for f in _FOLDER_MARKERS):
        return
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.suffix in _DATA_SUFFIXES)[:3]
        raise StoreError(
            f"{named} {uri!r} is a folder, not a dataset file or a save_to_disk folder",
            fix=f"Point {named} at one dataset file"
            + (f" in it (e.g. {', '.join(inside)})." if inside else " (JSONL, JSON, CSV or Parquet)."),
        )
    raise StoreError(
        f"{named} {uri!r}: no such file",
        fix=f"Check the path given as {named}: it must name an existing dataset file or "
        "save_to_disk folder (a path, file:// or s3:// URI).",
    )


@contextmanager
def _opened(
    uri: str, endpoint_url: str | None, limits: LimitsConfig | None, named: str
) -> Iterator[tuple[Any, str]]:
    """The store holding ``uri``'s object (or folder) and its key there."""
    # Imported here so formats, templates and partitioners load without a store backend.
    from fedtune.storage import open_store, split_object_uri
    from fedtune.storage.s3 import S3Bounds

    _check_local(uri, named)
    try:  # a save_to_disk folder may be named with a trailing "/"; a file never is
        root, key = split_object_uri(uri.rstrip("/") if uri.endswith("/") else uri)
    except StoreError:
        root, key = split_object_uri(uri)  # the message names what the user wrote
    yield open_store(root, endpoint_url=endpoint_url, bounds=S3Bounds.of(limits)), key


def _load(
    uri: str,
    endpoint_url: str | None,
    limits: LimitsConfig | None,
    parse: Callable[..., T],
    from_rows: Callable[[Rows], T],
    named: str,
    **kwargs: Any,
) -> T:
    from fedtune.data.files import kind_of, read_rows

    bound = limits.max_record_bytes if limits is not None else DEFAULT_MAX_RECORD_BYTES
    with _opened(uri, endpoint_url, limits, named) as (store, key):
        kind = kind_of(store, key)
        if kind is not None:
            return from_rows(read_rows(store, key, uri, kind, max_record_bytes=bound))
        if uri.endswith("/"):
            from fedtune.storage import split_object_uri

            split_object_uri(uri)  # a folder that holds no dataset: the store's own message
        with store.reading(key) as stream:
            return parse(stream, source=uri, max_record_bytes=bound, **kwargs)


def read_records(
    uri: str,
    *,
    endpoint_url: str | None = None,
    limits: LimitsConfig | None = None,
    named: str = DATASET,
) -> list[dict[str, Any]]:
    """The raw records of the dataset at ``uri`` (JSON Lines objects, or the rows of a JSON,
    CSV, Parquet or ``save_to_disk`` dataset); errors name the URI and line or row, and
    ``named`` is what gave the URI (``data_uri``, ``--data``).

    Raises:
        StoreError: If the object cannot be read.
        DataError: On a malformed line or file.
    """
    return _load(uri, endpoint_url, limits, read_jsonl, lambda rows: [r for _, r in rows], named)


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
    return _load(
        uri, endpoint_url, limits, load_examples,
        lambda rows: [e for _, e in numbered_examples(rows, uri, format, unit="row")],
        named,
        format=format,
    )


def read_numbered_examples(
    uri: str,
    format: Format | None = None,
    *,
    endpoint_url: str | None = None,
    limits: LimitsConfig | None = None,
    named: str = DATASET,
) -> list[tuple[int, Example]]:
    """The examples at ``uri``, each with its line (JSON Lines) or row number (from 1).

    Raises:
        StoreError: If the object cannot be read.
        DataError: On a malformed line or record, or an empty file.
    """
    return _load(
        uri, endpoint_url, limits, load_numbered_examples,
        lambda rows: numbered_examples(rows, uri, format, unit="row"),
        named,
        format=format,
    )
