"""A store in an S3 bucket (``s3://bucket/prefix``): AWS, MinIO, or any S3-compatible server.

The only module that imports boto3, and only when an S3 store is opened, so local runs never
pay for it. Credentials come from boto3's own chain (environment, mounted files, instance
roles); this module never reads, stores or logs them.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Literal

from fedtune.core.errors import StoreError, StoreUnavailable
from fedtune.storage.blobstore import BlobStore

logger = logging.getLogger(__name__)

ENDPOINT_ENV = "FEDTUNE_S3_ENDPOINT_URL"
"""Environment variable naming the S3 endpoint (e.g. ``http://minio.fedtune:9000``)."""

_BOTO_ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}

@dataclass(frozen=True)
class S3Bounds:
    """How long an S3 request may wait, and how often it is tried (a job's ``limits``).

    Few, short attempts: an endpoint that is down or hung fails a step within seconds with a
    clear message, not after minutes in botocore's default schedule (60 s reads, retried).
    """

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    max_attempts: int = 3

    @classmethod
    def of(cls, limits: Any) -> S3Bounds:
        """The bounds a job's ``limits`` section sets (``None``: the defaults)."""
        if limits is None:
            return cls()
        return cls(
            limits.store_connect_timeout_s, limits.store_read_timeout_s, limits.store_max_attempts
        )

    def describe(self) -> str:
        """The bounds in words, for error messages."""
        return (
            f"{self.max_attempts} attempt(s), each {self.connect_timeout_s:g} s to connect and "
            f"{self.read_timeout_s:g} s per answer"
        )


def validate_bucket(bucket: str) -> str:
    """Return ``bucket`` if it is a valid S3 bucket name, else raise ``StoreError``."""
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise StoreError(
            f"{bucket!r} is not a valid S3 bucket name",
            fix="Use 3-63 lowercase letters, digits, '.' and '-', starting and ending with a "
            "letter or digit, as in s3://my-bucket/some/prefix.",
        )
    return bucket


def resolve_endpoint(endpoint_url: str | None) -> str | None:
    """The endpoint to pass to boto3: the argument, else ``$FEDTUNE_S3_ENDPOINT_URL``.

    ``None`` lets boto3 decide (``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, else AWS).
    """
    return endpoint_url or os.environ.get(ENDPOINT_ENV) or None


def make_client(
    endpoint_url: str | None,
    bounds: S3Bounds | None = None,
    credentials: tuple[str, str] | None = None,
) -> Any:
    """An S3 client for ``endpoint_url`` whose requests wait and retry within ``bounds``;
    ``credentials`` (key id, secret) instead of boto3's chain when given."""
    import boto3
    import botocore.session
    from botocore.config import Config

    bounds = bounds or S3Bounds()
    custom = endpoint_url or any(os.environ.get(v) for v in _BOTO_ENDPOINT_ENVS)
    config = Config(
        connect_timeout=bounds.connect_timeout_s,
        read_timeout=bounds.read_timeout_s,
        retries={"total_max_attempts": bounds.max_attempts, "mode": "standard"},
        # boto3 still pre-signs with the deprecated SigV2 unless told; newer AWS regions
        # reject it, and SigV4 URLs carry their expiry explicitly.
        signature_version="s3v4",
        # MinIO and other self-hosted servers are addressed as host/bucket: their buckets
        # are not DNS names under the endpoint's host.
        s3={"addressing_style": "path"} if custom else None,
    )
    # A fresh session per store so credentials are read from the environment now (a shared
    # session would cache the first ones it saw), but with one shared loader of botocore's
    # service models, which would otherwise re-parse large JSON files for every store.
    core = botocore.session.Session()
    core.register_component("data_loader", _shared_loader())
    session = boto3.session.Session(botocore_session=core)
    keys = {}
    if credentials is not None:
        keys = {"aws_access_key_id": credentials[0], "aws_secret_access_key": credentials[1]}
    return session.client("s3", endpoint_url=endpoint_url, config=config, **keys)


PRESIGNER_ENV: Final[dict[str, str]] = {
    "access-key-id": "FEDTUNE_PRESIGN_ACCESS_KEY_ID",
    "secret-access-key": "FEDTUNE_PRESIGN_SECRET_ACCESS_KEY",
}
"""Key of the presigner Secret -> the variable the launcher signs with (boto3 ignores them,
so the launcher's own reads and writes keep the provider's credentials)."""


def presigner_credentials() -> tuple[str, str] | None:
    """The presigning user's keys from the environment, or None when none are set.

    A pre-signed URL can do what its signer can: signing with a user allowed only to get and
    put exchange objects keeps the provider's own keys out of every URL tenants hold.
    """
    names = list(PRESIGNER_ENV.values())
    values = [os.environ.get(name, "") for name in names]
    if not any(values):
        return None
    missing = [name for name, value in zip(names, values, strict=True) if not value]
    if missing:
        raise StoreError(
            f"${missing[0]} is empty while ${names[0] if missing[0] != names[0] else names[1]} "
            "is set",
            fix="Give the presigner Secret both keys (access-key-id, secret-access-key), or "
            "neither to sign with the store's own credentials.",
        )
    return values[0], values[1]


@functools.cache
def _shared_loader() -> Any:
    """botocore's data loader, made once per process (it caches what it parses)."""
    import botocore.session

    return botocore.session.get_session().get_component("data_loader")


class S3Store(BlobStore):
    """Blobs as objects under ``s3://bucket/prefix``.

    Args:
        bucket: Bucket name; the bucket must exist.
        prefix: Folder inside the bucket this store is confined to (``""``: the whole bucket).
        endpoint_url: S3 endpoint; default ``$FEDTUNE_S3_ENDPOINT_URL``, else boto3's own.
        client: An existing boto3 S3 client to share (children reuse their parent's).
        bounds: Timeouts and attempts of every request (default: :class:`S3Bounds`).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        client: Any | None = None,
        bounds: S3Bounds | None = None,
    ) -> None:
        super().__init__(prefix)
        self._bucket = validate_bucket(bucket)
        self._bounds = bounds or S3Bounds()
        self._client = (
            client if client is not None else make_client(resolve_endpoint(endpoint_url), self._bounds)
        )

    @property
    def uri(self) -> str:
        """``s3://bucket/prefix`` of the folder this store is confined to."""
        return f"s3://{self._bucket}/{self._prefix}" if self._prefix else f"s3://{self._bucket}"

    @property
    def endpoint_url(self) -> str:
        """The endpoint requests go to (as boto3 resolved it)."""
        return str(self._client.meta.endpoint_url)

    @contextmanager
    def _errors(self, action: str, name: str) -> Iterator[None]:
        """Turn botocore's exceptions into StoreErrors that say where and what to do."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionError,
            HTTPClientError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        where = f"s3://{self._bucket}/{name}"
        try:
            yield
        except (NoCredentialsError, PartialCredentialsError) as exc:
            raise StoreError(
                f"cannot {action} {where}: no usable S3 credentials ({type(exc).__name__})",
                fix="Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment (from "
                "the bucket's secret), or mount an AWS credentials file.",
            ) from None
        except (ConnectionError, HTTPClientError) as exc:
            raise StoreUnavailable(
                f"store outage: cannot {action} {where}: S3 endpoint {self.endpoint_url} is "
                f"unreachable or did not answer ({type(exc).__name__}; "
                f"{self._bounds.describe()})",
                fix=f"Check {ENDPOINT_ENV} (or AWS_ENDPOINT_URL), that the server is running, "
                "and the network path (DNS, network policies, proxies) to it; a slow but "
                "working server needs larger limits.store_read_timeout_s / store_max_attempts.",
            ) from None
        except ClientError as exc:
            err = exc.response.get("Error", {})
            code = str(err.get("Code", "?"))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "NoSuchBucket":
                fix = f"Create bucket {self._bucket!r} or correct the store URI."
            elif code in {"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"}:
                fix = (
                    "Check that the credentials in the environment are the bucket's and "
                    f"allow {action} under s3://{self._bucket}/{self._prefix}."
                )
            else:
                fix = f"Check the endpoint {self.endpoint_url} and the bucket's settings."
            raise StoreError(
                f"cannot {action} {where} at {self.endpoint_url}: {code} (HTTP {status}) "
                f"{err.get('Message', '')}".rstrip(),
                fix=fix,
            ) from None
        except BotoCoreError as exc:
            raise StoreError(
                f"cannot {action} {where} at {self.endpoint_url}: {exc}",
                fix=f"Check {ENDPOINT_ENV}, the credentials and the network path to S3.",
            ) from None

    @staticmethod
    def _is_missing(exc: Exception) -> bool:
        from botocore.exceptions import ClientError

        return isinstance(exc, ClientError) and (
            str(exc.response.get("Error", {}).get("Code")) in _MISSING_CODES
        )

    def _write(self, name: str, data: bytes) -> None:
        # A single PUT is atomic in S3: readers see the old object or the whole new one.
        with self._errors("write", name):
            self._client.put_object(Bucket=self._bucket, Key=name, Body=data)

    def _read(self, name: str) -> bytes | None:
        body = self._open(name)
        if body is None:
            return None
        try:
            return body.read()
        finally:
            body.close()

    def _open(self, name: str) -> _Body | None:
        with self._errors("read", name):
            try:
                response = self._client.get_object(Bucket=self._bucket, Key=name)
            except Exception as exc:
                if self._is_missing(exc):
                    return None
                raise
        return _Body(response["Body"], lambda: self._errors("read", name))

    def _has(self, name: str) -> bool:
        with self._errors("check", name):
            try:
                self._client.head_object(Bucket=self._bucket, Key=name)
            except Exception as exc:
                if self._is_missing(exc):
                    return False
                raise
            return True

    def _copy_within(self, name: str, dst: BlobStore, dst_name: str) -> bool:
        """S3 copies where both stores are on one endpoint (``CopyObject``, in parts above
        boto3's multipart threshold, as a large package needs), with ``dst``'s credentials."""
        if not isinstance(dst, S3Store) or dst.endpoint_url != self.endpoint_url:
            return False
        with dst._errors("copy to", dst_name):
            dst._client.copy({"Bucket": self._bucket, "Key": name}, dst._bucket, dst_name)
        return True

    def _remove(self, name: str) -> None:
        with self._errors("delete", name):
            self._client.delete_object(Bucket=self._bucket, Key=name)

    def _names(self, prefix: str) -> list[str]:
        names: list[str] = []
        with self._errors("list", prefix + "/" if prefix else ""):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self._bucket, Prefix=prefix + "/" if prefix else ""
            )
            for page in pages:
                names.extend(str(obj["Key"]) for obj in page.get("Contents", []))
        return names

    def _child(self, prefix: str) -> S3Store:
        return S3Store(self._bucket, prefix, client=self._client, bounds=self._bounds)

    def _presign(self, name: str, method: Literal["get", "put"], expires_s: int) -> str:
        signer = self._client
        credentials = presigner_credentials()
        if credentials is not None:
            signer = make_client(self.endpoint_url, self._bounds, credentials)
        with self._errors("sign a URL for", name):
            url = signer.generate_presigned_url(
                "get_object" if method == "get" else "put_object",
                Params={"Bucket": self._bucket, "Key": name},
                ExpiresIn=expires_s,
            )
        return str(url)


class _Body:
    """An S3 object's body whose read errors (a server that stops answering) are StoreErrors."""

    def __init__(self, body: Any, errors: Any) -> None:
        self._body = body
        self._errors = errors

    def read(self, size: int = -1, /) -> bytes:
        with self._errors():
            return bytes(self._body.read(None if size < 0 else size))

    def close(self) -> None:
        self._body.close()
