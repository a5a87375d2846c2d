"""Reading a dataset named by a store URI (a tenant's bucket or a local file).

The object is streamed, never read whole: a line longer than ``limits.max_record_bytes``
(default 1 MiB) is skipped as it arrives, so one huge record costs neither minutes nor
gigabytes. S3 requests wait within the job's ``limits`` too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from fedtune.data.formats import Example, Format, load_examples, load_numbered_examples
from fedtune.data.jsonl import DEFAULT_MAX_RECORD_BYTES, read_jsonl

if TYPE_CHECKING:
    from fedtune.config.job import LimitsConfig

__all__ = ["read_examples", "read_numbered_examples", "read_records"]

T = TypeVar("T")


@contextmanager
def _stream(uri: str, endpoint_url: str | None, limits: LimitsConfig | None) -> Iterator[Any]:
    # Imported here so formats, templates and partitioners load without a store backend.
    from fedtune.storage import open_store, split_object_uri
    from fedtune.storage.s3 import S3Bounds

    root, key = split_object_uri(uri)
    store = open_store(root, endpoint_url=endpoint_url, bounds=S3Bounds.of(limits))
    with store.reading(key) as stream:  # type: ignore[attr-defined]
        yield stream


def _load(
    uri: str,
    endpoint_url: str | None,
    limits: LimitsConfig | None,
    parse: Callable[..., T],
    **kwargs: Any,
) -> T:
    bound = limits.max_record_bytes if limits is not None else DEFAULT_MAX_RECORD_BYTES
    with _stream(uri, endpoint_url, limits) as stream:
        return parse(stream, source=uri, max_record_bytes=bound, **kwargs)


def read_records(
    uri: str, *, endpoint_url: str | None = None, limits: LimitsConfig | None = None
) -> list[dict[str, Any]]:
    """The raw JSON objects of the JSON Lines file at ``uri`` (errors name the URI and line).

    Raises:
        StoreError: If the object cannot be read.
        DataError: On a malformed line.
    """
    return _load(uri, endpoint_url, limits, read_jsonl)


def read_examples(
    uri: str,
    format: Format | None = None,
    *,
    endpoint_url: str | None = None,
    limits: LimitsConfig | None = None,
) -> list[Example]:
    """The examples of the dataset at ``uri``, format detected unless given.

    Raises:
        StoreError: If the object cannot be read.
        DataError: On a malformed line or record, or an empty file.
    """
    return _load(uri, endpoint_url, limits, load_examples, format=format)


def read_numbered_examples(
    uri: str,
    format: Format | None = None,
    *,
    endpoint_url: str | None = None,
    limits: LimitsConfig | None = None,
) -> list[tuple[int, Example]]:
    """The examples at ``uri``, each with its line number in the file (from 1).

    Raises:
        StoreError: If the object cannot be read.
        DataError: On a malformed line or record, or an empty file.
    """
    return _load(uri, endpoint_url, limits, load_numbered_examples, format=format)
