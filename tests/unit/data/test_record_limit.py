"""``limits.max_record_bytes``: a huge record is skipped while the file streams, never held whole.

Before this bound a single 54 MB record cost minutes and gigabytes (the whole file was read,
split and decoded, and the record tokenized) before it was dropped.
"""

from __future__ import annotations

import json
import logging
import tracemalloc
from pathlib import Path

import pytest

from fedtune.config import parse_job
from fedtune.core.errors import IntegrityError
from fedtune.data.jsonl import bounded_lines
from fedtune.data.loader import read_examples, read_numbered_examples
from fedtune.storage import open_store
from tests.integration.conftest import tiny_job_dict

HUGE = 40 * 2**20  # 40 MiB in one line


def _record(text: str) -> str:
    return json.dumps({"instruction": text, "input": "", "output": "ok"})


def write_with_huge_record(path: Path) -> Path:
    """Line 1 and 3 are normal; line 2 holds one 40 MiB record (written in pieces)."""
    with path.open("w", encoding="utf-8") as out:
        out.write(_record("first") + "\n")
        out.write('{"instruction": "')
        chunk = "x" * 2**20
        for _ in range(HUGE // len(chunk)):
            out.write(chunk)
        out.write('", "input": "", "output": "ok"}\n')
        out.write(_record("third") + "\n")
    return path


def test_a_huge_record_is_skipped_while_reading_with_bounded_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_with_huge_record(tmp_path / "train.jsonl")
    tracemalloc.start()
    try:
        with caplog.at_level(logging.WARNING, logger="fedtune.data.jsonl"):
            numbered = read_numbered_examples(path.as_uri())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(n, e.instruction) for n, e in numbered] == [(1, "first"), (3, "third")]
    # The default bound is 1 MiB; what is held at once stays near it, far below the record.
    assert peak < 4 * 2**20, f"peak {peak / 2**20:.1f} MiB while reading"
    assert "line 2" in caplog.text and "max_record_bytes=1048576" in caplog.text
    assert "skipped" in caplog.text


def test_the_job_limit_is_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    long = _record("y" * 5000)
    path.write_text(_record("short") + "\n" + long + "\n", encoding="utf-8")
    job = parse_job(tiny_job_dict(tmp_path / "w", limits={"max_record_bytes": 4096}))
    assert [e.instruction for e in read_examples(str(path), limits=job.limits)] == ["short"]
    wide = parse_job(tiny_job_dict(tmp_path / "w", limits={"max_record_bytes": 8192}))
    assert len(read_examples(str(path), limits=wide.limits)) == 2


def test_a_line_at_the_bound_is_kept_one_byte_more_is_not() -> None:
    import io

    data = b"a" * 10 + b"\n" + b"b" * 11 + b"\n" + b"c"
    lines = list(bounded_lines(io.BytesIO(data), 10))
    assert lines == [(1, b"a" * 10, 10), (2, None, 11), (3, b"c", 1)]


def test_a_streamed_dataset_is_still_checked_against_its_sidecar(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "bucket"))
    store.put_bytes("train.jsonl", (_record("a") + "\n").encode())
    (tmp_path / "bucket" / "train.jsonl").write_text(_record("b") + "\n", encoding="utf-8")
    with pytest.raises(IntegrityError, match="does not match its checksum"):
        read_examples((tmp_path / "bucket" / "train.jsonl").as_uri())
