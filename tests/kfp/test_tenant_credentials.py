"""The tenant pod's bucket credentials end to end: from its Secret, through the Job manifest,
to boto3 in the pod's process.

No kubelet runs here, so this test is the kubelet: it takes the Job the launcher creates,
resolves every ``env`` entry exactly as Kubernetes would (plain values as given,
``secretKeyRef`` from the tenant's Secret, a missing required key refusing the pod), and runs
the container's command in a fresh interpreter with that environment and nothing else of this
process's. Two S3 endpoints, as on a cluster: the provider's (exchange and provider store; the
pod reaches it only by pre-signed URL) and the tenant's own, a moto server in its own process
with IAM enforced, where only the tenant's keys open the tenant's bucket. (moto answers
pre-signed URLs with HTTP 500 while IAM is enforced, hence the provider's endpoint runs
without it.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch

from fedtune.config import JobConfig, parse_job
from fedtune.core.errors import TenantStepFailed
from fedtune.core.messages import Update
from fedtune.engines import layout, steps
from fedtune.engines.launcher import run_tenant_step
from tests.helpers.moto import REGION, create_bucket, start_moto_server, use_fake_aws_env
from tests.integration.conftest import DATA
from tests.kfp.conftest import two_tenant_dict
from tests.kfp.fake_k8s import FakeClock, FakeJobApi, State, job_status, pod
from tests.kfp.test_tenant_pod import reference_update

SRC = Path(__file__).resolve().parents[2] / "src"
SCRIPTS = Path(__file__).resolve().parents[2] / "charts" / "fedtune" / "files" / "scripts"
EXCHANGE = "fedtune-exchange"
TENANT_BUCKET = "tenant-a-data"
SECRET_NAME = "tenant-a-bucket"


def _chart_script(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _policy(*resources: str, actions: tuple[str, ...] = ("s3:*",)) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": list(actions), "Resource": list(resources)}],
        }
    )


class IamS3:
    """moto's server in a subprocess with IAM enforced, and the users the test needs."""

    def __init__(self) -> None:
        port = _free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.2)
        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        self.keys: dict[str, tuple[str, str]] = {}
        for user, policy in {
            "admin": _policy("*"),
            "tenant-a": _policy(f"arn:aws:s3:::{TENANT_BUCKET}", f"arn:aws:s3:::{TENANT_BUCKET}/*"),
            "tenant-b": _policy("arn:aws:s3:::tenant-b-data", "arn:aws:s3:::tenant-b-data/*"),
            # The policy the chart's bootstrap gives MinIO's presigning user.
            "presigner": json.dumps(_chart_script("bootstrap_users").presigner_policy(EXCHANGE)),
        }.items():
            iam.create_user(UserName=user)
            iam.put_user_policy(UserName=user, PolicyName="access", PolicyDocument=policy)
            key = iam.create_access_key(UserName=user)["AccessKey"]
            self.keys[user] = (key["AccessKeyId"], key["SecretAccessKey"])
        # From now on every request must be signed by a known key and allowed by its policy.
        urllib.request.urlopen(
            urllib.request.Request(
                f"{self.endpoint}/moto-api/reset-auth",
                data=b"0",
                headers={"Content-Type": "text/plain"},  # not a form: moto reads the raw body
            )
        ).close()

    def client(self, user: str) -> Any:
        key_id, secret = self.keys[user]
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
        )

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def iam_s3() -> Iterator[IamS3]:
    server = IamS3()
    try:
        yield server
    finally:
        server.stop()


def kubelet_env(container: dict[str, Any], secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The container's environment as Kubernetes builds it from ``env`` and ``envFrom``."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        env.update(secrets[source["secretRef"]["name"]])
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        ref = item["valueFrom"]["secretKeyRef"]
        data = secrets.get(ref["name"], {})
        if ref["key"] in data:
            env[item["name"]] = data[ref["key"]]
        elif not ref.get("optional"):
            raise AssertionError(f"CreateContainerConfigError: key {ref['key']} not in {ref['name']}")
    return env


class SubprocessPod:
    """Runs a created Job's container in a fresh interpreter with exactly its environment."""

    def __init__(self, secrets: dict[str, dict[str, str]]) -> None:
        self.secrets = secrets
        self.results: list[subprocess.CompletedProcess[str]] = []

    def __call__(self, body: dict[str, Any]) -> list[State]:
        (container,) = body["spec"]["template"]["spec"]["containers"]
        env = kubelet_env(container, self.secrets)
        # What the image provides besides the manifest: an interpreter with fedtune on it.
        env["PATH"] = os.environ["PATH"]
        env["PYTHONPATH"] = str(SRC)
        command = [sys.executable if container["command"][0] == "python" else container["command"][0]]
        proc = subprocess.run(
            [*command, *container["command"][1:], *container["args"]],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        self.results.append(proc)
        if proc.returncode == 0:
            return [State(job_status("Complete", succeeded=1))]
        failed = pod("pod-1", phase="Failed", exit_code=proc.returncode)
        return [State(job_status("Failed", "BackoffLimitExceeded", failed=1), [failed])]


@pytest.fixture(scope="module")
def provider_s3() -> Iterator[str]:
    server = start_moto_server()
    try:
        yield server.endpoint_url
    finally:
        server.stop()


@pytest.fixture
def s3_job(
    iam_s3: IamS3, provider_s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[JobConfig, str]:
    """Tenant-a's data and state in its own bucket on its own endpoint; exchange and provider
    store on the provider's. Round 1 is configured by the provider (in this process)."""
    use_fake_aws_env(monkeypatch, provider_s3)
    exchange, provider_bucket = create_bucket(provider_s3), create_bucket(provider_s3)
    tenant = iam_s3.client("tenant-a")
    try:
        tenant.create_bucket(Bucket=TENANT_BUCKET)
    except tenant.exceptions.BucketAlreadyOwnedByYou:
        pass
    tenant.put_object(
        Bucket=TENANT_BUCKET, Key="train.jsonl", Body=(DATA / "tenant-a.jsonl").read_bytes()
    )
    raw = two_tenant_dict(
        tmp_path / "provider",
        exchange_uri=f"s3://{exchange}/runs",
        provider_store_uri=f"s3://{provider_bucket}/runs",
    )
    raw["tenants"][0].update(
        data_uri=f"s3://{TENANT_BUCKET}/train.jsonl", store_uri=f"s3://{TENANT_BUCKET}/state"
    )
    job = parse_job(raw)
    env = steps.ProviderEnv.create(job)
    steps.init_step(env)
    steps.configure_step(env, 1)
    tenants = tmp_path / "tenants.json"
    tenants.write_text(
        json.dumps(
            {
                "tenants": [
                    {
                        "name": t,
                        "namespace": t,
                        "bucketSecretName": f"{t}-bucket",
                        "bucketEndpoint": iam_s3.endpoint,
                    }
                    for t in ("tenant-a", "tenant-b")
                ]
            }
        )
    )
    return job, str(tenants)


def launch_client_step(
    job: JobConfig, tenants: str, pod_runner: SubprocessPod, run_key: str
) -> dict[str, Any]:
    """Tenant-a's round-1 client step through the launcher, its Job run by ``pod_runner``."""
    return run_tenant_step(
        job,
        "client",
        1,
        "tenant-a",
        run_key=run_key,
        api=FakeJobApi([], on_create=pod_runner),
        tenants_file=tenants,
        force_cluster=True,
        clock=FakeClock(),
    )


def test_the_tenant_pod_reads_its_data_and_writes_its_update_with_its_secrets_keys(
    iam_s3: IamS3, s3_job: tuple[JobConfig, str], tmp_path: Path
) -> None:
    job, tenants = s3_job
    key_id, secret = iam_s3.keys["tenant-a"]
    # The Secret as the NOTES tell the tenant to create it (keys of the tenant's own naming
    # convention, not boto3's), plus the optional region.
    pod_runner = SubprocessPod(
        {SECRET_NAME: {"access-key-id": key_id, "secret-access-key": secret, "region": REGION}}
    )
    result = launch_client_step(job, tenants, pod_runner, "run-1")
    (proc,) = pod_runner.results
    assert proc.returncode == 0, proc.stderr[-3000:]
    # It read its data from its bucket with its keys and wrote its update through the
    # pre-signed URLs: the very update the same step computes in-process from the local file.
    update = Update.load(layout.JobStores(job).exchange("tenant-a"), layout.update_key(1))
    expected = reference_update(tmp_path)
    assert update.tensors.keys() == expected.keys() and result["meta"]["num_samples"] > 0
    for key in expected:
        assert torch.equal(update.tensors[key], expected[key]), key
    assert secret not in proc.stdout + proc.stderr  # never logged


def test_without_the_secrets_keys_the_pod_fails_on_credentials_not_later(
    iam_s3: IamS3, s3_job: tuple[JobConfig, str]
) -> None:
    job, tenants = s3_job
    key_id, secret = iam_s3.keys["tenant-a"]
    # A Secret with boto3's names instead of the documented keys: the pod is never created.
    wrong = SubprocessPod({SECRET_NAME: {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret}})
    with pytest.raises(AssertionError, match="CreateContainerConfigError: key access-key-id"):
        launch_client_step(job, tenants, wrong, "run-2")
    # Another tenant's keys are refused by this tenant's bucket: the step fails on them.
    other_id, other_secret = iam_s3.keys["tenant-b"]
    other = SubprocessPod(
        {SECRET_NAME: {"access-key-id": other_id, "secret-access-key": other_secret}}
    )
    with pytest.raises(TenantStepFailed, match=r"exited with code 4 \(StoreError\)"):
        launch_client_step(job, tenants, other, "run-3")
    (proc,) = other.results
    assert proc.returncode == 4 and "AccessDenied" in proc.stderr, proc.stderr[-2000:]
    assert other_secret not in proc.stderr


def test_the_presigning_users_policy_reaches_exchange_objects_and_nothing_else(
    iam_s3: IamS3,
) -> None:
    """What a URL can do is what its signer can: the chart's presigner policy, enforced by
    moto's IAM, allows getting and putting exchange objects, and nothing else."""
    from botocore.exceptions import ClientError

    admin = iam_s3.client("admin")
    for bucket in (EXCHANGE, "fedtune-provider"):
        admin.create_bucket(Bucket=bucket)
        admin.put_object(Bucket=bucket, Key="runs/state.json", Body=b"{}")
    signer = iam_s3.client("presigner")
    signer.put_object(Bucket=EXCHANGE, Key="runs/tenant-a/update.json", Body=b"{}")
    assert signer.get_object(Bucket=EXCHANGE, Key="runs/state.json")["Body"].read() == b"{}"
    refused = [
        lambda: signer.get_object(Bucket="fedtune-provider", Key="runs/state.json"),
        lambda: signer.put_object(Bucket="fedtune-provider", Key="x", Body=b""),
        lambda: signer.list_objects_v2(Bucket=EXCHANGE),
        lambda: signer.delete_object(Bucket=EXCHANGE, Key="runs/state.json"),
        lambda: signer.create_bucket(Bucket="another"),
    ]
    for call in refused:
        with pytest.raises(ClientError, match="AccessDenied"):
            call()
