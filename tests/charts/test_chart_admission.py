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
from pathlib import Path

import kubernetes_validate
import pytest
from admission_cases import (
    NAMESPACES,
    REJECTED,
    SCENARIO,
    SECRET_REJECTED,
    TENANT,
    Manifest,
    container_of,
    launcher_manifest,
    launcher_secret,
    misused,
    misused_secret,
    pod_of,
    tenants_file as write_tenants_file,
)
from admission_cel import CppPolicy, Policy, PythonPolicy
from chart_helpers import KUBE_VERSION, NAMESPACE, Rendered, Renderer

from fedtune.engines.launcher_manifest import STEP_MODULES
from fedtune.engines.tenant.pod_io import StepKind

LAUNCHER = f"system:serviceaccount:{NAMESPACE}:ft-fedtune-launcher"
RUNTIMES = {"cel-python": PythonPolicy, "cel-cpp": CppPolicy}


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
    return write_tenants_file(rendered, tmp_path_factory.mktemp("cm"))


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


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_a_misused_launcher_right_is_refused(policy: Policy, manifest: Manifest, case: str) -> None:
    expected = REJECTED[case][1]
    failed = policy.review(_valid(misused(manifest, case)))
    assert any(message.startswith(expected) for message in failed), failed
    assert policy.fallbacks == []


def test_resuming_the_suspended_job_is_admitted(policy: Policy, manifest: Manifest) -> None:
    """The launcher's patch of ``spec.suspend`` is an UPDATE: the whole Job is judged again."""
    job = copy.deepcopy(manifest)
    assert job["spec"]["suspend"] is True
    job["spec"]["suspend"] = False
    assert policy.review(_valid(job), operation="UPDATE") == []
    misused_job = misused(job, "another-image")
    assert policy.review(misused_job, operation="UPDATE") != []


@pytest.mark.parametrize("tenant", sorted(NAMESPACES))
def test_each_tenants_policy_admits_the_url_secret_of_the_launchers_job(
    policies: dict[str, Policy], tenants_file: Path, tenant: str
) -> None:
    secret = _valid(launcher_secret(launcher_manifest(tenants_file, tenant)))
    assert policies[tenant].review(secret, resource="secrets") == []
    assert policies[tenant].fallbacks == []


@pytest.mark.parametrize("case", sorted(SECRET_REJECTED))
def test_a_secret_that_is_not_a_jobs_url_secret_is_refused(
    policy: Policy, manifest: Manifest, case: str
) -> None:
    secret, expected = misused_secret(manifest, case)
    failed = policy.review(_valid(secret), resource="secrets")
    assert any(message.startswith(expected) for message in failed), failed
    assert policy.fallbacks == []


def test_the_launcher_may_not_change_a_secret(policy: Policy, manifest: Manifest) -> None:
    """Its Role has no update; the policy refuses one even if someone widens that Role."""
    secret = _valid(launcher_secret(manifest))
    assert [m.split(":")[0] for m in policy.review(secret, resource="secrets", operation="UPDATE")] == [
        "refused UPDATE of secrets (group '', version v1)"
    ]


def test_an_init_container_is_held_to_the_same_rules(policy: Policy, manifest: Manifest) -> None:
    job = copy.deepcopy(manifest)
    pod_of(job)["initContainers"] = [
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
            "spec": copy.deepcopy(pod_of(manifest)),
        }
    )
    assert policy.review(pod, resource="pods") == [
        "refused CREATE of pods (group '', version v1): the fedtune launcher may only create"
        " batch/v1 Jobs, and each one's URL Secret, in the namespace of tenant hospital-a"
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
    container_of(job)["image"] = "hospital-a.example/own-tool:1"
    pod_of(job)["volumes"].append({"name": "s", "secret": {"secretName": "hospital-a-db"}})
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
