"""Choosing a store by URI, and reading single objects named by URI."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.core.errors import StoreError
from fedtune.storage import (
    LocalStore,
    S3Store,
    open_store,
    read_object,
    split_object_uri,
)
from tests.helpers.moto import admin_client


def test_plain_and_file_paths_open_local_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for uri in (str(tmp_path), tmp_path.as_uri(), f"file://localhost{tmp_path}"):
        store = open_store(uri)
        assert isinstance(store, LocalStore)
        assert store.uri == tmp_path.as_uri()
    monkeypatch.chdir(tmp_path)
    assert open_store("runs/1").uri == (tmp_path / "runs" / "1").as_uri()


def test_file_uri_with_spaces_round_trips(tmp_path: Path) -> None:
    folder = tmp_path / "my runs"
    store = open_store(folder.as_uri())
    store.put_bytes("k", b"v")
    assert (folder / "k").read_bytes() == b"v"
    assert open_store(store.uri).get_bytes("k") == b"v"


def test_s3_uri_opens_s3_store_with_prefix(aws_env: str, bucket: str) -> None:
    store = open_store(f"s3://{bucket}/runs/42/")
    assert isinstance(store, S3Store)
    assert store.uri == f"s3://{bucket}/runs/42"
    assert open_store(f"s3://{bucket}").uri == f"s3://{bucket}"
    store.put_bytes("k", b"v")
    assert admin_client(aws_env).get_object(Bucket=bucket, Key="runs/42/k")["Body"].read() == b"v"


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("gs://bucket/x", "unsupported store URI scheme 'gs://'"),
        ("HTTP://host/x", "unsupported store URI scheme 'http://'"),
        ("s3:bucket/x", "malformed"),
        ("file:relative", "malformed"),
        ("file://relative/dir", "names host 'relative'"),
        ("file:///tmp/x?y=1", "'?' or '#'"),
        ("s3://Bad_Bucket/x", "not a valid S3 bucket name"),
        ("s3://ab/x", "not a valid S3 bucket name"),
        ("s3:///x", "not a valid S3 bucket name"),
        ("s3://bucket/a/../b", "'..'"),
        ("s3://bucket//a", "in URI 's3://bucket//a': prefix '/a' is absolute"),
        ("s3://bucket/a//b", "empty part"),
        ("", "non-empty string"),
    ],
)
def test_bad_store_uris_are_refused(uri: str, words: str) -> None:
    with pytest.raises(StoreError) as info:
        open_store(uri)
    assert words in str(info.value)


def test_unknown_scheme_lists_supported_ones() -> None:
    with pytest.raises(StoreError) as info:
        open_store("azure://container/x")
    assert "'azure://'" in str(info.value)
    assert "s3://" in info.value.fix and "file://" in info.value.fix


def test_credentials_in_s3_uri_are_refused_and_not_echoed() -> None:
    with pytest.raises(StoreError) as info:
        open_store("s3://AKIAEXAMPLE:hunter2secret@bucket/x")
    assert "hunter2secret" not in info.value.render()
    assert "AWS_SECRET_ACCESS_KEY" in info.value.fix


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://b-1/tenants/a/train.jsonl", ("s3://b-1/tenants/a", "train.jsonl")),
        ("s3://b-1/train.jsonl", ("s3://b-1", "train.jsonl")),
        ("/data/t/train.jsonl", ("file:///data/t", "train.jsonl")),
        ("file:///data/t/train.jsonl", ("file:///data/t", "train.jsonl")),
        ("/train.jsonl", ("file:///", "train.jsonl")),
    ],
)
def test_split_object_uri(uri: str, expected: tuple[str, str]) -> None:
    assert split_object_uri(uri) == expected


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("s3://b-1/tenants/a/", "names a folder"),
        ("s3://b-1", "names a bucket"),
        ("s3://b-1/", "names a folder"),
        ("s3://b-1/a/../secret", "'..'"),
        ("/data/x.sha256", "reserves"),
        ("ftp://host/x", "unsupported object URI scheme 'ftp://'"),
    ],
)
def test_split_object_uri_refuses(uri: str, words: str) -> None:
    with pytest.raises(StoreError) as info:
        split_object_uri(uri)
    assert words in str(info.value)


def test_read_object_local_without_sidecar(tmp_path: Path) -> None:
    data_file = tmp_path / "train.jsonl"
    data_file.write_bytes(b'{"instruction": "x"}\n')
    assert read_object(str(data_file)) == b'{"instruction": "x"}\n'
    assert read_object(data_file.as_uri()) == b'{"instruction": "x"}\n'
    with pytest.raises(StoreError, match=r"no \.sha256 checksum"):
        read_object(str(data_file), verify=True)


def test_read_object_from_s3_uploaded_by_a_person(aws_env: str, bucket: str) -> None:
    admin_client(aws_env).put_object(Bucket=bucket, Key="tenants/a/train.jsonl", Body=b"rows\n")
    assert read_object(f"s3://{bucket}/tenants/a/train.jsonl") == b"rows\n"
    with pytest.raises(StoreError, match=r"no blob at key 'missing\.jsonl'"):
        read_object(f"s3://{bucket}/tenants/a/missing.jsonl")


def test_read_object_still_checks_an_existing_sidecar(tmp_path: Path) -> None:
    from fedtune.core.errors import IntegrityError

    open_store(str(tmp_path)).put_bytes("a.bin", b"good")
    (tmp_path / "a.bin").write_bytes(b"evil")
    with pytest.raises(IntegrityError):
        read_object(str(tmp_path / "a.bin"))


def test_endpoint_precedence(monkeypatch: pytest.MonkeyPatch, aws_env: str, bucket: str) -> None:
    """Explicit argument, then FEDTUNE_S3_ENDPOINT_URL, then boto3's AWS_ENDPOINT_URL*."""
    monkeypatch.setenv("FEDTUNE_S3_ENDPOINT_URL", "http://127.0.0.1:9")
    assert open_store(f"s3://{bucket}", endpoint_url=aws_env).endpoint_url == aws_env  # type: ignore[attr-defined]
    assert open_store(f"s3://{bucket}").endpoint_url == "http://127.0.0.1:9"  # type: ignore[attr-defined]
    monkeypatch.delenv("FEDTUNE_S3_ENDPOINT_URL")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws_env)
    store = open_store(f"s3://{bucket}")
    assert store.endpoint_url == aws_env  # type: ignore[attr-defined]
    store.put_bytes("via-boto-env", b"ok")  # path-style addressing reaches the server
    assert store.get_bytes("via-boto-env") == b"ok"


def test_removal_command_names_every_file_and_sidecar(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedtune.storage.uri import removal_command

    local = removal_command("file:///data/my%20run", ["state/r.json"])
    assert local == "rm -f '/data/my run/state/r.json' '/data/my run/state/r.json.sha256'"
    monkeypatch.setenv("FEDTUNE_S3_ENDPOINT_URL", "http://minio:9000")
    remote = removal_command("s3://b/p", ["s/r.json"])
    assert remote == (
        "aws s3 rm --endpoint-url http://minio:9000 s3://b/p/s/r.json && "
        "aws s3 rm --endpoint-url http://minio:9000 s3://b/p/s/r.json.sha256"
    )
