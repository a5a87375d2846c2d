"""The tenant admission policy, evaluated by the API server itself.

The chart is installed into the local control plane; the launcher's ServiceAccount (its own
token) sends the Jobs the real launcher builds (``launcher_manifest.build_job_manifest`` over
the tenants ConfigMap the API server holds) as server-side dry runs: each is admitted with no
warning. Each misuse the CEL tests list (``tests/charts/admission_cases.REJECTED``, the same
list) is refused with the policy's own message. The CEL tests check the expressions; these
check that the API server evaluates them as those tests assume.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedtune.engines.launcher_manifest import STEP_MODULES
from tests.cluster.chart_release import (  # puts tests/charts on sys.path
    LAUNCHER_SA,
    PROVIDER_NS,
    RELEASE,
    dry_run_create,
    installed,
    request,
)
from tests.cluster.conftest import Cluster, wait_for

# The CEL tests' own list of misuses and the launcher's manifests, not a copy.
cases = importlib.import_module("admission_cases")
NAMESPACES, REJECTED, TENANT = cases.NAMESPACES, cases.REJECTED, cases.TENANT
launcher_manifest, misused = cases.launcher_manifest, cases.misused
launcher_secret, misused_secret = cases.launcher_secret, cases.misused_secret

pytestmark = pytest.mark.cluster
POLICY = f"{RELEASE}-fedtune-{TENANT}-launcher-jobs"
PRIVILEGED_OFF = "securityContext.privileged: Forbidden: disallowed by cluster policy"


@pytest.fixture(scope="module")
def release(cluster: Cluster) -> Iterator[None]:
    with installed(cluster, cases.SCENARIO) as result:
        assert result.returncode == 0, result.stderr
        yield


@pytest.fixture(scope="module")
def tenants_file(cluster: Cluster, release: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The installed tenants ConfigMap, where launcher tasks have it mounted."""
    config_map = cluster.core.read_namespaced_config_map(f"{RELEASE}-fedtune-tenants", PROVIDER_NS)
    path = tmp_path_factory.mktemp("launcher") / "tenants.json"
    path.write_text(config_map.data["tenants.json"])
    return path


@pytest.fixture(scope="module")
def launcher(cluster: Cluster, tenants_file: Path) -> Any:
    """An API client holding a token of the launcher's ServiceAccount, as launcher tasks do.

    The API server loads a new ValidatingAdmissionPolicy asynchronously: for a few seconds
    after `helm install` it is not enforced yet (here about a second). Wait until every
    tenant's policy refuses a misuse before testing it.
    """
    api = cluster.client_as(PROVIDER_NS, LAUNCHER_SA)
    for tenant, namespace in NAMESPACES.items():
        job = misused(launcher_manifest(tenants_file, tenant), "another-image")

        def enforced(job: dict[str, Any] = job, namespace: str = namespace) -> bool:
            return dry_run_create(api, job, namespace).status == 403

        wait_for(enforced, f"the admission policy of {tenant} to be enforced", timeout_s=30)
    return api


def _refusal(response: Any) -> str:
    """The policy's message in a 403, or a description of what happened instead."""
    message = response.body.get("message", "")
    prefix = f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request: "
    if response.status != 403 or prefix not in message:
        return f"not refused by {POLICY}: HTTP {response.status}: {message}"
    return message.split(prefix, 1)[1]


@pytest.mark.parametrize("kind", sorted(STEP_MODULES))
@pytest.mark.parametrize("tenant", sorted(NAMESPACES))
def test_the_launchers_real_jobs_are_admitted_without_warnings(
    launcher: Any, tenants_file: Path, tenant: str, kind: str
) -> None:
    job = launcher_manifest(tenants_file, tenant, kind)  # type: ignore[arg-type]
    response = dry_run_create(launcher, job, NAMESPACES[tenant])
    assert response.status == 201, response.body.get("message")
    # The tenant namespace warns on "restricted": a Job template that breaks it would show here.
    assert response.warnings == []


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_each_misuse_is_refused_by_the_api_server_with_the_policys_message(
    launcher: Any, tenants_file: Path, case: str
) -> None:
    job = misused(launcher_manifest(tenants_file, TENANT), case)
    response = dry_run_create(launcher, job, NAMESPACES[TENANT])
    if PRIVILEGED_OFF in response.body.get("message", ""):
        pytest.skip(
            "this API server runs without --allow-privileged, so it refuses a privileged "
            "container as invalid before admission (clusters built by kubeadm allow it)"
        )
    refusal = _refusal(response)
    assert refusal.startswith(REJECTED[case][1]), refusal


def test_the_launchers_job_its_url_secret_and_its_resumption_are_admitted(
    cluster: Cluster, launcher: Any, tenants_file: Path
) -> None:
    """The launcher's three writes, as it makes them: the suspended Job, the Secret it owns
    (with the uid the API server gave the Job), the patch that resumes it (dry run: no pod)."""
    from kubernetes import client

    ns = NAMESPACES[TENANT]
    job = launcher_manifest(tenants_file, TENANT)
    batch = client.BatchV1Api(launcher)
    created = launcher.sanitize_for_serialization(batch.create_namespaced_job(ns, job))
    try:
        secret = launcher_secret(job, uid=created["metadata"]["uid"])
        response = dry_run_create(launcher, secret, ns)
        assert response.status == 201, response.body.get("message")
        resumed = batch.patch_namespaced_job(
            job["metadata"]["name"], ns, {"spec": {"suspend": False}}, dry_run="All"
        )
        assert resumed.spec.suspend is False
    finally:
        cluster.batch.delete_namespaced_job(job["metadata"]["name"], ns)


@pytest.mark.parametrize("case", sorted(cases.SECRET_REJECTED))
def test_each_secret_misuse_is_refused_by_the_api_server_with_the_policys_message(
    launcher: Any, tenants_file: Path, case: str
) -> None:
    secret, expected = misused_secret(launcher_manifest(tenants_file, TENANT), case)
    refusal = _refusal(dry_run_create(launcher, secret, NAMESPACES[TENANT]))
    assert refusal.startswith(expected), refusal


def test_another_tenants_job_is_refused_in_this_tenants_namespace(
    launcher: Any, tenants_file: Path
) -> None:
    job = launcher_manifest(tenants_file, "hospital-b")
    job["metadata"]["namespace"] = NAMESPACES[TENANT]
    refusal = _refusal(dry_run_create(launcher, job, NAMESPACES[TENANT]))
    assert refusal.startswith("refused "), refusal


def test_the_tenants_own_admins_are_not_restricted(cluster: Cluster, tenants_file: Path) -> None:
    """The policy binds the launcher only: the admin's request for the same misuse passes."""
    job = misused(launcher_manifest(tenants_file, TENANT), "another-image")
    response = dry_run_create(cluster.api, job, NAMESPACES[TENANT])
    assert response.status == 201, response.body.get("message")
    assert response.warnings == []


def test_the_tenant_namespace_warns_on_a_job_below_restricted(
    cluster: Cluster, tenants_file: Path
) -> None:
    """The warning channel the admitted-Job test relies on: a root Job shows its warning."""
    job = misused(launcher_manifest(tenants_file, TENANT), "container-root-user")
    response = dry_run_create(cluster.api, job, NAMESPACES[TENANT])
    assert response.status == 201, response.body.get("message")
    assert [w for w in response.warnings if 'would violate PodSecurity "restricted' in w]


@pytest.fixture
def widened(cluster: Cluster, release: None) -> Iterator[None]:
    """Someone widens the launcher's Role in the tenant namespace to pods, CronJobs, exec."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(cluster.api)
    ns = NAMESPACES[TENANT]
    rbac.create_namespaced_role(
        ns,
        {
            "metadata": {"name": "widened"},
            "rules": [
                {
                    "apiGroups": ["", "batch"],
                    "resources": ["pods", "pods/exec", "cronjobs", "configmaps"],
                    "verbs": ["create", "get"],
                }
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "widened"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "widened"},
            "subjects": [{"kind": "ServiceAccount", "name": LAUNCHER_SA, "namespace": PROVIDER_NS}],
        },
    )
    try:
        yield
    finally:
        rbac.delete_namespaced_role_binding("widened", ns)
        rbac.delete_namespaced_role("widened", ns)


def test_with_a_widened_role_the_policy_still_refuses_anything_but_jobs(
    launcher: Any, tenants_file: Path, widened: None
) -> None:
    job = launcher_manifest(tenants_file, TENANT)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": job["spec"]["template"]["spec"],
    }
    cron = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "c"},
        "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": job["spec"]}},
    }
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c"},
        "data": {"PYTHONPATH": "/x"},
    }
    ns = NAMESPACES[TENANT]
    refusals = {
        o["kind"]: _refusal(dry_run_create(launcher, o, ns)) for o in (pod, cron, config_map)
    }
    assert refusals == {
        "Pod": "refused CREATE of pods (group '', version v1): the fedtune launcher may only "
        f"create batch/v1 Jobs, and each one's URL Secret, in the namespace of tenant {TENANT}",
        "CronJob": "refused CREATE of cronjobs (group 'batch', version v1): the fedtune launcher "
        f"may only create batch/v1 Jobs, and each one's URL Secret, in the namespace of tenant "
        f"{TENANT}",
        "ConfigMap": "refused CREATE of configmaps (group '', version v1): the fedtune launcher "
        f"may only create batch/v1 Jobs, and each one's URL Secret, in the namespace of tenant "
        f"{TENANT}",
    }
    # exec is a CONNECT: the policy answers before the API server looks for the pod.
    exec_response = request(
        launcher,
        "POST",
        f"/api/v1/namespaces/{ns}/pods/any/exec",
        query=[("command", "sh"), ("stdout", "true")],
    )
    assert _refusal(exec_response).startswith("refused CONNECT of pods/exec"), exec_response
