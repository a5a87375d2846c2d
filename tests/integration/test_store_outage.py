"""A store whose server is down or hung is reported as a store outage, within the job's bounds.

Before, a hung S3 endpoint stalled each call for 60 s x 3 and a run ended in a quorum error
that blamed the tenants.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fedtune.cli.main import main
from tests.helpers.hung_server import hanging_proxy, hung_server
from tests.helpers.moto import create_bucket, start_moto_server, use_fake_aws_env
from tests.integration.conftest import tiny_job_dict

FAST = {"store_read_timeout_s": 1, "store_connect_timeout_s": 1, "store_max_attempts": 2}


def write(tmp_path: Path, job: dict) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    return str(path)


@pytest.fixture
def moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    server = start_moto_server()
    try:
        use_fake_aws_env(monkeypatch, server.endpoint_url)
        yield server.endpoint_url
    finally:
        server.stop()


def test_a_hung_tenant_store_fails_the_preflight_as_an_outage_naming_the_endpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with hung_server() as endpoint:
        use_fake_aws_env(monkeypatch, endpoint)
        job = tiny_job_dict(tmp_path / "w", rounds=1, limits=FAST)
        job["tenants"][1]["store_uri"] = "s3://tenant-b-bucket/state"
        started = time.monotonic()
        code = main(["run", write(tmp_path, job), "--no-progress"])
        took = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 12, err
    assert "store outage" in err and endpoint in err and "tenant tenant-b" in err
    assert "2 attempt(s), each 1 s to connect and 1 s per answer" in err
    assert "quorum" not in err.lower()
    assert took < 60  # one lookup: 2 attempts of 1 s (botocore's default was 60 s x 3)


def test_hung_tenant_data_fails_fast_with_the_outage_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with hung_server() as endpoint:
        use_fake_aws_env(monkeypatch, endpoint)
        job = tiny_job_dict(tmp_path / "w", rounds=1, limits=FAST)
        job["tenants"][0]["data_uri"] = "s3://tenant-a-bucket/train.jsonl"
        code = main(["run", write(tmp_path, job), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 12, err
    assert "tenant tenant-a: StoreUnavailable" in err and "store outage" in err
    details = tmp_path / "w" / "tenants" / "tenant-a" / "jobs" / "itest" / "errors" / "preflight.txt"
    assert endpoint in details.read_text()  # the tenant's own copy names its endpoint


def test_a_store_that_hangs_mid_run_is_an_outage_not_a_quorum_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], moto: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_bucket(moto, "tenant-b-bucket")
    with hanging_proxy(moto) as (endpoint, hang):
        monkeypatch.setenv("FEDTUNE_S3_ENDPOINT_URL", endpoint)
        job = tiny_job_dict(tmp_path / "w", rounds=2, min_clients=3, limits=FAST)
        job["tenants"][1]["store_uri"] = "s3://tenant-b-bucket/state"
        first_round = tmp_path / "w" / "provider" / "jobs" / "itest" / "summary" / "round-000001.json"
        done = threading.Event()

        def watch() -> None:  # the endpoint hangs once round 1 is stored, as an outage would
            while not done.is_set() and not first_round.exists():
                time.sleep(0.005)
            hang.set()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            code = main(["run", write(tmp_path, job), "--no-progress"])
        finally:
            done.set()
            watcher.join()
    err = capsys.readouterr().err
    assert code == 12, err
    assert "round 2: store outage" in err and "['tenant-b']" in err
    assert "QuorumError" not in err
