"""The tenant Job the launcher creates, field by field, and the cluster settings it reads."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from fedtune import __version__
from fedtune.config import JobConfig, parse_job
from fedtune.config.tenant_view import TenantJob
from fedtune.core.errors import ConfigError
from fedtune.engines.launcher_manifest import (
    LauncherSettings,
    TenantDeployment,
    build_job_manifest,
    build_urls_secret,
    job_name,
    load_deployment,
    load_settings,
)
from tests.kfp.conftest import cluster_job_dict

DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
URLS = {
    "get": {"broadcast/round-000003.json": "https://exchange.example/get-signed"},
    "put": {"updates/round-000003/tenant-a.json": "https://exchange.example/put-signed"},
}


def gpu_job() -> JobConfig:
    raw = cluster_job_dict()
    raw["tenants"][0]["resources"] = {
        "cpu": "4",
        "memory": "16Gi",
        "gpu": 2,
        "node_selector": {"pool": "a100"},
    }
    return parse_job(raw)


DEPLOYMENT = TenantDeployment(
    namespace="fedtune-tenant-a",
    bucket_secret="tenant-a-bucket",
    service_account="fedtune-tenant",
    bucket_endpoint="https://s3.tenant-a.example",
    image="registry.example/fedtune-gpu:1.2.3",
    node_selector={"nvidia.com/gpu.present": "true"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
)


def manifest(**kwargs: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "job": gpu_job(),
        "tenant_name": "tenant-a",
        "kind": "client",
        "round_index": 3,
        "deployment": DEPLOYMENT,
        "run_key": "run-42",
        "settings": LauncherSettings(backoff_limit=1, active_deadline_s=7200, ttl_s=600),
    }
    args.update(kwargs)
    return build_job_manifest(**args)


def container(m: dict[str, Any]) -> dict[str, Any]:
    (only,) = m["spec"]["template"]["spec"]["containers"]
    return only


def env_of(m: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(m)["env"] if "value" in e}


def test_job_runs_in_the_tenants_namespace_under_a_deterministic_dns_name() -> None:
    m = manifest()
    assert (m["apiVersion"], m["kind"]) == ("batch/v1", "Job")
    assert m["metadata"]["namespace"] == "fedtune-tenant-a"
    name = m["metadata"]["name"]
    assert DNS1123.match(name) and len(name) <= 63
    assert name == manifest()["metadata"]["name"]  # a retry computes the same name
    assert name != manifest(run_key="run-43")["metadata"]["name"]  # a new run does not
    assert name != manifest(round_index=4)["metadata"]["name"]
    assert name != manifest(tenant_name="tenant-b")["metadata"]["name"]
    labels = m["metadata"]["labels"]
    assert labels["fedtune.io/tenant"] == "tenant-a" and labels["fedtune.io/round"] == "3"
    assert m["spec"]["template"]["metadata"]["labels"] == labels


def test_long_names_are_cut_to_a_valid_label() -> None:
    name, step_id = job_name("j" * 63, "evaluate", 123456, "t" * 63, "run")
    assert DNS1123.match(name) and len(name) <= 63 and name.endswith(step_id)


def test_job_limits_ttl_deadline_and_istio_annotation() -> None:
    spec = manifest()["spec"]
    assert spec["backoffLimit"] == 1
    assert spec["activeDeadlineSeconds"] == 7200
    assert spec["ttlSecondsAfterFinished"] == 600
    assert spec["template"]["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert spec["template"]["spec"]["restartPolicy"] == "Never"


def test_tenant_bucket_secret_keys_reach_boto3_by_name_and_no_provider_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "PROVIDER-KEY-ID")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "provider-secret-never-shipped")
    m = manifest()
    c = container(m)
    assert "envFrom" not in c  # envFrom would hand boto3 `access-key-id`, a name it ignores
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "valueFrom" in e
    }
    urls_secret = f"{m['metadata']['name']}-urls"
    assert refs == {
        "FEDTUNE_PRESIGNED": {"name": urls_secret, "key": "presigned"},
        "AWS_ACCESS_KEY_ID": {"name": "tenant-a-bucket", "key": "access-key-id"},
        "AWS_SECRET_ACCESS_KEY": {"name": "tenant-a-bucket", "key": "secret-access-key"},
        "AWS_SESSION_TOKEN": {"name": "tenant-a-bucket", "key": "session-token", "optional": True},
        "AWS_DEFAULT_REGION": {"name": "tenant-a-bucket", "key": "region", "optional": True},
        "AWS_ENDPOINT_URL_S3": {"name": "tenant-a-bucket", "key": "endpoint", "optional": True},
    }
    env = env_of(m)
    assert env["FEDTUNE_S3_ENDPOINT_URL"] == "https://s3.tenant-a.example"  # the tenant's own
    text = json.dumps(m)
    assert "PROVIDER-KEY-ID" not in text and "provider-secret-never-shipped" not in text
    secrets = {r["name"] for r in refs.values()}
    assert secrets == {"tenant-a-bucket", urls_secret}  # no key of any other Secret


def created(m: dict[str, Any], uid: str = "0b6f-job-uid") -> dict[str, Any]:
    """The Job as the API server returns it on create: with its uid."""
    return {**m, "metadata": {**m["metadata"], "uid": uid}}


def test_the_urls_are_not_in_the_job_but_in_a_secret_the_job_owns() -> None:
    """Whoever may `get jobs` or `get pods` reads a Job's env: the URLs sit in a Secret."""
    m = manifest()
    assert m["spec"]["suspend"] is True  # resumed once its Secret exists
    text = json.dumps(m)
    for url in [*URLS["get"].values(), *URLS["put"].values()]:
        assert url not in text
    secret = build_urls_secret(created(m), URLS)
    name = m["metadata"]["name"]
    assert (secret["apiVersion"], secret["kind"], secret["type"]) == ("v1", "Secret", "Opaque")
    assert secret["metadata"]["name"] == f"{name}-urls"
    assert secret["metadata"]["namespace"] == m["metadata"]["namespace"]
    assert secret["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": "0b6f-job-uid",
         "controller": True}
    ]
    assert secret["immutable"] is True
    assert list(secret["data"]) == ["presigned"]
    assert json.loads(base64.b64decode(secret["data"]["presigned"])) == URLS
    # The pod reads exactly that key of exactly that Secret.
    ref = next(e for e in container(m)["env"] if e["name"] == "FEDTUNE_PRESIGNED")
    assert ref == {
        "name": "FEDTUNE_PRESIGNED",
        "valueFrom": {"secretKeyRef": {"name": f"{name}-urls", "key": "presigned"}},
    }
    kubernetes_validate.validate(secret, "1.30", strict=True)


def test_root_filesystem_is_read_only_and_caches_live_in_the_scratch_volume() -> None:
    m = manifest()
    c = container(m)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    (scratch,) = m["spec"]["template"]["spec"]["volumes"]
    assert scratch["emptyDir"] == {} and c["volumeMounts"] == [
        {"name": scratch["name"], "mountPath": "/tmp"}
    ]
    env = env_of(m)
    for name in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "HF_HOME", "TORCH_HOME", "MPLCONFIGDIR"):
        assert env[name].startswith("/tmp"), name
    assert "TRITON_CACHE_DIR" in env and "MLFLOW_TRACKING_DIR" not in env


def test_tenant_pod_sees_no_other_tenants_uris_no_tracking_and_no_exchange_uri() -> None:
    seen = json.loads(env_of(manifest())["FEDTUNE_JOB_JSON"])
    assert seen["tenant"]["name"] == "tenant-a"
    assert seen["tenant"]["data_uri"] == "s3://tenant-a-data/train.jsonl"
    assert "tenant-b" not in json.dumps(seen)  # not even its name
    assert "tenants" not in seen and "tracking" not in seen and seen["exchange_uri"] is None
    TenantJob.model_validate(seen)  # the pod's job object: its view, nothing more


def test_gpu_limit_and_placement_come_from_the_chart_and_the_job_may_only_narrow_it() -> None:
    raw = cluster_job_dict()
    raw["tenants"][0]["resources"] = {
        "cpu": "4",
        "memory": "16Gi",
        "gpu": 2,
        "node_selector": {"pool": "a100"},  # a further constraint: allowed
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    m = manifest(job=parse_job(raw))
    pod = m["spec"]["template"]["spec"]
    res = container(m)["resources"]
    assert res["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "2"}
    assert res["requests"] == {"cpu": "4", "memory": "16Gi"}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "a100"}
    assert pod["tolerations"] == list(DEPLOYMENT.tolerations)
    cpu_only = manifest(
        tenant_name="tenant-b", deployment=TenantDeployment("fedtune-tenant-b", "b")
    )
    assert "nvidia.com/gpu" not in container(cpu_only)["resources"]["limits"]
    assert cpu_only["spec"]["template"]["spec"]["nodeSelector"] == {}


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        (
            {"tolerations": [{"key": "team-a", "operator": "Exists", "effect": "NoSchedule"}]},
            "adds toleration {'key': 'team-a'",
        ),
        ({"node_selector": {"nvidia.com/gpu.present": "false"}}, "overrides nodeSelector"),
    ],
    ids=["extra-toleration", "node-selector-override"],
)
def test_a_job_cannot_widen_the_charts_placement(resources: dict[str, Any], message: str) -> None:
    raw = cluster_job_dict()
    raw["tenants"][0]["resources"] = resources
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        manifest(job=parse_job(raw))
    assert "tenants[].tolerations" in info.value.fix or "nodeSelector" in info.value.fix


def test_pod_is_non_root_with_no_api_token_and_runs_the_step_entrypoint() -> None:
    m = manifest()
    pod = m["spec"]["template"]["spec"]
    c = container(m)
    assert pod["serviceAccountName"] == "fedtune-tenant"
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["image"] == "registry.example/fedtune-gpu:1.2.3"
    assert c["command"] == ["python", "-m", "fedtune.entrypoints.client_step"]
    assert c["args"] == ["--round", "3", "--tenant", "tenant-a", "--presigned"]
    evaluate = manifest(kind="evaluate", deployment=TenantDeployment("fedtune-tenant-a", "s"))
    assert container(evaluate)["command"][-1] == "fedtune.entrypoints.evaluate"
    assert container(evaluate)["image"] == f"ghcr.io/fedtune/fedtune-gpu:{__version__}"


def test_manifest_is_a_valid_kubernetes_job() -> None:
    kubernetes_validate.validate(manifest(), "1.30", strict=True)


# -- the tenants file (the chart's ConfigMap) --------------------------------------------------
def tenants_file(tmp_path: Path, **entry: Any) -> str:
    tenant = {
        "name": "tenant-a",
        "namespace": "fedtune-tenant-a",
        "serviceAccountName": "fedtune-tenant",
        "bucketSecretName": "tenant-a-bucket",
        "bucketEndpoint": "https://s3.tenant-a.example",
        "nodeSelector": {"gpu": "yes"},
        "tolerations": [],
    }
    tenant.update(entry)
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"image": "r/img:1", "tenants": [tenant]}))
    return str(path)


def test_deployment_is_read_from_the_tenants_file(tmp_path: Path) -> None:
    tenant = gpu_job().tenants[0]
    got = load_deployment(tenant, tenants_file(tmp_path))
    assert got == TenantDeployment(
        namespace="fedtune-tenant-a",
        bucket_secret="tenant-a-bucket",
        service_account="fedtune-tenant",
        bucket_endpoint="https://s3.tenant-a.example",
        image="r/img:1",
        node_selector={"gpu": "yes"},
        tolerations=[],
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"namespace": "Tenant_A"}, "'Tenant_A' is not a DNS-1123 label"),
        ({"namespace": "fedtune-other"}, "runs in namespace 'fedtune-other'"),
        ({"name": "someone-else"}, "is not in the cluster's tenants file"),
        ({"bucketSecretName": ""}, "has no bucketSecretName"),
    ],
    ids=["non-dns-namespace", "namespace-mismatch", "not-installed", "no-secret"],
)
def test_bad_tenants_file_entries_are_refused(
    tmp_path: Path, entry: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        load_deployment(gpu_job().tenants[0], tenants_file(tmp_path, **entry))
    assert info.value.fix


def test_job_limits_come_from_the_charts_launcher_values(tmp_path: Path) -> None:
    path = Path(tenants_file(tmp_path))
    doc = json.loads(path.read_text())
    assert load_settings(str(path)) == LauncherSettings()  # no launcher section: the defaults
    doc["launcher"] = {
        "backoffLimit": 0,
        "activeDeadlineSeconds": 900,
        "ttlSecondsAfterFinished": 60,
        "startTimeoutSeconds": 120,
    }
    path.write_text(json.dumps(doc))
    got = load_settings(str(path))
    assert (got.backoff_limit, got.active_deadline_s, got.ttl_s, got.start_timeout_s) == (
        0,
        900,
        60,
        120,
    )
    doc["launcher"]["activeDeadlineSeconds"] = "soon"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="launcher.activeDeadlineSeconds") as info:
        load_settings(str(path))
    assert "tenantDefaults.job" in info.value.fix


def test_missing_tenants_file_says_how_to_get_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the tenants file") as info:
        load_deployment(gpu_job().tenants[0], str(tmp_path / "absent.json"))
    assert "Helm chart" in info.value.fix


def test_non_dns_namespace_in_the_job_config_is_refused() -> None:
    raw = cluster_job_dict()
    raw["tenants"][0]["namespace"] = "Tenant_A"
    with pytest.raises(ConfigError, match=r"tenants\.0\.namespace: 'Tenant_A' is not a DNS-1123"):
        parse_job(raw)
