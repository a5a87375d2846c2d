"""Pre-signed URLs expire with the step, and what the provider accepted cannot be replaced.

A tenant pod's PUT URLs stay valid until they expire, so a tenant keeping them could upload
again after its step ended. The launcher records every output it accepts (sha256, length) in
the provider's private store; aggregation, its re-run on resume and a retried launcher
check the exchange objects against that record. Run against moto's S3 server, the tenant
pods through the launcher as in ``test_tenant_pod.py``.
"""

from __future__ import annotations

import hashlib
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from fedtune.config import JobConfig
from fedtune.core.errors import IntegrityError
from fedtune.engines import acceptance, layout, steps
from fedtune.engines.launcher import run_tenant_step
from fedtune.engines.launcher_manifest import LauncherSettings
from fedtune.engines.tenant.pod_io import PRESIGNED_ENV
from fedtune.storage import open_store
from tests.kfp.fake_k8s import FakeClock, FakeJobApi
from tests.kfp.test_tenant_pod import PodRunner, moto_endpoint, s3_job, tenants_file  # noqa: F401

SETTINGS = LauncherSettings(active_deadline_s=900, grace_s=120)


def launch_client_steps(
    job: JobConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, FakeJobApi]:
    """Run round 1's client step of both tenants in pods; return each one's (fake) API."""
    manifests = {}
    for tenant in ("tenant-a", "tenant-b"):
        api = FakeJobApi([], on_create=PodRunner(monkeypatch))
        run_tenant_step(
            job, "client", 1, tenant, run_key="run-1", api=api, settings=SETTINGS,
            tenants_file=tenants_file(tmp_path), force_cluster=True, clock=FakeClock(),
        )
        manifests[tenant] = api
    return manifests


def urls_of(api: FakeJobApi) -> dict[str, dict[str, str]]:
    """The URLs the launcher handed its one Job, from the Secret the pod reads them from."""
    import base64
    import json

    (job,) = api.created
    (container,) = job["spec"]["template"]["spec"]["containers"]
    ref = next(e for e in container["env"] if e["name"] == PRESIGNED_ENV)
    ref = ref["valueFrom"]["secretKeyRef"]
    return json.loads(base64.b64decode(api.secrets[ref["name"]]["data"][ref["key"]]))


def put(url: str, data: bytes) -> None:
    request = urllib.request.Request(url, data=data, method="PUT",
                                     headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def test_every_url_expires_with_the_step(
    s3_job: JobConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    manifests = launch_client_steps(s3_job, tmp_path, monkeypatch)
    for api in manifests.values():
        assert api.created[0]["spec"]["activeDeadlineSeconds"] == 900
        urls = urls_of(api)
        lifetimes = {
            int(parse_qs(urlsplit(u).query)["X-Amz-Expires"][0])
            for group in urls.values() for u in group.values()
        }
        # The Job's deadline plus the launcher's grace, nothing more.
        assert lifetimes == {900 + 120}, lifetimes
    assert LauncherSettings().url_expiry_s == 6 * 3600 + 600


def test_an_update_overwritten_after_acceptance_is_refused_by_aggregation_and_its_rerun(
    s3_job: JobConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    manifests = launch_client_steps(s3_job, tmp_path, monkeypatch)
    stores = layout.JobStores(s3_job)
    key = layout.update_key(1)
    # Recorded at acceptance, in the provider's private store.
    for tenant in ("tenant-a", "tenant-b"):
        for blob in (f"{key}.safetensors", f"{key}.json"):
            record = stores.provider().get_json(acceptance.record_key(tenant, blob))
            data = stores.exchange(tenant).get_bytes(blob)
            assert record == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    # Tenant a replays tenant b's update through its own, still valid, PUT URLs: blob and
    # sidecar, so the store's own checksum agrees with the new bytes.
    urls = urls_of(manifests["tenant-a"])["put"]
    for blob in (f"{key}.safetensors", f"{key}.json"):
        forged = stores.exchange("tenant-b").get_bytes(blob)
        put(urls[blob], forged)
        put(urls[blob + ".sha256"], hashlib.sha256(forged).hexdigest().encode())
    assert stores.exchange("tenant-a").get_bytes(f"{key}.safetensors") == stores.exchange(
        "tenant-b"
    ).get_bytes(f"{key}.safetensors")
    env = steps.ProviderEnv.create(s3_job)
    outcome = steps.aggregate_step(env, 1, ["tenant-a", "tenant-b"])
    assert outcome["accepted"] == ["tenant-b"]
    reason = outcome["rejected"]["tenant-a"]
    assert "was changed after the provider accepted it" in reason and f"{key}.safetensors" in reason
    # A resumed run that finds the state re-reads the updates: still refused.
    again = steps.aggregate_step(env, 1, ["tenant-a", "tenant-b"])
    assert again["skipped"] and again["accepted"] == ["tenant-b"] and "tenant-a" in again["rejected"]
    # A retried launcher task finds the update stored and checks it against the record.
    with pytest.raises(IntegrityError, match="changed after the provider accepted it"):
        run_tenant_step(
            s3_job, "client", 1, "tenant-a", run_key="run-1",
            api=FakeJobApi([], on_create=PodRunner(monkeypatch)), settings=SETTINGS,
            tenants_file=tenants_file(tmp_path), force_cluster=True, clock=FakeClock(),
        )


def test_acceptance_records_verify_and_name_both_digests(tmp_path: Path) -> None:
    provider, exchange = open_store(str(tmp_path / "p")), open_store(str(tmp_path / "x"))
    exchange.put_bytes("round-000001/update.json", b'{"n": 1}')
    assert acceptance.verify(provider, exchange, "t", "round-000001/update.json") is None  # no record
    acceptance.accept(provider, exchange, "t", ["round-000001/update.json"])
    acceptance.accept(provider, exchange, "t", ["round-000001/update.json"])  # same bytes: fine
    assert acceptance.verify(provider, exchange, "t", "round-000001/update.json") == b'{"n": 1}'
    exchange.put_bytes("round-000001/update.json", b'{"n": 99}')
    with pytest.raises(IntegrityError) as info:
        acceptance.verify(provider, exchange, "t", "round-000001/update.json")
    message = str(info.value)
    assert hashlib.sha256(b'{"n": 1}').hexdigest() in message
    assert hashlib.sha256(b'{"n": 99}').hexdigest() in message and "9 bytes" in message
    assert "accepted/t/round-000001/update.json.json" in info.value.fix
    # The first acceptance wins: accepting again does not overwrite the record.
    with pytest.raises(IntegrityError):
        acceptance.accept(provider, exchange, "t", ["round-000001/update.json"])


def test_a_masked_upload_replaced_after_acceptance_stops_the_secure_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str  # noqa: F811
) -> None:
    """Under secure aggregation a replaced masked upload would spoil the unmasked sum without
    any check seeing it; the secure aggregate refuses it, naming the tenant and the object."""
    from fedtune.engines.provider import secagg as secagg_provider
    from fedtune.engines.workers import Outcome
    from tests.helpers.moto import create_bucket, use_fake_aws_env
    from tests.kfp.conftest import two_tenant_job

    use_fake_aws_env(monkeypatch, moto_endpoint)
    bucket = create_bucket(moto_endpoint)
    job = two_tenant_job(
        tmp_path / "provider", exchange_uri=f"s3://{bucket}/runs",
        provider_store_uri=f"s3://{bucket}/provider",
        secure_aggregation={"enabled": True, "threshold": 2},
    )
    env = steps.ProviderEnv.create(job)
    steps.init_step(env)
    steps.configure_step(env, 1)
    stores, key = layout.JobStores(job), layout.update_key(1)
    client_urls: dict[str, dict[str, str]] = {}

    class Launched:
        def run(self, tasks: list[Any], done: Any) -> dict[str, Outcome]:
            out = {}
            for task in tasks:
                if task.kind == "secagg-unmask" and task.tenant == "tenant-a":
                    # Both masked uploads were accepted; tenant a now replays tenant b's.
                    for blob in (f"{key}.safetensors", f"{key}.json"):
                        forged = stores.exchange("tenant-b").get_bytes(blob)
                        put(client_urls["tenant-a"][blob], forged)
                        put(client_urls["tenant-a"][blob + ".sha256"],
                            hashlib.sha256(forged).hexdigest().encode())
                api = FakeJobApi([], on_create=PodRunner(monkeypatch))
                result = run_tenant_step(
                    job, task.kind, task.round_index, task.tenant, run_key="run-1", api=api,
                    tenants_file=tenants_file(tmp_path), force_cluster=True, clock=FakeClock(),
                )
                if task.kind == "client":
                    client_urls[task.tenant] = urls_of(api)["put"]
                out[task.tenant] = Outcome(task, result)
                done(out[task.tenant])
            return out

    with pytest.raises(IntegrityError, match="tenant 'tenant-a'.*changed after the provider accepted it"):
        secagg_provider.run_round(env, Launched(), 1, ["tenant-a", "tenant-b"], lambda _: None)
    from fedtune.core.messages import ServerState

    assert not ServerState.stored(stores.provider(), layout.state_key(1))  # nothing aggregated
