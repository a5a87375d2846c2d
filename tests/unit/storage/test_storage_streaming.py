"""Streaming reads from a store (datasets): S3 bodies in pieces, with the record bound."""

from __future__ import annotations

import json

from fedtune.data.loader import read_numbered_examples
from fedtune.storage import open_store


def _record(text: str) -> str:
    return json.dumps({"instruction": text, "input": "", "output": "ok"})


def test_a_huge_record_in_s3_is_skipped_too(aws_env: str, bucket: str) -> None:
    store = open_store(f"s3://{bucket}/data")
    body = _record("first") + "\n" + _record("z" * (3 * 2**20)) + "\n" + _record("third") + "\n"
    store.put_bytes("train.jsonl", body.encode())
    got = read_numbered_examples(f"s3://{bucket}/data/train.jsonl")
    assert [(n, e.instruction) for n, e in got] == [(1, "first"), (3, "third")]
