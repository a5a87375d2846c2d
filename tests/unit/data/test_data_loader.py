"""Reading datasets by store URI: errors carry the URI, not a temporary path."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.core.errors import DataError, StoreError
from fedtune.data.formats import Example
from fedtune.data.loader import read_examples, read_records


def test_read_examples_by_file_uri(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text('{"instruction": "Say hi.", "input": "", "output": "Hi"}\n')
    assert read_examples(path.as_uri()) == [Example("Say hi.", "", "Hi", None)]
    assert read_records(str(path)) == [{"instruction": "Say hi.", "input": "", "output": "Hi"}]


def test_bad_record_error_names_the_uri_and_line(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q2"}\n')
    with pytest.raises(DataError, match=rf"{path.as_uri()}, line 2: gsm8k record is missing"):
        read_examples(path.as_uri())


def test_missing_object_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        read_records((tmp_path / "absent.jsonl").as_uri())
