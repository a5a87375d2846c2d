"""JSON Lines reading and writing with errors that point at the file and line.

A dataset file is one JSON object per line (blank lines are skipped). Every problem is a
:class:`~fedtune.core.errors.DataError` naming the source (a path or a store URI) and the
1-based line number, so a tenant can fix the record without guessing.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from fedtune.core.errors import DataError

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "bounded_lines", "iter_jsonl", "read_jsonl", "write_jsonl"]

logger = logging.getLogger(__name__)

# Long lines are cut in messages: a record can be kilobytes of text.
_SNIPPET_CHARS = 80


def _snippet(text: str) -> str:
    return text if len(text) <= _SNIPPET_CHARS else text[:_SNIPPET_CHARS] + "..."


DEFAULT_MAX_RECORD_BYTES = 2**20
"""The longest dataset line read when no ``limits.max_record_bytes`` is given (1 MiB)."""

_CHUNK = 2**16


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


@contextmanager
def _opened(data: bytes | str | Path | _Readable, source: str | None) -> Iterator[tuple[_Readable, str]]:
    """A stream of the data and the name to use in messages."""
    if isinstance(data, bytes):
        yield io.BytesIO(data), source or "<bytes>"
        return
    if not isinstance(data, str | Path):
        yield data, source or "<stream>"
        return
    path = Path(data)
    name = source or str(path)
    try:
        handle = open(path, "rb")  # noqa: SIM115 (closed below)
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
    with handle:
        yield handle, name


def bounded_lines(stream: _Readable, max_bytes: int | None) -> Iterator[tuple[int, bytes | None, int]]:
    """Yield ``(line_number, line, size)`` for every line of ``stream``, read in pieces.

    A line longer than ``max_bytes`` comes as ``None`` (with its size): its bytes are read
    and dropped as they arrive, so no more than ``max_bytes`` plus one piece is ever held.
    """
    number, size, line, oversized = 1, 0, bytearray(), False
    while block := stream.read(_CHUNK):
        start = 0
        while True:
            end = block.find(b"\n", start)
            piece = block[start:] if end < 0 else block[start:end]
            size += len(piece)
            if not oversized:
                line += piece
                if max_bytes is not None and size > max_bytes:
                    oversized, line = True, bytearray()
            if end < 0:
                break
            yield number, None if oversized else bytes(line), size
            number, size, line, oversized = number + 1, 0, bytearray(), False
            start = end + 1
    if size or oversized:
        yield number, None if oversized else bytes(line), size


def iter_jsonl(
    data: bytes | str | Path | _Readable,
    source: str | None = None,
    *,
    max_record_bytes: int | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, record)`` for every non-blank line.

    Args:
        data: The file's content as bytes, a local path, or a binary stream (read in pieces).
        source: The name shown in errors (e.g. the store URI); defaults to the path.
        max_record_bytes: Lines longer than this are skipped as they are read, each with a
            warning naming its line (``None``: no bound).

    Raises:
        DataError: On a missing file, undecodable UTF-8, invalid JSON or a non-object line.
    """
    with _opened(data, source) as (stream, name):
        for number, line_bytes, size in bounded_lines(stream, max_record_bytes):
            if line_bytes is None:
                logger.warning(
                    "%s, line %d: record of %d bytes exceeds limits.max_record_bytes=%d; "
                    "skipped without reading it whole",
                    name, number, size, max_record_bytes,
                )
                continue
            # A UTF-8 byte-order mark is legal at the start of a file written by some editors.
            if number == 1 and line_bytes.startswith(b"\xef\xbb\xbf"):
                line_bytes = line_bytes[3:]
            record = _record(line_bytes, number, name)
            if record is not None:
                yield number, record


def _record(line_bytes: bytes, number: int, name: str) -> dict[str, Any] | None:
    """The JSON object on one line (``None`` for a blank line)."""
    try:
        line = line_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{name}, line {number}: not valid UTF-8 (byte {exc.start + 1} of the line)",
            fix="Re-save the file as UTF-8.",
            record=number,
        ) from exc
    if not line.strip():
        return None
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
    return record


def read_jsonl(
    data: bytes | str | Path | _Readable,
    source: str | None = None,
    *,
    max_record_bytes: int | None = None,
) -> list[dict[str, Any]]:
    """Read all records of a JSON Lines file or blob (see :func:`iter_jsonl`)."""
    return [record for _, record in iter_jsonl(data, source, max_record_bytes=max_record_bytes)]


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
