"""The chart's MinIO and its bucket bootstrap, run against a real MinIO server.

MinIO is built from source (``scripts/servers/install_minio.sh``) and started exactly as the
chart's Deployment starts it (its args, its env from the Secret); the bootstrap Job's two
containers run as local processes with the env the pod would get. Only the endpoint differs:
the pod would reach MinIO by its Service name, a local process by 127.0.0.1.

Tenants hold no MinIO user in this chart: a tenant's only credentials are the pre-signed URLs
the launcher signs with the presigning user for that tenant's exchange prefix. So "tenant A
cannot read tenant B's objects" is: an A URL cannot be bent to a B key, and the presigning
user cannot sign anything the chart does not allow (no listing, no other bucket, no delete).
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from botocore.exceptions import ClientError
from chart_servers import (
    ARTIFACTS,
    EXCHANGE,
    PRESIGNER,
    PROVIDER,
    ROOT,
    SECRETS,
    ChartMinio,
    finish,
)

pytestmark = pytest.mark.cluster


def s3_error(call: Any, **kwargs: Any) -> str:
    """The S3 error code ``call`` fails with ("" if it succeeds)."""
    try:
        call(**kwargs)
    except ClientError as exc:
        return str(exc.response["Error"]["Code"])
    return ""


def http(url: str, method: str = "GET", data: bytes | None = None) -> tuple[int, bytes]:
    """Status and body of one plain HTTP request, as a tenant pod without fedtune sends it."""
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


def test_bootstrap_creates_the_buckets_and_the_presigning_user(chart_minio: ChartMinio) -> None:
    from minio import MinioAdmin
    from minio.credentials import StaticProvider

    runs = chart_minio.bootstrap()
    root = chart_minio.client(ROOT)
    assert {b["Name"] for b in root.list_buckets()["Buckets"]} == {EXCHANGE, PROVIDER, ARTIFACTS}
    admin = MinioAdmin(
        endpoint=chart_minio.endpoint.removeprefix("http://"),
        credentials=StaticProvider(*ROOT), secure=False,
    )
    info = json.loads(admin.user_info(PRESIGNER[0]))
    assert info["status"] == "enabled"
    assert info["policyName"] == "fedtune-presigner"
    policy = json.loads(admin.policy_info("fedtune-presigner"))
    statements = policy.get("Policy", policy)["Statement"]
    assert [(sorted(s["Action"]), s["Resource"]) for s in statements] == [
        (["s3:GetObject", "s3:PutObject"], [f"arn:aws:s3:::{EXCHANGE}/*"])
    ]
    logs = "".join(p.stdout + p.stderr for p in runs.values()) + chart_minio.log()
    assert ROOT[1] not in logs and PRESIGNER[1] not in logs


def test_the_presigning_user_can_get_and_put_exchange_objects_and_nothing_else(
    chart_minio: ChartMinio,
) -> None:
    chart_minio.bootstrap()
    root, signer = chart_minio.client(ROOT), chart_minio.client(PRESIGNER)
    for bucket in (PROVIDER, ARTIFACTS):
        root.put_object(Bucket=bucket, Key="secret.bin", Body=b"provider only")
    # What the chart allows: single objects of the exchange bucket, read and write.
    signer.put_object(Bucket=EXCHANGE, Key="tenants/a/x.bin", Body=b"a")
    assert signer.get_object(Bucket=EXCHANGE, Key="tenants/a/x.bin")["Body"].read() == b"a"
    # Everything else is refused by MinIO's policy engine.
    denied = {
        "list exchange": s3_error(signer.list_objects_v2, Bucket=EXCHANGE),
        "delete exchange object": s3_error(
            signer.delete_object, Bucket=EXCHANGE, Key="tenants/a/x.bin"
        ),
        "list buckets": s3_error(signer.list_buckets),
        "create bucket": s3_error(signer.create_bucket, Bucket="fedtune-stolen"),
    }
    for bucket in (PROVIDER, ARTIFACTS):
        denied[f"get {bucket}"] = s3_error(signer.get_object, Bucket=bucket, Key="secret.bin")
        denied[f"put {bucket}"] = s3_error(signer.put_object, Bucket=bucket, Key="x", Body=b"x")
    assert denied == dict.fromkeys(denied, "AccessDenied")
    assert root.get_object(Bucket=EXCHANGE, Key="tenants/a/x.bin")["Body"].read() == b"a"


def test_the_presigning_user_has_no_admin_rights(chart_minio: ChartMinio) -> None:
    from minio import MinioAdmin
    from minio.credentials import StaticProvider

    chart_minio.bootstrap()
    admin = MinioAdmin(
        endpoint=chart_minio.endpoint.removeprefix("http://"),
        credentials=StaticProvider(*PRESIGNER), secure=False,
    )
    with pytest.raises(Exception, match="(?i)access ?denied|403"):
        admin.user_add("escalated", "escalated-secret-1")
    with pytest.raises(Exception, match="(?i)access ?denied|403"):
        admin.policy_set("consoleAdmin", user=PRESIGNER[0])


@pytest.fixture()
def fedtune_env(chart_minio: ChartMinio, monkeypatch: pytest.MonkeyPatch) -> ChartMinio:
    """The launcher's environment: the provider's keys for its own calls, the presigner's for
    URLs (as the compiled pipeline maps them from the two Secrets)."""
    from fedtune.config.secrets import PRESIGNER_ENV

    chart_minio.bootstrap()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ROOT[0])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ROOT[1])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("FEDTUNE_S3_ENDPOINT_URL", chart_minio.endpoint)
    monkeypatch.setenv(PRESIGNER_ENV["access-key-id"], PRESIGNER[0])
    monkeypatch.setenv(PRESIGNER_ENV["secret-access-key"], PRESIGNER[1])
    return chart_minio


def test_fedtune_presigned_urls_get_and_put_on_real_minio(fedtune_env: ChartMinio) -> None:
    """A tenant pod's whole exchange, by the URLs the launcher signs: it reads the broadcast,
    writes its update (sidecar included), and the provider reads the update back verified."""
    from fedtune.config.job import LimitsConfig
    from fedtune.engines.tenant.pod_io import _request, presign
    from fedtune.storage import open_store

    tenant = open_store(f"s3://{EXCHANGE}/jobs/j1/tenants/a")
    tenant.put_bytes("rounds/0/broadcast.bin", b"weights of round 0")
    urls = presign(tenant, ["rounds/0/broadcast.bin"], ["rounds/0/update.bin"], expires_s=600)
    assert all(f"X-Amz-Credential={PRESIGNER[0]}" in u for m in urls.values() for u in m.values())
    limits = LimitsConfig()
    got = _request(urls["get"]["rounds/0/broadcast.bin"], "broadcast", "GET", limits)
    assert got == b"weights of round 0"
    update = b"tenant a's update"
    _request(urls["put"]["rounds/0/update.bin"], "update", "PUT", limits, update)
    _request(urls["put"]["rounds/0/update.bin.sha256"], "sidecar", "PUT", limits,
             hashlib.sha256(update).hexdigest().encode())
    assert tenant.get_bytes("rounds/0/update.bin") == update


def test_a_tenants_urls_reach_only_its_own_objects(fedtune_env: ChartMinio) -> None:
    from fedtune.storage import open_store

    exchange = open_store(f"s3://{EXCHANGE}/jobs/j1/tenants")
    tenant_a, tenant_b = exchange.child("a"), exchange.child("b")
    tenant_b.put_bytes("rounds/0/update.bin", b"tenant b's private update")
    get_a = tenant_a.presigned_url("rounds/0/update.bin", method="get", expires_s=600)
    put_a = tenant_a.presigned_url("rounds/0/update.bin", method="put", expires_s=600)
    # Bending A's URL to B's key breaks the signature.
    assert "/tenants/a/" in get_a
    assert http(get_a.replace("/tenants/a/", "/tenants/b/"))[0] == 403
    assert http(put_a.replace("/tenants/a/", "/tenants/b/"), "PUT", b"overwrite")[0] == 403
    # A GET URL does not write, a PUT URL does not read.
    assert http(get_a, "PUT", b"x")[0] == 403
    assert http(put_a, "GET")[0] == 403
    assert tenant_b.get_bytes("rounds/0/update.bin") == b"tenant b's private update"
    # Even a URL fedtune signed by mistake for the provider's bucket is refused: the presigning
    # user's policy, not fedtune's code, is what stops it.
    provider = open_store(f"s3://{PROVIDER}/jobs/j1")
    provider.put_bytes("state.bin", b"server state")
    status, body = http(provider.presigned_url("state.bin", method="get", expires_s=600))
    assert (status, b"AccessDenied" in body) == (403, True)


def test_a_presigned_url_stops_working_when_it_expires(fedtune_env: ChartMinio) -> None:
    from fedtune.storage import open_store

    store = open_store(f"s3://{EXCHANGE}/jobs/j1/tenants/a")
    store.put_bytes("b.bin", b"x")
    url = store.presigned_url("b.bin", method="get", expires_s=1)
    time.sleep(2.5)  # the only way to let a real signature expire is to wait it out
    status, body = http(url)
    assert status == 403 and b"expired" in body.lower()


def test_the_bootstrap_is_idempotent_and_an_upgrade_rotates_the_presigner_key(
    chart_minio: ChartMinio,
) -> None:
    """`helm upgrade` reruns the hook: nothing is lost, and a changed presigner Secret takes
    effect (the old key stops working)."""
    chart_minio.bootstrap()
    root = chart_minio.client(ROOT)
    root.put_object(Bucket=EXCHANGE, Key="kept.bin", Body=b"kept")
    rotated = (PRESIGNER[0], "presigner-rotated-secret-55e1")
    upgraded = {**SECRETS, ("fedtune-presigner", "secret-access-key"): rotated[1]}

    def read_kept(keys: tuple[str, str]) -> bytes:
        got = chart_minio.client(keys).get_object(Bucket=EXCHANGE, Key="kept.bin")
        return bytes(got["Body"].read())

    runs = chart_minio.bootstrap(upgraded)
    for bucket in (EXCHANGE, PROVIDER, ARTIFACTS):
        assert f"bucket {bucket} already exists" in runs["bootstrap"].stderr
    assert read_kept(ROOT) == b"kept"
    assert read_kept(rotated) == b"kept"
    assert s3_error(chart_minio.client(PRESIGNER).get_object, Bucket=EXCHANGE, Key="kept.bin") in {
        "SignatureDoesNotMatch", "InvalidAccessKeyId"
    }
    # And a third run with nothing changed is a no-op that still succeeds.
    chart_minio.bootstrap(upgraded)
    assert read_kept(rotated) == b"kept"


def test_the_hook_started_before_minio_is_up_waits_for_it(chart_minio: ChartMinio) -> None:
    """A post-install hook runs as soon as the Deployment exists, usually before MinIO's pod
    is ready: both containers must wait (within --wait-seconds) rather than fail the install."""
    chart_minio.stop()
    started = chart_minio.start_bootstrap()
    time.sleep(3)  # the pod runs while the server is still down, as on a fresh install
    exited = {name: proc.returncode for name, proc in started if proc.poll() is not None}
    assert not exited, f"gave up while MinIO was starting: {exited}"
    chart_minio.start()
    runs = finish(started)
    assert "not reachable yet; retrying" in runs["bootstrap"].stderr
    signer = chart_minio.client(PRESIGNER)
    signer.put_object(Bucket=EXCHANGE, Key="tenants/a/x.bin", Body=b"a")


def test_users_and_policies_survive_a_minio_restart(chart_minio: ChartMinio) -> None:
    """MinIO keeps its IAM state on /data: the Deployment's Recreate restarts lose nothing."""
    chart_minio.bootstrap()
    chart_minio.stop()
    chart_minio.start()
    signer = chart_minio.client(PRESIGNER)
    signer.put_object(Bucket=EXCHANGE, Key="tenants/a/x.bin", Body=b"a")
    assert s3_error(signer.get_object, Bucket=PROVIDER, Key="x") == "AccessDenied"
