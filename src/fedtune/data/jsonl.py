"""JSON Lines reading and writing with errors that point at the file and line.

A dataset file is one JSON object per line (blank lines are skipped). Every problem is a
:class:`~fedtune.core.errors.DataError` naming the source (a path or a store URI) and the
1-based line number, so a tenant can fix the record without guessing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from fedtune.core.errors import DataError

__all__ = ["iter_jsonl", "read_jsonl", "write_jsonl"]

# Long lines are cut in messages: a record can be kilobytes of text.
_SNIPPET_CHARS = 80


def _snippet(text: str) -> str:
    return text if len(text) <= _SNIPPET_CHARS else text[:_SNIPPET_CHARS] + "..."


def _load_bytes(data: bytes | str | Path, source: str | None) -> tuple[bytes, str]:
    """Return the raw bytes and the name to use in messages."""
    if isinstance(data, bytes):
        return data, source or "<bytes>"
    path = Path(data)
    name = source or str(path)
    try:
        return path.read_bytes(), name
    except FileNotFoundError as exc:
        raise DataError(
            f"dataset file not found: {name}",
            fix="Check the path (or the tenant's data_uri) and that the file was written.",
        ) from exc
    except OSError as exc:
        raise DataError(
            f"cannot read dataset file {name}: {exc.strerror}",
            fix="Check that the path is a readable file, not a folder.",
        ) from exc


def iter_jsonl(
    data: bytes | str | Path, source: str | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, record)`` for every non-blank line.

    Args:
        data: The file's content as bytes, or a local path to read.
        source: The name shown in errors (e.g. the store URI); defaults to the path.

    Raises:
        DataError: On a missing file, undecodable UTF-8, invalid JSON or a non-object line.
    """
    raw, name = _load_bytes(data, source)
    # A UTF-8 byte-order mark is legal at the start of a file written by some editors.
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    for number, line_bytes in enumerate(raw.split(b"\n"), start=1):
        try:
            line = line_bytes.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{name}, line {number}: not valid UTF-8 (byte {exc.start + 1} of the line)",
                fix="Re-save the file as UTF-8.",
                record=number,
            ) from exc
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(
                f"{name}, line {number}: not valid JSON ({exc.msg}, column {exc.colno}): "
                f"{_snippet(line.strip())!r}",
                fix="Write one JSON object per line (JSON Lines); check quotes and commas.",
                record=number,
            ) from exc
        if not isinstance(record, dict):
            raise DataError(
                f"{name}, line {number}: expected a JSON object, got {type(record).__name__}: "
                f"{_snippet(line.strip())!r}",
                fix='Each line must be one object such as {"instruction": ..., "response": ...}.',
                record=number,
            )
        yield number, record


def read_jsonl(data: bytes | str | Path, source: str | None = None) -> list[dict[str, Any]]:
    """Read all records of a JSON Lines file or blob (see :func:`iter_jsonl`)."""
    return [record for _, record in iter_jsonl(data, source)]


def write_jsonl(records: Iterable[Mapping[str, Any]]) -> bytes:
    """Serialise records as UTF-8 JSON Lines, one object per line, keys in their given order.

    The output is byte-for-byte deterministic for the same records, which the shipped example
    data and the store's checksums rely on.

    Raises:
        DataError: If a record is not a mapping or holds a value JSON cannot represent.
    """
    lines: list[str] = []
    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise DataError(
                f"record {index} is a {type(record).__name__}, not a mapping",
                fix="Pass dicts of JSON-compatible values to write_jsonl.",
            )
        try:
            lines.append(json.dumps(dict(record), ensure_ascii=False, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise DataError(
                f"record {index} cannot be written as JSON: {exc}",
                fix="Use only strings, numbers, booleans, null, lists and dicts in records.",
            ) from exc
    return "".join(line + "\n" for line in lines).encode("utf-8")
