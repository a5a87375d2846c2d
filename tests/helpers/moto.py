"""A real S3 HTTP endpoint inside the test process (moto's threaded server).

Usage from any test folder::

    server = start_moto_server()
    try:
        use_fake_aws_env(monkeypatch, server.endpoint_url)
        ...
    finally:
        server.stop()
"""

from __future__ import annotations

import functools
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

FAKE_ACCESS_KEY = "fedtune-test-access-key"
FAKE_SECRET_KEY = "fedtune-test-secret-key-do-not-log"
REGION = "us-east-1"


@dataclass
class MotoServer:
    """A running moto server; ``stop()`` shuts it down."""

    endpoint_url: str
    _server: Any

    def stop(self) -> None:
        """Shut the server down and join its thread."""
        self._server.stop()


def start_moto_server() -> MotoServer:
    """Start moto's S3-compatible server on a free port of 127.0.0.1 and return it."""
    from moto.server import ThreadedMotoServer

    # werkzeug logs every request at INFO; tests only want their own output.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return MotoServer(endpoint_url=f"http://{host}:{port}", _server=server)


def use_fake_aws_env(monkeypatch: pytest.MonkeyPatch, endpoint_url: str | None) -> None:
    """Point boto3 at fake credentials (and ``endpoint_url`` via FEDTUNE_S3_ENDPOINT_URL).

    Also hides the developer's own AWS settings, so no test can touch a real account.
    """
    for var in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/fedtune-test-aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/fedtune-test-aws-credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    if endpoint_url is None:
        monkeypatch.delenv("FEDTUNE_S3_ENDPOINT_URL", raising=False)
    else:
        monkeypatch.setenv("FEDTUNE_S3_ENDPOINT_URL", endpoint_url)


@functools.cache
def admin_client(endpoint_url: str) -> Any:
    """A boto3 S3 client for ``endpoint_url`` with the fake credentials, made once per URL.

    For setting up and tampering with buckets behind a store's back; independent of the
    environment, so it works whatever a test has done to it.
    """
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id=FAKE_ACCESS_KEY,
        aws_secret_access_key=FAKE_SECRET_KEY,
    )


def create_bucket(endpoint_url: str, name: str | None = None) -> str:
    """Create a bucket (a fresh unique one by default) on the server; return its name."""
    bucket = name or f"test-{uuid.uuid4().hex[:16]}"
    admin_client(endpoint_url).create_bucket(Bucket=bucket)
    return bucket
