"""Fixtures for the storage tests: one moto S3 server per session and a two-backend table."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fedtune.storage import Store
from tests.helpers.moto import create_bucket, start_moto_server, use_fake_aws_env
from tests.helpers.stores import Backend, local_backend, s3_backend


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """URL of a moto S3 server running in this process for the whole session."""
    server = start_moto_server()
    try:
        yield server.endpoint_url
    finally:
        server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, moto_endpoint: str) -> str:
    """Fake credentials and FEDTUNE_S3_ENDPOINT_URL pointing at the moto server."""
    use_fake_aws_env(monkeypatch, moto_endpoint)
    return moto_endpoint


@pytest.fixture
def bucket(aws_env: str) -> str:
    """A fresh, empty bucket on the moto server."""
    return create_bucket(aws_env)


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each test using this runs once per backend, against a fresh empty store."""
    if request.param == "local":
        return local_backend(tmp_path / "root")
    return s3_backend(request.getfixturevalue("aws_env"), request.getfixturevalue("bucket"))


@pytest.fixture
def store(backend: Backend) -> Store:
    """The store of :func:`backend`."""
    return backend.store
