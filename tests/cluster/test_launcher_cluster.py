"""The tenant launcher's failure paths against a real API server: what a provider sees when a
tenant's Secret, Role, quota or nodes are wrong, when its step fails, and when a retried task
finds its Job. Each case ends in a clear error (or a re-attach), never a silent wait."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedtune.config import JobConfig
from fedtune.config.tenant_view import tenant_view
from fedtune.core.errors import (
    ConfigError,
    DataError,
    FedtuneError,
    StoreUnavailable,
    TenantStepFailed,
)
from fedtune.engines import layout, steps
from fedtune.engines.launcher import KubernetesJobApi, launch, run_tenant_step
from fedtune.engines.launcher_manifest import (
    LauncherSettings,
    build_job_manifest,
    build_urls_secret,
    load_deployment,
)
from fedtune.engines.launcher_rbac import LAUNCHER_RULES
from fedtune.engines.tenant.pod_io import presign, step_objects
from tests.cluster.conftest import Cluster, wait_for
from tests.cluster.tenants import LAUNCHER_SA, PROVIDER_NS, inside_a_kfp_task, install_tenant
from tests.helpers.moto import create_bucket, start_moto_server, use_fake_aws_env
from tests.integration.conftest import DATA
from tests.kfp.conftest import two_tenant_job

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    server = start_moto_server()
    try:
        yield server.endpoint_url
    finally:
        server.stop()


def s3_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, endpoint: str, namespace: str,
           data_uri: str | None = None, resources: dict | None = None) -> JobConfig:
    """A job whose tenant-a runs in ``namespace`` (with ``resources``); its exchange in a fresh
    bucket, round 1 configured."""
    use_fake_aws_env(monkeypatch, endpoint)
    bucket = create_bucket(endpoint)
    tenants = [
        {"name": "tenant-a", "namespace": namespace, "resources": resources or {},
         "data_uri": data_uri or str(DATA / "tenant-a.jsonl")},
        {"name": "tenant-b", "namespace": f"{namespace}-b",
         "data_uri": str(DATA / "tenant-b.jsonl")},
    ]
    job = two_tenant_job(tmp_path / "provider", exchange_uri=f"s3://{bucket}/runs",
                         provider_store_uri=f"s3://{bucket}/provider", tenants=tenants)
    env = steps.ProviderEnv.create(job)
    steps.init_step(env)
    steps.configure_step(env, 1)
    return job


def launched_jobs(cluster: Cluster, namespace: str) -> list[str]:
    return [j.metadata.name for j in cluster.batch.list_namespaced_job(namespace).items
            if j.metadata.deletion_timestamp is None]


def test_a_missing_bucket_secret_fails_the_step_and_deletes_its_job(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    ns = install_tenant(cluster, "no-secret", secret=False)
    job = s3_job(tmp_path, monkeypatch, moto_endpoint, ns)
    inside_a_kfp_task(monkeypatch, cluster, tmp_path, {"tenant-a": ns})
    stuck = "cannot start: pod .*CreateContainerConfigError"
    with pytest.raises(FedtuneError, match=stuck) as info:
        run_tenant_step(job, "client", 1, "tenant-a", run_key="r1")
    assert "no-secret-bucket" in str(info.value) and "Secret exists" in info.value.fix
    assert launched_jobs(cluster, ns) == []


def test_no_launcher_role_in_the_tenant_namespace_is_a_permission_error_with_the_fix(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    ns = install_tenant(cluster, "no-role", role=False)
    job = s3_job(tmp_path, monkeypatch, moto_endpoint, ns)
    inside_a_kfp_task(monkeypatch, cluster, tmp_path, {"tenant-a": ns})
    with pytest.raises(ConfigError, match="may not create jobs in namespace 'no-role'") as info:
        run_tenant_step(job, "client", 1, "tenant-a", run_key="r1")
    assert "LAUNCHER_RULES" in info.value.fix
    assert launched_jobs(cluster, ns) == []


def test_a_quota_refusal_fails_after_the_start_timeout_with_the_controllers_reason(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    ns = install_tenant(cluster, "small-quota")
    cluster.core.create_namespaced_resource_quota(ns, {
        "metadata": {"name": "small"}, "spec": {"hard": {"limits.memory": "1Gi"}}})
    wait_for(lambda: cluster.core.read_namespaced_resource_quota("small", ns).status.hard,
             "the quota controller to account the quota")
    job = s3_job(tmp_path, monkeypatch, moto_endpoint, ns)
    inside_a_kfp_task(monkeypatch, cluster, tmp_path, {"tenant-a": ns},
                      launcher={"startTimeoutSeconds": 3})
    with pytest.raises(FedtuneError, match="could not start its pod for 3 s: FailedCreate") as info:
        run_tenant_step(job, "client", 1, "tenant-a", run_key="r1")
    assert "exceeded quota" in str(info.value) and "quota" in info.value.fix
    assert launched_jobs(cluster, ns) == []


def test_a_pod_that_fits_no_node_fails_after_the_start_timeout_as_unschedulable(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    ns = install_tenant(cluster, "no-node")
    job = s3_job(tmp_path, monkeypatch, moto_endpoint, ns)
    inside_a_kfp_task(monkeypatch, cluster, tmp_path, {"tenant-a": ns},
                      launcher={"startTimeoutSeconds": 3},
                      extra={"tenant-a": {"nodeSelector": {"fedtune.io/gpu": "h100"}}})
    with pytest.raises(FedtuneError, match="could not start its pod for 3 s: pod .*Unschedulable"):
        run_tenant_step(job, "client", 1, "tenant-a", run_key="r1")
    assert launched_jobs(cluster, ns) == []


@pytest.mark.slow
def test_a_failing_step_reaches_the_provider_as_its_redacted_failure(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    ns = install_tenant(cluster, "bad-data")
    broken = tmp_path / "tenant-a.jsonl"
    broken.write_text("this is not json\n")
    job = s3_job(tmp_path, monkeypatch, moto_endpoint, ns, data_uri=str(broken))
    inside_a_kfp_task(monkeypatch, cluster, tmp_path, {"tenant-a": ns})  # backoffLimit 2
    expected = r"exited with code 3 \(DataError\): DataError at line 1"
    with pytest.raises(TenantStepFailed, match=expected) as info:
        run_tenant_step(job, "client", 1, "tenant-a", run_key="r1")
    assert "this is not json" not in str(info.value)  # the tenant's record never leaves
    assert info.value.failure.kind == "DataError" and info.value.failure.record == 1
    assert "(PodFailurePolicy:" in str(info.value)
    # A bad record fails every pod alike: one pod, not backoffLimit + 1 of them.
    (record,) = [r for r in cluster.runner.records if r.namespace == ns]
    assert record.exit_code == 3 and '"kind": "DataError"' in record.message


def test_a_retried_launcher_reattaches_to_its_job_and_refuses_another_steps(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    ns = install_tenant(cluster, "retried")
    job = s3_job(tmp_path, monkeypatch, moto_endpoint, ns)
    inside_a_kfp_task(monkeypatch, cluster, tmp_path, {"tenant-a": ns})
    tenant = job.tenants[0]
    store = layout.JobStores(job).exchange("tenant-a")
    urls = presign(store, *step_objects("client", tenant_view(job, "tenant-a"), 1), 600)
    manifest = build_job_manifest(job, "tenant-a", "client", 1, load_deployment(tenant),
                                  run_key="r1")
    # A quick container instead of the training step: what is tested is the re-attach.
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["command"], container["args"] = ["python", "-c", "pass"], []
    api = KubernetesJobApi()
    # The first attempt created the Job (suspended) and stopped before handing it its URLs;
    # the retried task re-attaches, creates its URL Secret and resumes it.
    assert api.create_job(ns, manifest)
    outcome = launch(api, manifest, urls, settings=LauncherSettings(poll_s=2))
    assert outcome.reattached and outcome.name == manifest["metadata"]["name"]
    other = copy.deepcopy(manifest)
    other["metadata"]["labels"]["fedtune.io/step-id"] = "0000000000"
    with pytest.raises(ConfigError, match="belongs to another step"):
        launch(api, other, urls)


def quick_urls(job: JobConfig) -> dict[str, dict[str, str]]:
    """The pre-signed URLs of tenant-a's round-1 client step."""
    store = layout.JobStores(job).exchange("tenant-a")
    return presign(store, *step_objects("client", tenant_view(job, "tenant-a"), 1), 600)


def quick_manifest(job: JobConfig, namespace: str, exit_code: int, run_key: str = "") -> dict:
    """The launcher's manifest for tenant-a's client step, its container exiting with a code."""
    manifest = build_job_manifest(job, "tenant-a", "client", 1, load_deployment(job.tenants[0]),
                                  run_key=run_key or f"exit-{exit_code}",
                                  settings=LauncherSettings(backoff_limit=1))
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["command"] = ["python", "-c", f"raise SystemExit({exit_code})"]
    container["args"] = []
    return manifest


def test_the_job_controller_retries_an_outage_but_not_a_permanent_error(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    ns = install_tenant(cluster, "retries")
    job = s3_job(tmp_path, monkeypatch, moto_endpoint, ns)
    inside_a_kfp_task(monkeypatch, cluster, tmp_path, {"tenant-a": ns})
    api, quick = KubernetesJobApi(), LauncherSettings(poll_s=2, backoff_limit=1)
    runs = {}
    for error in (DataError, StoreUnavailable):
        manifest = quick_manifest(job, ns, error.exit_code)
        expected = rf"code {error.exit_code} \({error.__name__}\)"
        with pytest.raises(TenantStepFailed, match=expected) as info:
            launch(api, manifest, quick_urls(job), settings=quick)
        runs[error.__name__] = [r for r in cluster.runner.records
                                if r.pod.startswith(manifest["metadata"]["name"])]
        runs[error.__name__ + "-reason"] = str(info.value)
    assert len(runs["DataError"]) == 1 and "(PodFailurePolicy:" in runs["DataError-reason"]
    assert len(runs["StoreUnavailable"]) == 2  # backoffLimit 1: the outage gets a second pod
    assert "(BackoffLimitExceeded:" in runs["StoreUnavailable-reason"]


def test_gpus_are_scheduled_against_the_nodes_capacity(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    from tests.cluster.conftest import controlplane

    ns = install_tenant(cluster, "gpus")
    inside_a_kfp_task(monkeypatch, cluster, tmp_path, {"tenant-a": ns})
    api, quick = KubernetesJobApi(), LauncherSettings(poll_s=2, start_timeout_s=3)
    job = s3_job(tmp_path / "two", monkeypatch, moto_endpoint, ns, resources={"gpu": 2})
    outcome = launch(api, quick_manifest(job, ns, 0, run_key="two-gpus"), quick_urls(job),
                     settings=quick)
    (pod,) = cluster.core.list_namespaced_pod(ns, label_selector=f"job-name={outcome.name}").items
    assert pod.spec.node_name == controlplane.NODE_NAME
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "2"
    # More GPUs than the node has: the scheduler's reason reaches the provider.
    greedy = s3_job(tmp_path / "eight", monkeypatch, moto_endpoint, ns, resources={"gpu": 8})
    with pytest.raises(FedtuneError, match="Unschedulable: .*Insufficient nvidia.com/gpu"):
        launch(api, quick_manifest(greedy, ns, 0, run_key="eight-gpus"), quick_urls(greedy),
               settings=quick)


def test_the_launcher_asks_for_exactly_the_permissions_its_role_grants(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    """Each JobApi call, as the API server's audit log records it, is the permission
    KubernetesJobApi.PERMISSIONS names; together they are LAUNCHER_RULES, no more, no less."""
    ns = install_tenant(cluster, "every-call")
    job = s3_job(tmp_path, monkeypatch, moto_endpoint, ns)
    inside_a_kfp_task(monkeypatch, cluster, tmp_path, {"tenant-a": ns})
    api = KubernetesJobApi()
    manifest = quick_manifest(job, ns, 0, run_key="every-call")
    name = manifest["metadata"]["name"]
    listed: dict[str, str] = {}
    created: dict[str, dict] = {}
    calls = {
        "create_job": lambda: created.update(job=api.create_job(ns, manifest) or {}),
        "create_secret": lambda: api.create_secret(
            ns, build_urls_secret(created["job"], quick_urls(job))
        ),
        "resume_job": lambda: api.resume_job(ns, name),
        "read_job": lambda: api.read_job(ns, name),
        "list_job": lambda: listed.update(job=api.list_job(ns, name)[1]),
        "watch_job": lambda: api.watch_job(ns, name, listed["job"], 1),
        "list_pods": lambda: listed.update(pods=api.list_pods(ns, name)[1]),
        "watch_pods": lambda: api.watch_pods(ns, name, listed["pods"], 1),
        "read_pod": lambda: api.read_pod(ns, f"{name}-gone"),
        "list_job_events": lambda: api.list_job_events(ns, name),
        "delete_job": lambda: api.delete_job(ns, name),
    }
    used: dict[str, set[tuple[str, str, str]]] = {}
    for method, call in calls.items():
        before = len(cluster.requests_of(PROVIDER_NS, LAUNCHER_SA))
        call()
        asked = cluster.requests_of(PROVIDER_NS, LAUNCHER_SA)[before:]
        assert asked and all(r["namespace"] == ns and r["code"] != 403 for r in asked), asked
        used[method] = {(r["group"], r["resource"], r["verb"]) for r in asked}
    assert used == {m: {p} for m, p in KubernetesJobApi.PERMISSIONS.items()}
    granted = {(g, r, v) for rule in LAUNCHER_RULES for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    assert set().union(*used.values()) == granted


def test_the_urls_reach_the_pod_from_the_jobs_secret_and_go_with_the_job(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    """Who may get Jobs or pods in the tenant namespace reads no URL; the Secret that holds
    them is owned by the Job, and the garbage collector deletes it with the Job."""
    import hashlib
    import json

    ns = install_tenant(cluster, "url-secret")
    job = s3_job(tmp_path, monkeypatch, moto_endpoint, ns)
    inside_a_kfp_task(monkeypatch, cluster, tmp_path, {"tenant-a": ns})
    api, urls = KubernetesJobApi(), quick_urls(job)
    manifest = quick_manifest(job, ns, 0, run_key="url-secret")
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    # The pod proves it got the URLs: it exits 0 only when its env holds exactly them (their
    # digest: the command is part of the Job, too).
    digest = hashlib.sha256(json.dumps(urls, sort_keys=True).encode()).hexdigest()
    container["command"] = ["python", "-c", (
        "import hashlib, os, sys; value = os.environ['FEDTUNE_PRESIGNED'].encode(); "
        f"sys.exit(0 if hashlib.sha256(value).hexdigest() == {digest!r} else 9)"
    )]
    outcome = launch(api, manifest, urls, settings=LauncherSettings(poll_s=2))
    plain = cluster.api.sanitize_for_serialization
    stored_job = plain(cluster.batch.read_namespaced_job(outcome.name, ns))
    (pod,) = cluster.core.list_namespaced_pod(ns, label_selector=f"job-name={outcome.name}").items
    for what, doc in (("Job", stored_job), ("pod", plain(pod))):
        text = json.dumps(doc)
        assert "X-Amz-Signature" not in text, what
        assert not any(u in text for g in urls.values() for u in g.values()), what
    secret = cluster.core.read_namespaced_secret(f"{outcome.name}-urls", ns)
    (owner,) = secret.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.controller) == (
        "Job", outcome.name, stored_job["metadata"]["uid"], True
    )
    api.delete_job(ns, outcome.name)

    def collected() -> bool:
        names = [s.metadata.name for s in cluster.core.list_namespaced_secret(ns).items]
        return f"{outcome.name}-urls" not in names

    wait_for(collected, "the garbage collector to delete the Job's URL Secret", timeout_s=60)

