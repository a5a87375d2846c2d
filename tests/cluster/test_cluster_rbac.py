"""The run's ServiceAccount, by SubjectAccessReview against the installed chart.

The chart's one run account (``<release>-fedtune-launcher``) must hold exactly:
- in the provider namespace, what KFP v2's driver and launcher and Argo's executor do as the
  run's account (``launcher_rbac.kfp_run_rules``; the sources are named there);
- in each tenant namespace, what the launcher does (``launcher_rbac.LAUNCHER_RULES``);
- nothing anywhere else, and nothing cluster-scoped.
"Exactly" is checked over every (resource, verb) the API server serves in its discovery
documents, namespaced ones in every namespace: whatever is allowed and not expected must be
allowed to a ServiceAccount with no binding at all (what every authenticated user may do).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fedtune.engines.launcher import KubernetesJobApi
from fedtune.engines.launcher_rbac import (
    KFP_ARTIFACT_SECRET,
    KFP_LAUNCHER_CONFIGMAP,
    LAUNCHER_RULES,
    kfp_run_rules,
)
from tests.cluster.chart_release import LAUNCHER_SA, PROVIDER_NS, RELEASE, installed, request
from tests.cluster.conftest import Cluster

pytestmark = pytest.mark.cluster

SCENARIO = "multi-tenant-gpu"
TENANT_NAMESPACES = ("fedtune-hospital-a", "fedtune-hospital-b", "clinic-c-federated")
OTHER_NAMESPACE = "default"
BASELINE_SA = "rbac-baseline"  # bound to nothing: what any ServiceAccount may do
Triple = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)

# Must be denied whatever else changes (a readable subset of "nothing beyond the rules").
MUST_DENY: dict[str, list[Triple]] = {
    "tenant": [
        # Secrets: it creates each Job's URL Secret, and may not read or change any.
        ("", "secrets", "get"),
        ("", "secrets", "list"),
        ("", "secrets", "watch"),
        ("", "secrets", "update"),
        ("", "secrets", "patch"),
        ("", "secrets", "delete"),
        ("", "pods/exec", "create"),
        ("", "pods/attach", "create"),
        ("", "pods/portforward", "create"),
        ("", "pods/log", "get"),
        ("", "pods", "create"),
        ("", "pods", "delete"),
        ("", "pods", "patch"),
        ("batch", "jobs", "update"),  # it resumes a Job by patch only
        ("batch", "jobs/status", "patch"),
        ("batch", "cronjobs", "create"),
        ("", "configmaps", "create"),
        ("", "serviceaccounts/token", "create"),
        ("rbac.authorization.k8s.io", "roles", "create"),
        ("rbac.authorization.k8s.io", "rolebindings", "create"),
        ("networking.k8s.io", "networkpolicies", "delete"),
        ("", "resourcequotas", "update"),
    ],
    "provider": [
        ("", "secrets", "get"),
        ("", "secrets", "list"),
        ("", "secrets", "watch"),
        ("", "pods/exec", "create"),
        ("", "pods/log", "get"),
        ("", "pods", "create"),
        ("", "pods", "delete"),
        ("", "pods", "patch"),  # would reach MinIO's pod (argoBeforeV34 is off)
        ("batch", "jobs", "create"),
        ("", "configmaps", "list"),
        ("", "serviceaccounts/token", "create"),
        ("argoproj.io", "workflows", "create"),
        ("argoproj.io", "workflowtaskresults", "delete"),
        ("apps", "deployments", "patch"),
    ],
    "cluster": [
        ("", "namespaces", "list"),
        ("", "namespaces", "delete"),
        ("", "nodes", "get"),
        ("", "persistentvolumes", "list"),
        ("rbac.authorization.k8s.io", "clusterroles", "create"),
        ("rbac.authorization.k8s.io", "clusterrolebindings", "create"),
        ("admissionregistration.k8s.io", "validatingadmissionpolicies", "delete"),
        ("admissionregistration.k8s.io", "validatingadmissionpolicybindings", "update"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "create"),
        ("certificates.k8s.io", "certificatesigningrequests", "create"),
    ],
}


def expand(rules: list[dict[str, list[str]]]) -> set[Triple]:
    """The (group, resource, verb) a rule list grants for any object name."""
    return {
        (g, r, v)
        for rule in rules
        if not rule.get("resourceNames")
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def subject(service_account: str) -> dict[str, Any]:
    """User and groups a token of the provider namespace's ServiceAccount authenticates as."""
    return {
        "user": f"system:serviceaccount:{PROVIDER_NS}:{service_account}",
        "groups": [
            "system:serviceaccounts",
            f"system:serviceaccounts:{PROVIDER_NS}",
            "system:authenticated",
        ],
    }


class Reviewer:
    """Creates SubjectAccessReviews through the API (as the cluster admin)."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.count = 0

    def allowed(
        self, service_account: str, triple: Triple, namespace: str = "", name: str = ""
    ) -> bool:
        group, resource, verb = triple
        resource, _, sub = resource.partition("/")
        attributes = {"group": group, "resource": resource, "subresource": sub, "verb": verb}
        if namespace:
            attributes["namespace"] = namespace
        if name:
            attributes["name"] = name
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {**subject(service_account), "resourceAttributes": attributes},
        }
        response = request(
            self.api, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body
        )
        assert response.status == 201, response.body
        self.count += 1
        return bool(response.body["status"].get("allowed"))


def served(api: Any) -> dict[bool, set[Triple]]:
    """Every (group, resource, verb) in the API server's discovery, by ``namespaced``."""
    documents = [("", request(api, "GET", "/api/v1").body)]
    for group in request(api, "GET", "/apis").body["groups"]:
        version = group["preferredVersion"]["groupVersion"]
        documents.append((group["name"], request(api, "GET", f"/apis/{version}").body))
    out: dict[bool, set[Triple]] = {True: set(), False: set()}
    for group, document in documents:
        for resource in document["resources"]:
            for verb in resource.get("verbs") or []:
                out[resource["namespaced"]].add((group, resource["name"], verb))
    return out


@pytest.fixture(scope="module")
def reviewer(cluster: Cluster) -> Iterator[Reviewer]:
    with installed(cluster, SCENARIO) as result:
        assert result.returncode == 0, result.stderr
        cluster.core.create_namespaced_service_account(
            PROVIDER_NS, {"metadata": {"name": BASELINE_SA}}
        )
        try:
            yield Reviewer(cluster.api)
        finally:
            cluster.core.delete_namespaced_service_account(BASELINE_SA, PROVIDER_NS)


@pytest.fixture(scope="module")
def universe(cluster: Cluster) -> dict[bool, set[Triple]]:
    return served(cluster.api)


def _beyond(
    reviewer: Reviewer, universe: set[Triple], expected: set[Triple], namespace: str = ""
) -> tuple[set[Triple], set[Triple]]:
    """(expected but denied, allowed but neither expected nor allowed to the baseline)."""
    granted = {t for t in universe | expected if reviewer.allowed(LAUNCHER_SA, t, namespace)}
    extra = {t for t in granted - expected if not reviewer.allowed(BASELINE_SA, t, namespace)}
    return expected - granted, extra


EXPECTED = {
    PROVIDER_NS: expand(kfp_run_rules()),
    **{ns: expand(LAUNCHER_RULES) for ns in TENANT_NAMESPACES},
    OTHER_NAMESPACE: set(),
}


@pytest.mark.parametrize("namespace", sorted(EXPECTED))
def test_the_run_account_has_exactly_its_rules_in_each_namespace(
    reviewer: Reviewer, universe: dict[bool, set[Triple]], namespace: str
) -> None:
    missing, extra = _beyond(reviewer, universe[True], EXPECTED[namespace], namespace)
    assert (missing, extra) == (set(), set())


def test_the_run_account_has_nothing_cluster_scoped(
    reviewer: Reviewer, universe: dict[bool, set[Triple]]
) -> None:
    assert _beyond(reviewer, universe[False], set()) == (set(), set())


@pytest.mark.parametrize("scope", sorted(MUST_DENY))
def test_the_must_deny_list_is_denied(reviewer: Reviewer, scope: str) -> None:
    namespaces = {"tenant": TENANT_NAMESPACES, "provider": (PROVIDER_NS,), "cluster": ("",)}
    allowed = [
        (ns, t)
        for ns in namespaces[scope]
        for t in MUST_DENY[scope]
        if reviewer.allowed(LAUNCHER_SA, t, ns)
    ]
    assert allowed == []


def test_kfp_reads_its_settings_and_artifact_secret_by_name_only(reviewer: Reviewer) -> None:
    def get(resource: str, name: str) -> bool:
        return reviewer.allowed(LAUNCHER_SA, ("", resource, "get"), PROVIDER_NS, name)

    assert get("configmaps", KFP_LAUNCHER_CONFIGMAP)
    assert get("secrets", KFP_ARTIFACT_SECRET)
    # ... and only read them.
    named = [("configmaps", KFP_LAUNCHER_CONFIGMAP), ("secrets", KFP_ARTIFACT_SECRET)]
    changes = [
        (resource, name, verb)
        for resource, name in named
        for verb in ("update", "patch", "delete", "watch")
        if reviewer.allowed(LAUNCHER_SA, ("", resource, verb), PROVIDER_NS, name)
    ]
    assert changes == []
    # The chart's own Secrets and tenants file reach tasks through the kubelet, never the API.
    for resource, name in [
        ("secrets", "fedtune-s3"),
        ("secrets", "fedtune-presigner"),
        ("configmaps", f"{RELEASE}-fedtune-tenants"),
    ]:
        assert not get(resource, name), (resource, name)
    for ns in TENANT_NAMESPACES:
        assert not reviewer.allowed(LAUNCHER_SA, ("", "secrets", "get"), ns, "hospital-a-bucket")


def test_every_call_the_launcher_makes_is_allowed_in_every_tenant_namespace(
    reviewer: Reviewer,
) -> None:
    denied = [
        (ns, permission)
        for ns in TENANT_NAMESPACES
        for permission in KubernetesJobApi.PERMISSIONS.values()
        if not reviewer.allowed(LAUNCHER_SA, permission, ns)
    ]
    assert denied == []


def test_the_namespace_default_account_cannot_run_fedtune(reviewer: Reviewer) -> None:
    """Why the UI must name the run account: ``default`` may not start a tenant Job."""
    denied = not reviewer.allowed("default", ("batch", "jobs", "create"), TENANT_NAMESPACES[0])
    assert denied
