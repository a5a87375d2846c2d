"""S3-only behaviour: pre-signed URLs, unreachable endpoints, missing buckets, credentials."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from fedtune.core.errors import StoreError
from fedtune.storage import open_store, sidecar_key
from fedtune.storage.keys import sha256_hex
from tests.helpers.moto import FAKE_SECRET_KEY, use_fake_aws_env


def _http(url: str, data: bytes | None = None) -> bytes:
    # urllib's default Content-Type for a body is a web form, which moto's server parses away;
    # octet-stream is what an uploader should send anyway (the URL does not sign the type).
    request = urllib.request.Request(
        url,
        data=data,
        method="PUT" if data is not None else "GET",
        headers={"Content-Type": "application/octet-stream"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return bytes(response.read())


def test_presigned_get_reads_without_credentials(aws_env: str, bucket: str) -> None:
    store = open_store(f"s3://{bucket}/exchange").child("round-1")
    store.put_tensors("broadcast.safetensors", {})
    url = store.presigned_url("broadcast.safetensors", method="get", expires_s=60)
    assert FAKE_SECRET_KEY not in url
    assert _http(url) == store.get_bytes("broadcast.safetensors")
    sidecar_url = store.presigned_url(sidecar_key("broadcast.safetensors"), method="get")
    assert _http(sidecar_url).decode() == sha256_hex(_http(url))


def test_presigned_put_of_blob_and_sidecar_makes_a_verified_blob(aws_env: str, bucket: str) -> None:
    """A tenant pod with only two URLs writes an update the provider can verify."""
    store = open_store(f"s3://{bucket}/exchange/round-1")
    update = b"update bytes from a tenant pod"
    _http(store.presigned_url("update.bin", method="put"), update)
    assert not store.exists("update.bin")  # blob alone is incomplete
    _http(store.presigned_url("update.bin.sha256", method="put"), sha256_hex(update).encode())
    assert store.exists("update.bin")
    assert store.get_bytes("update.bin") == update


def test_presigned_url_names_one_key_and_expiry(aws_env: str, bucket: str) -> None:
    # moto does not check signatures, so enforcement is S3's job; what the URL grants is ours.
    store = open_store(f"s3://{bucket}/exchange").child("round-1")
    url = urllib.parse.urlsplit(store.presigned_url("update.bin", method="put", expires_s=90))
    assert url.path == f"/{bucket}/exchange/round-1/update.bin"
    query = urllib.parse.parse_qs(url.query)
    assert query["X-Amz-Expires"] == ["90"]
    assert query["X-Amz-SignedHeaders"] == ["host"]


@pytest.mark.parametrize(
    ("key", "method", "expires_s", "words"),
    [
        ("../x", "get", 60, "'..'"),
        ("a.sha256.sha256", "get", 60, "reserves"),
        ("a", "delete", 60, "method must be 'get' or 'put'"),
        ("a", "get", 0, "expires_s must be 1..604800"),
        ("a", "get", 8 * 24 * 3600, "expires_s must be 1..604800"),
    ],
)
def test_presigned_url_refuses_bad_arguments(
    aws_env: str, bucket: str, key: str, method: str, expires_s: int, words: str
) -> None:
    with pytest.raises(StoreError) as info:
        open_store(f"s3://{bucket}").presigned_url(key, method=method, expires_s=expires_s)  # type: ignore[arg-type]
    assert words in str(info.value)


def test_local_store_has_no_presigned_urls(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot issue pre-signed URLs") as info:
        open_store(str(tmp_path)).presigned_url("a", method="get")
    assert "s3://" in info.value.fix


def test_unreachable_endpoint_fails_fast_with_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    use_fake_aws_env(monkeypatch, "http://127.0.0.1:9")
    store = open_store("s3://some-bucket/runs")
    started = time.monotonic()
    with pytest.raises(StoreError) as info:
        store.get_bytes("k")
    assert time.monotonic() - started < 10
    assert "http://127.0.0.1:9" in str(info.value)
    assert "unreachable" in str(info.value)
    assert "FEDTUNE_S3_ENDPOINT_URL" in info.value.fix
    assert info.value.__cause__ is None  # no raw botocore chain for the user to wade through


def test_missing_bucket_names_bucket(aws_env: str) -> None:
    store = open_store("s3://no-such-bucket-here/x")
    with pytest.raises(StoreError, match="NoSuchBucket") as info:
        store.put_bytes("k", b"v")
    assert "no-such-bucket-here" in info.value.fix
    with pytest.raises(StoreError, match="NoSuchBucket"):
        store.list()


def test_missing_credentials_say_which_variables(
    monkeypatch: pytest.MonkeyPatch, aws_env: str
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(StoreError, match="no usable S3 credentials") as info:
        open_store("s3://any-bucket/x").get_bytes("k")
    assert "AWS_ACCESS_KEY_ID" in info.value.fix


def test_credentials_never_reach_logs_or_errors(
    aws_env: str, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="fedtune")
    store = open_store(f"s3://{bucket}/x")
    store.put_json("k.json", {"a": 1})
    store.get_json("k.json")
    with pytest.raises(StoreError) as info:
        store.get_bytes("missing")
    assert caplog.records  # the store did log
    assert FAKE_SECRET_KEY not in caplog.text
    assert FAKE_SECRET_KEY not in info.value.render()
    assert FAKE_SECRET_KEY not in repr(store)


def test_local_stores_never_import_boto3(tmp_path: Path) -> None:
    code = (
        "import sys; from fedtune.storage import open_store, read_object; "
        f"s = open_store({str(tmp_path)!r}); s.put_bytes('k', b'v'); s.get_bytes('k'); "
        "sys.exit(1 if any(m.split('.')[0] in ('boto3', 'botocore') for m in sys.modules) else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr or "boto3 was imported by a local store"


def test_urls_are_signed_by_the_presigner_keys_when_set(
    aws_env: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedtune.config.secrets import PRESIGNER_ENV
    from tests.helpers.moto import FAKE_ACCESS_KEY

    store = open_store(f"s3://{bucket}/exchange")
    store.put_bytes("update.bin", b"payload")
    monkeypatch.setenv(PRESIGNER_ENV["access-key-id"], "PRESIGNERKEYID0000001")
    monkeypatch.setenv(PRESIGNER_ENV["secret-access-key"], "presigner-secret-never-in-a-url")
    url = store.presigned_url("update.bin", method="get", expires_s=60)
    credential = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["X-Amz-Credential"][0]
    assert credential.startswith("PRESIGNERKEYID0000001/")
    assert FAKE_ACCESS_KEY not in url and "presigner-secret-never-in-a-url" not in url
    assert _http(url) == b"payload"  # moto accepts any key: the signer is what is checked above
    # The store's own reads and writes keep the provider's credentials.
    assert store.get_bytes("update.bin") == b"payload"


def test_half_a_presigner_key_pair_is_refused(
    aws_env: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedtune.config.secrets import PRESIGNER_ENV

    monkeypatch.setenv(PRESIGNER_ENV["access-key-id"], "PRESIGNERKEYID0000001")
    monkeypatch.delenv(PRESIGNER_ENV["secret-access-key"], raising=False)
    with pytest.raises(StoreError, match="FEDTUNE_PRESIGN_SECRET_ACCESS_KEY is empty") as info:
        open_store(f"s3://{bucket}").presigned_url("a", method="get")
    assert "presigner" in info.value.fix
