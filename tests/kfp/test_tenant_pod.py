"""The launcher end to end, minus Kubernetes: a real S3 endpoint (moto), pre-signed URLs, and a
fake cluster that runs the created Job's container command in this process with the Job's
environment and without the provider's credentials.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from fedtune.config import JobConfig
from fedtune.config.tenant_view import tenant_view
from fedtune.core.errors import ConfigError, IntegrityError, StoreError
from fedtune.core.messages import Broadcast, Update
from fedtune.engines import layout, steps
from fedtune.engines.launcher import run_tenant_step
from fedtune.engines.tenant import pod_io
from fedtune.storage import open_store
from tests.helpers.moto import admin_client, create_bucket, start_moto_server, use_fake_aws_env
from tests.kfp.conftest import two_tenant_job
from tests.kfp.fake_k8s import FakeClock, FakeJobApi, State, job_status, pod

PROVIDER_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "FEDTUNE_S3_ENDPOINT_URL")


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    server = start_moto_server()
    try:
        yield server.endpoint_url
    finally:
        server.stop()


@pytest.fixture
def s3_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str) -> JobConfig:
    """The two-tenant job with its exchange store in a fresh bucket; round 1 configured."""
    use_fake_aws_env(monkeypatch, moto_endpoint)
    bucket = create_bucket(moto_endpoint)
    job = two_tenant_job(
        tmp_path / "provider",
        exchange_uri=f"s3://{bucket}/runs",
        provider_store_uri=f"s3://{bucket}/provider",
    )
    env = steps.ProviderEnv.create(job)
    steps.init_step(env)
    steps.configure_step(env, 1)
    return job


def tenants_file(tmp_path: Path) -> str:
    entries = [
        {"name": t, "namespace": t, "bucketSecretName": f"{t}-bucket"}
        for t in ("tenant-a", "tenant-b")
    ]
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": entries}))
    return str(path)


class PodRunner:
    """Runs a created Job's container like a kubelet would: its command, args and env only."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.exit_codes: list[int] = []
        self.saw_provider_env: list[str] = []
        self.presigned: list[str] = []  # the URLs each pod got, as its env shows them

    def __call__(self, body: dict[str, Any]) -> list[State]:
        (container,) = body["spec"]["template"]["spec"]["containers"]
        assert container["command"][:2] == ["python", "-m"]
        module = importlib.import_module(container["command"][2])
        with self.monkeypatch.context() as m:
            for name in PROVIDER_ENV:
                m.delenv(name, raising=False)
            for item in container["env"]:
                # The bucket Secret's keys (valueFrom) are left out: this tenant's data is a
                # local file; test_tenant_credentials.py runs the pod with them resolved.
                if "value" in item:
                    m.setenv(item["name"], item["value"])
            self.saw_provider_env = [n for n in PROVIDER_ENV if n in os.environ]
            self.presigned.append(os.environ.get(pod_io.PRESIGNED_ENV, ""))
            with pytest.raises(SystemExit) as done:
                module.main(container["args"])
            code = int(done.value.code or 0)
        self.exit_codes.append(code)
        if code == 0:
            return [State(job_status("Complete", succeeded=1))]
        failed = pod("pod-1", phase="Failed", exit_code=code)
        return [State(job_status("Failed", "BackoffLimitExceeded", failed=1), [failed])]


def launched(runner: PodRunner) -> FakeJobApi:
    return FakeJobApi([], on_create=runner)


def reference_update(tmp_path: Path) -> dict[str, torch.Tensor]:
    """The same step, in-process on a local exchange: what the tenant pod must deliver."""
    job = two_tenant_job(tmp_path / "reference")
    env = steps.ProviderEnv.create(job)
    steps.init_step(env)
    steps.configure_step(env, 1)
    steps.client_step(steps.TenantEnv.create(env.job, "tenant-a"), 1)
    return Update.load(env.stores.exchange("tenant-a"), layout.update_key(1)).tensors


def test_client_step_runs_in_the_tenant_pod_through_presigned_urls_only(
    s3_job: JobConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = PodRunner(monkeypatch)
    api = launched(runner)
    result = run_tenant_step(
        s3_job,
        "client",
        1,
        "tenant-a",
        run_key="run-1",
        api=api,
        tenants_file=tenants_file(tmp_path),
        force_cluster=True,
        clock=FakeClock(),
    )
    assert runner.exit_codes == [0] and runner.saw_provider_env == []
    assert result["meta"]["num_samples"] > 0 and result["k8s_job"].startswith("tenant-a/kfp-c1-")
    store = layout.JobStores(s3_job).exchange("tenant-a")
    delivered = Update.load(store, layout.update_key(1)).tensors
    expected = reference_update(tmp_path)
    assert delivered.keys() == expected.keys()
    for key in expected:
        assert torch.equal(delivered[key], expected[key]), key
    # A retried task finds the update stored and launches nothing.
    again = run_tenant_step(
        s3_job,
        "client",
        1,
        "tenant-a",
        api=launched(runner),
        tenants_file=tenants_file(tmp_path),
        force_cluster=True,
    )
    assert again["skipped"] and runner.exit_codes == [0]
    assert (again["bytes"], again["raw_bytes"]) == (result["bytes"], result["raw_bytes"])  # as reported


def test_no_presigned_url_is_in_the_job_or_its_pod_spec_only_in_the_jobs_secret(
    s3_job: JobConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Who may `get jobs` or `get pods` in the tenant's namespace reads their env: the URLs,
    bearer credentials for the step's objects, reach the pod only from a Secret of the Job."""
    runner = PodRunner(monkeypatch)
    api = launched(runner)
    run_tenant_step(
        s3_job, "client", 1, "tenant-a", run_key="run-1", api=api,
        tenants_file=tenants_file(tmp_path), force_cluster=True, clock=FakeClock(),
    )
    (got,) = runner.presigned
    urls = [u for group in json.loads(got).values() for u in group.values()]
    assert urls and all("X-Amz-Signature=" in u for u in urls)  # the pod did get them
    (job,) = api.created  # its template is every pod's spec
    text = json.dumps(job)
    assert "X-Amz-Signature" not in text and not any(u in text for u in urls)
    (secret,) = api.secrets.values()
    assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert json.loads(base64.b64decode(secret["data"]["presigned"])) == json.loads(got)


def test_evaluate_runs_in_the_tenant_pod_and_matches_in_process(
    s3_job: JobConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = steps.ProviderEnv.create(s3_job)
    for tenant in ("tenant-a", "tenant-b"):
        steps.client_step(steps.TenantEnv.create(env.job, tenant), 1)
    steps.aggregate_step(env, 1, ["tenant-a", "tenant-b"])
    steps.final_broadcast_step(env)  # the provider's own task, before the evaluate tasks
    runner = PodRunner(monkeypatch)
    result = run_tenant_step(
        s3_job,
        "evaluate",
        1,
        "tenant-b",
        api=launched(runner),
        tenants_file=tenants_file(tmp_path),
        force_cluster=True,
        clock=FakeClock(),
    )
    assert runner.exit_codes == [0]
    # The same evaluation in-process, from the very final broadcast the pod was given.
    tenant_exchange = layout.JobStores(s3_job).exchange("tenant-b")
    final_key = layout.final_tenant_broadcast_key(s3_job.rounds)
    final = Broadcast.load(tenant_exchange, final_key)
    with tempfile.TemporaryDirectory() as tmp:
        local = open_store(tmp)
        final.save(local, final_key)
        in_process = steps.TenantEnv.create(s3_job, "tenant-b", exchange=local)
        assert result["metrics"] == steps.evaluate_step(in_process)
    # A final broadcast, not a server state: FedAvg's tenants see the adapter and nothing else.
    state = steps.final_state(env)
    assert set(final.tensors) == {f"adapter/{k}" for k in state.group("adapter")}


def test_tampered_broadcast_is_refused_by_the_tenant(s3_job: JobConfig, moto_endpoint: str) -> None:
    store = layout.JobStores(s3_job).exchange("tenant-a")
    gets, puts = pod_io.step_objects("client", tenant_view(s3_job, "tenant-a"), 1)
    urls = pod_io.presign(store, gets, puts, 600)
    bucket, prefix = store.uri.removeprefix("s3://").split("/", 1)
    key = f"{prefix}/{layout.round_broadcast_key(1)}.safetensors"
    admin_client(moto_endpoint).put_object(Bucket=bucket, Key=key, Body=b"not the broadcast")
    with pytest.raises(IntegrityError, match="does not match its sha256"):
        pod_io.run_presigned(tenant_view(s3_job, "tenant-a"), "client", 1, urls)
    assert not Update.stored(store, layout.update_key(1))


def test_urls_for_other_objects_are_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    job = two_tenant_job(tmp_path)
    wrong = {"get": {"state/round-000001.json": "u"}, "put": {}}
    monkeypatch.setenv(pod_io.PRESIGNED_ENV, json.dumps(wrong))
    with pytest.raises(ConfigError, match="this step reads"):
        pod_io.read_urls(pod_io.step_objects("client", tenant_view(job, "tenant-a"), 1))
    monkeypatch.setenv(pod_io.PRESIGNED_ENV, "not json")
    with pytest.raises(ConfigError, match="not a JSON object"):
        pod_io.read_urls(pod_io.step_objects("client", tenant_view(job, "tenant-a"), 1))


def test_a_local_exchange_store_cannot_be_handed_to_a_tenant_pod(tmp_path: Path) -> None:
    job = two_tenant_job(tmp_path / "w")
    env = steps.ProviderEnv.create(job)
    steps.init_step(env)
    steps.configure_step(env, 1)
    with pytest.raises(StoreError, match="cannot issue pre-signed URLs"):
        run_tenant_step(
            job,
            "client",
            1,
            "tenant-a",
            api=FakeJobApi([]),
            tenants_file=tenants_file(tmp_path),
            force_cluster=True,
        )


def test_a_broadcast_the_provider_has_not_written_is_a_clear_store_error(
    s3_job: JobConfig,
) -> None:
    store = layout.JobStores(s3_job).exchange("tenant-a")
    urls = pod_io.presign(store, *pod_io.step_objects("client", tenant_view(s3_job, "tenant-a"), 2), 600)
    with pytest.raises(StoreError, match=r"GET of exchange object 'round-000002/broadcast") as info:
        pod_io.run_presigned(tenant_view(s3_job, "tenant-a"), "client", 2, urls)
    assert "HTTP 404" in str(info.value) and "has not written" in info.value.fix
    assert "X-Amz-Signature" not in str(info.value)  # the capability is never echoed


def test_a_secure_round_runs_every_tenant_step_in_tenant_pods_and_equals_the_local_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    """Advertise, share, masked client step and unmask each run as a launched pod that reaches
    the exchange only through pre-signed URLs for its own messages; the unmasked state is the
    local engine's, bit for bit."""
    from fedtune.core.messages import ServerState
    from fedtune.engines.local import RunOptions, run_job
    from fedtune.engines.provider import secagg as secagg_provider
    from fedtune.engines.workers import Outcome
    from fedtune.tracking.base import NullTracker

    secure = {"secure_aggregation": {"enabled": True, "threshold": 2}}
    reference = two_tenant_job(tmp_path / "reference", **secure)
    run_job(reference, NullTracker(), RunOptions(progress=False))

    use_fake_aws_env(monkeypatch, moto_endpoint)
    bucket = create_bucket(moto_endpoint)
    job = two_tenant_job(
        tmp_path / "provider", exchange_uri=f"s3://{bucket}/runs",
        provider_store_uri=f"s3://{bucket}/provider", **secure,
    )
    env = steps.ProviderEnv.create(job)
    steps.init_step(env)
    steps.configure_step(env, 1)
    pods = PodRunner(monkeypatch)
    kinds: list[str] = []

    class Launched:
        def run(self, tasks: list[Any], done: Any) -> dict[str, Outcome]:
            out = {}
            for task in tasks:
                kinds.append(task.kind)
                result = run_tenant_step(
                    job, task.kind, task.round_index, task.tenant, run_key="run-1",
                    api=launched(pods), tenants_file=tenants_file(tmp_path), force_cluster=True,
                    clock=FakeClock(),
                )
                out[task.tenant] = Outcome(task, result)
                done(out[task.tenant])
            return out

    clients, aggregate = secagg_provider.run_round(env, Launched(), 1, ["tenant-a", "tenant-b"], lambda _: None)
    assert pods.exit_codes == [0] * 8 and pods.saw_provider_env == []
    assert kinds == [k for k in ("secagg-advertise", "secagg-share", "client", "secagg-unmask") for _ in "ab"]
    assert aggregate["accepted"] == ["tenant-a", "tenant-b"] and aggregate["metrics"]["secagg/protocol_bytes"] > 0
    got = ServerState.load(env.store(), layout.state_key(1)).tensors
    expected = ServerState.load(layout.JobStores(reference).provider(), layout.state_key(1)).tensors
    assert got.keys() == expected.keys()
    for key in expected:
        assert torch.equal(got[key], expected[key]), key
    upload = Update.load(layout.JobStores(job).exchange("tenant-a"), layout.update_key(1))
    assert list(upload.tensors) == ["secagg/masked"]


def test_each_secure_or_private_step_is_given_exactly_its_messages(tmp_path: Path) -> None:
    dp = {"noise_multiplier": 1.0, "clipping": {"norm": 0.5}, "placement": "distributed"}
    job = two_tenant_job(
        tmp_path, algorithm={"name": "fedavg", "aggregation_weights": "uniform"},
        secure_aggregation={"enabled": True}, differential_privacy=dp,
    )
    objects = {k: pod_io.step_objects(k, tenant_view(job, "tenant-a"), 3) for k in
               ("secagg-advertise", "secagg-share", "client", "secagg-unmask")}
    r = "round-000003"
    assert objects["secagg-advertise"] == ([], [f"{r}/secagg/advert.json"])
    assert objects["secagg-share"] == ([f"{r}/secagg/roster.json"], [f"{r}/secagg/dealt.json"])
    assert objects["secagg-unmask"] == (
        [f"{r}/secagg/unmask-request.json", f"{r}/secagg/roster.json"], [f"{r}/secagg/unmask.json"]
    )
    gets, puts = objects["client"]
    assert set(gets) == {
        f"{r}/broadcast.safetensors", f"{r}/broadcast.json", f"{r}/secagg/roster.json",
        f"{r}/secagg/inbox.json", f"{r}/privacy.json",
    }
    assert puts == [f"{r}/update.safetensors", f"{r}/update.json"]
    plain = pod_io.step_objects("client", tenant_view(two_tenant_job(tmp_path / "p"), "tenant-a"), 3)
    assert plain == ([f"{r}/broadcast.safetensors", f"{r}/broadcast.json"], puts)
