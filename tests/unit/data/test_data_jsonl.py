"""JSON Lines reading and writing: round trips and errors that name file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.core.errors import DataError
from fedtune.data.jsonl import iter_jsonl, read_jsonl, write_jsonl


def test_round_trip_keeps_order_and_unicode() -> None:
    records = [{"b": "ünï ✓", "a": 1}, {"x": [1, 2], "y": None}]
    data = write_jsonl(records)
    assert data == '{"b": "ünï ✓", "a": 1}\n{"x": [1, 2], "y": null}\n'.encode()
    assert read_jsonl(data, "mem") == records


def test_blank_lines_crlf_and_bom_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n\r\n   \n{"a": 2}\r\n')
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (4, {"a": 2})]
    assert read_jsonl(str(path)) == [{"a": 1}, {"a": 2}]


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        (b'{"a": 1}\n\n{"a": 2,}\n', r"src\.jsonl, line 3: not valid JSON .*'\{\"a\": 2,\}'"),
        (b'{"a": 1}\n[1, 2]\n', r"src\.jsonl, line 2: expected a JSON object, got list"),
        (b'"just a string"\n', r"src\.jsonl, line 1: expected a JSON object, got str"),
        (b'{"a": 1}\n{"a": "\xff"}\n', r"src\.jsonl, line 2: not valid UTF-8"),
    ],
    ids=["bad-json", "array-line", "string-line", "bad-utf8"],
)
def test_bad_lines_name_file_and_line(data: bytes, pattern: str) -> None:
    with pytest.raises(DataError, match=pattern) as info:
        read_jsonl(data, "src.jsonl")
    assert info.value.fix


def test_missing_file_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"dataset file not found: .*nope\.jsonl"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_folder_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot read dataset file"):
        read_jsonl(tmp_path)


@pytest.mark.parametrize(
    ("records", "pattern"),
    [
        ([["not", "a", "dict"]], "record 0 is a list, not a mapping"),
        ([{"ok": 1}, {"bad": {1, 2}}], "record 1 cannot be written as JSON"),
        ([{"nan": float("nan")}], "record 0 cannot be written as JSON"),
    ],
    ids=["not-mapping", "set-value", "nan"],
)
def test_write_rejects_unserialisable_records(records: list[object], pattern: str) -> None:
    with pytest.raises(DataError, match=pattern):
        write_jsonl(records)  # type: ignore[arg-type]
