"""helm install, upgrade and uninstall of every values file into a real API server.

The release namespace enforces the "restricted" Pod Security Standard (every pod the chart
renders claims it) and the chart's tenant namespaces enforce ``tenantDefaults.podSecurity``;
a refusal fails the command and a Pod Security warning shows on helm's stderr, which must stay
empty. Hook Jobs and the test pod are created as server-side dry runs: running them needs the
object store and MLflow, which this control plane does not run (their scripts are tested
against moto in tests/charts/test_chart_scripts.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.chart_release import (
    CHART_DIR,
    PROVIDER_NS,
    RELEASE,
    RESTRICTED,
    SCENARIOS,
    dry_run_create,
    helm,
    installed,
    provider_namespace,
    uninstall,
    values_args,
    wait_gone,
)
from tests.cluster.conftest import Cluster, controlplane, wait_for

pytestmark = pytest.mark.cluster
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"


def _release_objects(cluster: Cluster) -> dict[str, list[str]]:
    """What of the release is left on the server, by kind (namespaces, namespaced, policies)."""
    from kubernetes import client

    apps = client.AppsV1Api(cluster.api)
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    admission = client.AdmissionregistrationV1Api(cluster.api)
    found = {
        "Namespace": cluster.core.list_namespace(label_selector=INSTANCE).items,
        "Deployment": apps.list_deployment_for_all_namespaces(label_selector=INSTANCE).items,
        "ConfigMap": cluster.core.list_config_map_for_all_namespaces(label_selector=INSTANCE).items,
        "Role": rbac.list_role_for_all_namespaces(label_selector=INSTANCE).items,
        "ServiceAccount": cluster.core.list_service_account_for_all_namespaces(
            label_selector=INSTANCE
        ).items,
        "ValidatingAdmissionPolicy": admission.list_validating_admission_policy(
            label_selector=INSTANCE
        ).items,
    }
    return {kind: sorted(o.metadata.name for o in items) for kind, items in found.items() if items}


def _pods_created(cluster: Cluster) -> dict[str, int]:
    """Pods that exist per Deployment (each was admitted under the namespace's Pod Security)."""
    from kubernetes import client

    apps = client.AppsV1Api(cluster.api)
    out = {}
    for deployment in apps.list_namespaced_deployment(PROVIDER_NS, label_selector=INSTANCE).items:
        selector = ",".join(f"{k}={v}" for k, v in deployment.spec.selector.match_labels.items())
        pods = cluster.core.list_namespaced_pod(PROVIDER_NS, label_selector=selector).items
        out[deployment.metadata.name] = len(pods)
    return out


def _refused_pods(cluster: Cluster) -> list[str]:
    """FailedCreate events of ReplicaSets: pods the API server refused to create."""
    events = cluster.core.list_namespaced_event(PROVIDER_NS).items
    return [e.message for e in events if e.reason == "FailedCreate"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_install_upgrade_uninstall_with_no_refusal_and_no_warning(
    cluster: Cluster, scenario: str
) -> None:
    with installed(cluster, scenario) as install:
        assert install.returncode == 0, install.stderr
        assert install.warnings() == []
        rendered = _rendered(cluster, scenario)
        # Every namespace the chart creates enforces the level the chart claims.
        level = rendered["values"].get("tenantDefaults", {}).get("podSecurity", "restricted")
        for namespace in rendered["namespaces"]:
            labels = cluster.core.read_namespace(namespace).metadata.labels
            assert labels["pod-security.kubernetes.io/enforce"] == level, namespace
        # Deployments' pods are admitted under "restricted" (the ReplicaSet creates them).
        replicas = rendered["replicas"]
        wait_for(
            lambda: _pods_created(cluster) == replicas or _refused_pods(cluster),
            f"the pods of {sorted(replicas)}",
        )
        assert _refused_pods(cluster) == []
        assert _pods_created(cluster) == replicas
        # Hooks and the test pod: admitted, no warning.
        hooks = helm(cluster, "get", "hooks", RELEASE, "--namespace", PROVIDER_NS)
        assert hooks.returncode == 0, hooks.stderr
        hook_docs = [d for d in yaml.safe_load_all(hooks.stdout) if d]
        assert hook_docs
        for doc in hook_docs:
            response = dry_run_create(cluster.api, doc, PROVIDER_NS)
            assert (response.status, response.warnings) == (201, []), response.body.get("message")

        upgrade = helm(
            cluster,
            "upgrade",
            RELEASE,
            str(CHART_DIR),
            "--namespace",
            PROVIDER_NS,
            "--no-hooks",
            *values_args(scenario),
            "--set-string",
            "commonLabels.fedtune\\.io/revision=2",
        )
        assert upgrade.returncode == 0, upgrade.stderr
        assert upgrade.warnings() == []
        labels = cluster.core.read_namespaced_service_account(
            f"{RELEASE}-fedtune-launcher", PROVIDER_NS
        ).metadata.labels
        assert labels["fedtune.io/revision"] == "2"

        removed = uninstall(cluster)
        assert removed.returncode == 0, removed.stderr
        assert removed.warnings() == []
        wait_gone(cluster, set(rendered["namespaces"]))
        assert _release_objects(cluster) == {}


def _rendered(cluster: Cluster, scenario: str) -> dict[str, Any]:
    """The installed release's manifest: its namespaces and Deployment replica counts."""
    manifest = helm(cluster, "get", "manifest", RELEASE, "--namespace", PROVIDER_NS)
    docs = [d for d in yaml.safe_load_all(manifest.stdout) if d]
    values = helm(cluster, "get", "values", RELEASE, "--all", "-o", "yaml", "-n", PROVIDER_NS)
    return {
        "namespaces": [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"],
        "replicas": {
            d["metadata"]["name"]: d["spec"].get("replicas", 1)
            for d in docs
            if d["kind"] == "Deployment"
        },
        "values": yaml.safe_load(values.stdout) or {},
    }


def test_helm_sees_the_real_server_version(cluster: Cluster, tmp_path: Path) -> None:
    """Chart.yaml's kubeVersion is checked against the server: one minor above it is refused."""
    provider_namespace(cluster)
    chart = tmp_path / "fedtune"
    shutil.copytree(CHART_DIR, chart)
    major, minor = (int(x) for x in controlplane.K8S_VERSION.split(".")[:2])
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["kubeVersion"] = f">={major}.{minor + 1}.0-0"
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    args = ["--namespace", PROVIDER_NS, "--dry-run=server", *values_args("minimal")]
    refused = helm(cluster, "install", RELEASE, str(chart), *args)
    assert refused.returncode != 0
    assert f"v{controlplane.K8S_VERSION}" in refused.stderr, refused.stderr
    accepted = helm(cluster, "install", RELEASE, str(CHART_DIR), *args)
    assert accepted.returncode == 0, accepted.stderr


def test_the_release_namespace_may_enforce_restricted(cluster: Cluster) -> None:
    """The namespace these tests install into really enforces it: a root pod is refused."""
    provider_namespace(cluster)
    labels = cluster.core.read_namespace(PROVIDER_NS).metadata.labels
    assert {k: labels[k] for k in RESTRICTED} == RESTRICTED
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "root"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    response = dry_run_create(cluster.api, pod, PROVIDER_NS)
    assert response.status == 403
    assert 'violates PodSecurity "restricted:latest"' in response.body["message"]


def test_helm_shows_the_servers_pod_security_warnings(cluster: Cluster, tmp_path: Path) -> None:
    """The channel the no-warning checks rely on: a pod below "restricted" warns on stderr."""
    namespace = cluster.create_namespace(
        "warn-only", labels={"pod-security.kubernetes.io/warn": "restricted"}
    )
    chart = tmp_path / "root-pod"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: root-pod\nversion: 0.1.0\n")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "root"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "root"}},
            "template": {
                "metadata": {"labels": {"app": "root"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }
    (chart / "templates" / "deployment.yaml").write_text(yaml.safe_dump(deployment))
    result = helm(cluster, "install", "root-pod", str(chart), "--namespace", namespace)
    try:
        assert result.returncode == 0, result.stderr
        # helm logs the text with its quotes escaped: match around them.
        assert any(
            "would violate PodSecurity" in w and "restricted:latest" in w for w in result.warnings()
        ), result.stderr
    finally:
        helm(cluster, "uninstall", "root-pod", "--namespace", namespace)
        cluster.core.delete_namespace(namespace)
