"""Reading a dataset named by a store URI (a tenant's bucket or a local file)."""

from __future__ import annotations

from typing import Any

from fedtune.data.formats import Example, Format, load_examples, load_numbered_examples
from fedtune.data.jsonl import read_jsonl

__all__ = ["read_examples", "read_numbered_examples", "read_records"]


def _read(uri: str, endpoint_url: str | None) -> bytes:
    # Imported here so formats, templates and partitioners load without a store backend.
    from fedtune.storage import read_object

    return read_object(uri, endpoint_url=endpoint_url)


def read_records(uri: str, *, endpoint_url: str | None = None) -> list[dict[str, Any]]:
    """The raw JSON objects of the JSON Lines file at ``uri`` (errors name the URI and line).

    Raises:
        StoreError: If the object cannot be read.
        DataError: On a malformed line.
    """
    return read_jsonl(_read(uri, endpoint_url), source=uri)


def read_examples(
    uri: str, format: Format | None = None, *, endpoint_url: str | None = None
) -> list[Example]:
    """The examples of the dataset at ``uri``, format detected unless given.

    Raises:
        StoreError: If the object cannot be read.
        DataError: On a malformed line or record, or an empty file.
    """
    return load_examples(_read(uri, endpoint_url), source=uri, format=format)


def read_numbered_examples(
    uri: str, format: Format | None = None, *, endpoint_url: str | None = None
) -> list[tuple[int, Example]]:
    """The examples at ``uri``, each with its line number in the file (from 1).

    Raises:
        StoreError: If the object cannot be read.
        DataError: On a malformed line or record, or an empty file.
    """
    return load_numbered_examples(_read(uri, endpoint_url), source=uri, format=format)
