"""The tenant admission policy, evaluated with two real CEL implementations.

The chart renders one ValidatingAdmissionPolicy per tenant. Its CEL expressions are evaluated
the way the API server does (``admission_cel.py``), under ``cel-python`` and under Google's C++
runtime (``cel-expr-python``, which also type-checks them); every test that reviews a request
runs under both, so the two must agree. The launcher's real manifests, built from the rendered
tenants ConfigMap, must be admitted; each way of misusing the launcher's rights must be refused
with a message naming what was refused. Every manifest fed to the policy is first validated
against the Kubernetes schema, so each refusal is the policy's doing, not a malformed object's.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from admission_cel import CppPolicy, Policy, PythonPolicy
from chart_helpers import KUBE_VERSION, NAMESPACE, VALUES_DIR, Rendered, Renderer, load_yaml

from fedtune.config import parse_job
from fedtune.engines.launcher_manifest import STEP_MODULES, build_job_manifest, load_deployment
from fedtune.entrypoints.tenant_io import StepKind
from tests.kfp.conftest import cluster_job_dict

LAUNCHER = f"system:serviceaccount:{NAMESPACE}:ft-fedtune-launcher"
SCENARIO = "multi-tenant-gpu"
TENANT = "hospital-a"
NAMESPACES = {
    "hospital-a": "fedtune-hospital-a",
    "hospital-b": "fedtune-hospital-b",
    "clinic-c": "clinic-c-federated",
}
Manifest = dict[str, Any]
RUNTIMES = {"cel-python": PythonPolicy, "cel-cpp": CppPolicy}


def _tenants_file(rendered: Rendered, tmp_path: Path) -> Path:
    (config_map,) = [
        c for c in rendered.of_kind("ConfigMap") if c["metadata"]["name"].endswith("-tenants")
    ]
    path = tmp_path / "tenants.json"
    path.write_text(config_map["data"]["tenants.json"])
    return path


def launcher_manifest(tenants_file: Path, tenant: str, kind: StepKind = "client") -> Manifest:
    """The Job the real launcher builds for ``tenant`` from the chart's tenants ConfigMap."""
    raw = cluster_job_dict()
    raw["tenants"] = [
        {
            "name": n,
            "namespace": ns,
            "data_uri": f"s3://{n}-data/train.jsonl",
            "store_uri": f"s3://{n}-data/state",
        }
        for n, ns in NAMESPACES.items()
    ]
    job = parse_job(raw)
    entry = next(t for t in job.tenants if t.name == tenant)
    deployment = load_deployment(entry, str(tenants_file))
    urls = {"get": {"k": "https://x/get"}, "put": {"k": "https://x/put"}}
    return build_job_manifest(job, tenant, kind, 1, deployment, urls, run_key="run")


@pytest.fixture(scope="module")
def rendered(rendered_scenarios: dict[str, Rendered]) -> Rendered:
    return rendered_scenarios[SCENARIO]


@pytest.fixture(scope="module", params=sorted(RUNTIMES))
def policies(rendered: Rendered, request: pytest.FixtureRequest) -> dict[str, Policy]:
    """Each tenant's rendered policy under one CEL runtime, by tenant name."""
    if request.param == "cel-cpp":
        pytest.importorskip("cel_expr_python", reason="cel-expr-python has no wheel here")
    return {
        d["metadata"]["labels"]["fedtune.io/tenant"]: RUNTIMES[request.param](d, launcher=LAUNCHER)
        for d in rendered.of_kind("ValidatingAdmissionPolicy")
    }


@pytest.fixture(scope="module")
def policy(policies: dict[str, Policy]) -> Policy:
    return policies[TENANT]


@pytest.fixture(scope="module")
def tenants_file(rendered: Rendered, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tenants_file(rendered, tmp_path_factory.mktemp("cm"))


@pytest.fixture(scope="module")
def manifest(tenants_file: Path) -> Manifest:
    return launcher_manifest(tenants_file, TENANT)


def _valid(doc: Manifest) -> Manifest:
    kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    return doc


def test_one_policy_and_binding_per_tenant_scoped_to_its_namespace(rendered: Rendered) -> None:
    policies = {p["metadata"]["name"]: p for p in rendered.of_kind("ValidatingAdmissionPolicy")}
    bindings = rendered.of_kind("ValidatingAdmissionPolicyBinding")
    assert len(policies) == len(bindings) == len(NAMESPACES)
    scoped = {}
    for binding in bindings:
        assert binding["spec"]["validationActions"] == ["Deny"]
        tenant = policies[binding["spec"]["policyName"]]["metadata"]["labels"]["fedtune.io/tenant"]
        scoped[tenant] = binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]
    assert scoped == {t: {"kubernetes.io/metadata.name": ns} for t, ns in NAMESPACES.items()}


@pytest.mark.parametrize("kind", sorted(STEP_MODULES))
@pytest.mark.parametrize("tenant", sorted(NAMESPACES))
def test_each_tenants_policy_admits_the_launchers_real_manifest(
    policies: dict[str, Policy], tenants_file: Path, tenant: str, kind: StepKind
) -> None:
    job = _valid(launcher_manifest(tenants_file, tenant, kind))
    assert "@sha256:" in job["spec"]["template"]["spec"]["containers"][0]["image"]
    assert policies[tenant].review(job) == []
    assert policies[tenant].fallbacks == []


def test_a_job_for_another_tenant_is_refused(policy: Policy, tenants_file: Path) -> None:
    """hospital-b's Job (its Secret, endpoint, --tenant) in hospital-a's namespace."""
    failed = policy.review(launcher_manifest(tenants_file, "hospital-b"))
    assert (
        "refused a reference to Secret hospital-b-bucket: a tenant Job may read no "
        "Secret but the bucket Secret hospital-a-bucket of its tenant"
    ) in failed
    assert any(m.startswith("refused environment variable FEDTUNE_S3_ENDPOINT_URL") for m in failed)
    assert any(m.startswith("refused command or args") for m in failed)


def _pod(m: Manifest) -> dict[str, Any]:
    return m["spec"]["template"]["spec"]


def _ctr(m: Manifest) -> dict[str, Any]:
    return _pod(m)["containers"][0]


def _set(path: Callable[[Manifest], dict[str, Any]], **fields: Any) -> Callable[[Manifest], None]:
    return lambda m: path(m).update(fields)


def _append(
    path: Callable[[Manifest], dict[str, Any]], key: str, item: Any
) -> Callable[[Manifest], None]:
    return lambda m: path(m).setdefault(key, []).append(item)


def _retag(m: Manifest) -> None:
    _ctr(m)["image"] = _ctr(m)["image"].split("@")[0] + ":0.1.0"


def _init_container(m: Manifest) -> None:
    _pod(m)["initContainers"] = [{**copy.deepcopy(_ctr(m)), "name": "setup"}]


# The scenario's digest on the chart's default registry and repository.
PINNED = (
    "ghcr.io/fedtune/fedtune-gpu@"
    + load_yaml(VALUES_DIR / f"{SCENARIO}.yaml")["image"]["gpuDigest"]
)
OTHER_IMAGE = "evil.example/miner@sha256:" + "0" * 64

# name: (change to the launcher's manifest, the start of the message it must be refused with)
REJECTED: dict[str, tuple[Callable[[Manifest], None], str]] = {
    "another-image": (
        _set(_ctr, image=OTHER_IMAGE),
        f"refused image {OTHER_IMAGE}: a tenant Job must run the pinned fedtune image {PINNED}",
    ),
    "tag-not-digest": (
        _retag,
        "refused image ghcr.io/fedtune/fedtune-gpu:0.1.0: a tenant Job must run the pinned",
    ),
    "other-entrypoint": (
        _set(_ctr, command=["sh", "-c", "cat /secrets/*"]),
        (
            "refused command or args: a tenant Job must run `python -m "
            "fedtune.entrypoints.client_step|evaluate|audit|secagg_advertise|secagg_share|"
            "secagg_unmask --round N --tenant hospital-a "
            "--presigned`"
        ),
    ),
    "other-module": (
        _set(_ctr, command=["python", "-m", "fedtune.entrypoints.aggregate"]),
        "refused command or args",
    ),
    "image-default-entrypoint": (lambda m: _ctr(m).pop("command"), "refused command or args"),
    "other-tenant-arg": (
        lambda m: _ctr(m)["args"].__setitem__(3, "hospital-b"),
        "refused command or args",
    ),
    "not-presigned": (lambda m: _ctr(m)["args"].pop(), "refused command or args"),
    "job-file-arg": (
        lambda m: _ctr(m)["args"].extend(["--job", "/tmp/job.yaml"]),
        "refused command or args",
    ),
    "other-tenants-secret-volume": (
        _append(_pod, "volumes", {"name": "stolen", "secret": {"secretName": "hospital-b-bucket"}}),
        (
            "refused volume stolen: a tenant Job may mount only emptyDir volumes and its "
            "own bucket Secret hospital-a-bucket"
        ),
    ),
    "other-tenants-secret-env": (
        _append(
            _ctr,
            "env",
            {
                "name": "AWS_SECRET_ACCESS_KEY",
                "valueFrom": {
                    "secretKeyRef": {"name": "hospital-b-bucket", "key": "secret-access-key"}
                },
            },
        ),
        (
            "refused a reference to Secret hospital-b-bucket: a tenant Job may read no "
            "Secret but the bucket Secret hospital-a-bucket"
        ),
    ),
    "other-tenants-secret-envfrom": (
        _append(_ctr, "envFrom", {"secretRef": {"name": "hospital-b-bucket"}}),
        "refused a reference to Secret hospital-b-bucket",
    ),
    "configmap-envfrom": (
        _append(_ctr, "envFrom", {"configMapRef": {"name": "proxy"}}),
        "refused a reference to a ConfigMap (envFrom)",
    ),
    "proxy-env": (
        _append(_ctr, "env", {"name": "HTTPS_PROXY", "value": "http://collector.provider:3128"}),
        (
            "refused environment variable HTTPS_PROXY: a tenant Job sets only "
            "FEDTUNE_JOB_JSON, FEDTUNE_PRESIGNED, HF_HUB_OFFLINE=1, "
            "FEDTUNE_S3_ENDPOINT_URL=https://s3.hospital-a.example, cache locations under /tmp "
            "and AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_DEFAULT_REGION, "
            "AWS_ENDPOINT_URL_S3 from keys of Secret hospital-a-bucket"
        ),
    ),
    "own-secret-as-other-variable": (
        _append(
            _ctr,
            "env",
            {
                "name": "PYTHONPATH",
                "valueFrom": {"secretKeyRef": {"name": "hospital-a-bucket", "key": "endpoint"}},
            },
        ),
        "refused environment variable PYTHONPATH",
    ),
    "cache-moved-out-of-scratch": (
        lambda m: next(e for e in _ctr(m)["env"] if e["name"] == "HF_HOME").update(
            value="/models"
        ),
        "refused environment variable HF_HOME",
    ),
    "redirected-bucket-endpoint": (
        lambda m: next(e for e in _ctr(m)["env"] if e["name"] == "FEDTUNE_S3_ENDPOINT_URL").update(
            value="http://minio.fedtune:9000"
        ),
        "refused environment variable FEDTUNE_S3_ENDPOINT_URL",
    ),
    "privileged": (
        lambda m: _ctr(m)["securityContext"].update(privileged=True),
        "refused container tenant-step: a tenant container may not be privileged",
    ),
    "privilege-escalation": (
        lambda m: _ctr(m)["securityContext"].update(allowPrivilegeEscalation=True),
        "refused container tenant-step",
    ),
    "added-capability": (
        lambda m: _ctr(m)["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]}),
        "refused container tenant-step",
    ),
    "container-root-user": (
        lambda m: _ctr(m)["securityContext"].update(runAsUser=0),
        "refused container tenant-step",
    ),
    "container-may-run-as-root": (
        lambda m: _ctr(m)["securityContext"].update(runAsNonRoot=False),
        "refused container tenant-step",
    ),
    "host-port": (
        _set(_ctr, ports=[{"containerPort": 22, "hostPort": 22}]),
        "refused container tenant-step",
    ),
    "pod-root-user": (
        lambda m: _pod(m)["securityContext"].update(runAsUser=0),
        "refused pod securityContext",
    ),
    "pod-may-run-as-root": (
        lambda m: _pod(m)["securityContext"].update(runAsNonRoot=False),
        "refused pod securityContext",
    ),
    "seccomp-unconfined": (
        lambda m: _pod(m)["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "refused pod securityContext",
    ),
    "host-path": (
        _append(_pod, "volumes", {"name": "host", "hostPath": {"path": "/"}}),
        "refused volume host: a tenant Job may mount only emptyDir volumes",
    ),
    "pvc": (
        _append(
            _pod, "volumes", {"name": "data", "persistentVolumeClaim": {"claimName": "tenant-data"}}
        ),
        "refused volume data",
    ),
    "projected-token": (
        _append(
            _pod,
            "volumes",
            {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}},
        ),
        "refused volume token",
    ),
    "host-network": (_set(_pod, hostNetwork=True), "refused host namespaces"),
    "host-pid": (_set(_pod, hostPID=True), "refused host namespaces"),
    "host-ipc": (_set(_pod, hostIPC=True), "refused host namespaces"),
    "node-name": (
        _set(_pod, nodeName="provider-node-1"),
        "refused nodeName, hostAliases or dnsConfig",
    ),
    "host-aliases": (
        _set(_pod, hostAliases=[{"ip": "10.0.0.9", "hostnames": ["s3.hospital-a.example"]}]),
        "refused nodeName, hostAliases or dnsConfig",
    ),
    "dns-config": (
        _set(_pod, dnsPolicy="None", dnsConfig={"nameservers": ["10.0.0.53"]}),
        "refused nodeName, hostAliases or dnsConfig",
    ),
    "init-container": (
        _init_container,
        (
            "refused a Job with 2 containers (init and ephemeral included): a tenant Job "
            "runs exactly one container"
        ),
    ),
    "second-container": (
        lambda m: _pod(m)["containers"].append({**copy.deepcopy(_ctr(m)), "name": "sidecar"}),
        "refused a Job with 2 containers",
    ),
    "post-start-hook": (
        _set(_ctr, lifecycle={"postStart": {"exec": {"command": ["sh", "-c", "env"]}}}),
        "refused lifecycle hook or probe",
    ),
    "exec-probe": (
        _set(_ctr, livenessProbe={"exec": {"command": ["sh", "-c", "env"]}}),
        "refused lifecycle hook or probe",
    ),
    "api-token": (
        _set(_pod, automountServiceAccountToken=True),
        "refused ServiceAccount or API token: a tenant Job runs as ServiceAccount fedtune-tenant",
    ),
    "other-service-account": (
        _set(_pod, serviceAccountName="tenant-admin"),
        "refused ServiceAccount or API token",
    ),
}


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_a_misused_launcher_right_is_refused(policy: Policy, manifest: Manifest, case: str) -> None:
    change, expected = REJECTED[case]
    job = copy.deepcopy(manifest)
    change(job)
    failed = policy.review(_valid(job))
    assert any(message.startswith(expected) for message in failed), failed
    assert policy.fallbacks == []


def test_an_init_container_is_held_to_the_same_rules(policy: Policy, manifest: Manifest) -> None:
    job = copy.deepcopy(manifest)
    _pod(job)["initContainers"] = [
        {"name": "fetch", "image": "busybox:1", "command": ["wget", "http://x"]}
    ]
    failed = policy.review(_valid(job))
    assert any(m.startswith("refused image busybox:1") for m in failed), failed
    assert any(m.startswith("refused container fetch") for m in failed), failed


def test_the_launcher_may_create_no_bare_pod(policy: Policy, manifest: Manifest) -> None:
    pod = _valid(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": copy.deepcopy(_pod(manifest)),
        }
    )
    assert policy.review(pod, resource="pods") == [
        "refused CREATE of pods (group '', version v1): the fedtune launcher may only create"
        " batch/v1 Jobs in the namespace of tenant hospital-a"
    ]


def test_the_launcher_may_create_no_cronjob(policy: Policy, manifest: Manifest) -> None:
    cron = _valid(
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "c"},
            "spec": {
                "schedule": "* * * * *",
                "jobTemplate": {"spec": copy.deepcopy(manifest["spec"])},
            },
        }
    )
    assert [m.split(":")[0] for m in policy.review(cron, resource="cronjobs")] == [
        "refused CREATE of cronjobs (group 'batch', version v1)"
    ]


def test_the_launcher_may_create_nothing_else(policy: Policy) -> None:
    config_map = _valid(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "c"},
            "data": {"PYTHONPATH": "/x"},
        }
    )
    assert [m.split(":")[0] for m in policy.review(config_map, resource="configmaps")] == [
        "refused CREATE of configmaps (group '', version v1)"
    ]


@pytest.mark.parametrize("subresource", ["exec", "attach", "portforward"])
def test_the_launcher_may_not_enter_a_tenant_pod(policy: Policy, subresource: str) -> None:
    options = {"kind": "PodExecOptions", "apiVersion": "v1", "command": ["sh"], "stdin": True}
    assert [m.split(":")[0] for m in policy.review(options, resource=f"pods/{subresource}")] == [
        f"refused CONNECT of pods/{subresource} (group '', version v1)"
    ]


def test_the_tenants_own_admins_are_not_restricted(policy: Policy, manifest: Manifest) -> None:
    """Decision: the policy governs the provider's launcher only; the tenant owns its namespace."""
    job = copy.deepcopy(manifest)
    _ctr(job)["image"] = "hospital-a.example/own-tool:1"
    _pod(job)["volumes"].append({"name": "s", "secret": {"secretName": "hospital-a-db"}})
    assert policy.review(job, user="alice@hospital-a.example") == []
    assert policy.review(job, user="system:serviceaccount:fedtune-hospital-a:ci") == []
    assert policy.review(job, user=LAUNCHER) != []


def test_a_tenant_release_without_a_digest_is_refused(render: Renderer) -> None:
    result = render(SCENARIO, set_values=["image.gpuDigest="])
    assert result.returncode != 0 and "image.gpuDigest is empty" in result.stderr


def test_a_digest_that_is_not_sha256_is_refused(render: Renderer) -> None:
    result = render(SCENARIO, set_values=["image.gpuDigest=latest"])
    assert result.returncode != 0 and "gpuDigest" in result.stderr


def test_the_policy_can_be_switched_off(render: Renderer) -> None:
    result = render(SCENARIO, set_values=["tenantAdmission.enabled=false", "image.gpuDigest="])
    assert result.returncode == 0
    assert not result.of_kind("ValidatingAdmissionPolicy")
    assert not result.of_kind("ValidatingAdmissionPolicyBinding")
    tenants = json.loads(
        next(c for c in result.of_kind("ConfigMap") if c["metadata"]["name"].endswith("-tenants"))[
            "data"
        ]["tenants.json"]
    )
    assert tenants["image"].endswith(":0.1.0")
