"""What the chart installs for a tenant, made by hand on the test control plane, and the
provider's KFP task "pod" (in-cluster variables, the launcher ServiceAccount's token)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedtune.engines.launcher_rbac import LAUNCHER_RULES
from tests.cluster.conftest import Cluster

PROVIDER_NS = "fedtune-provider"
LAUNCHER_SA = "fedtune-launcher"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


def tenant_secret(namespace: str) -> dict[str, str]:
    """A tenant's own bucket credentials (never the provider's)."""
    return {"access-key-id": f"{namespace}-key", "secret-access-key": f"{namespace}-secret"}


def install_launcher(cluster: Cluster) -> None:
    """The provider namespace and the run's ServiceAccount (once per session)."""
    existing = cluster.core.list_namespace(field_selector=f"metadata.name={PROVIDER_NS}").items
    if not existing:
        cluster.create_namespace(PROVIDER_NS)
        cluster.core.create_namespaced_service_account(
            PROVIDER_NS, {"metadata": {"name": LAUNCHER_SA}}
        )


def install_tenant(
    cluster: Cluster, namespace: str, *, secret: bool = True, role: bool = True
) -> str:
    """A tenant namespace enforcing Pod Security "restricted", with its bucket Secret and the
    launcher's Role (LAUNCHER_RULES) bound to the run's ServiceAccount."""
    from kubernetes import client

    install_launcher(cluster)
    cluster.create_namespace(namespace, RESTRICTED)
    if secret:
        cluster.core.create_namespaced_secret(namespace, {
            "metadata": {"name": f"{namespace}-bucket"}, "stringData": tenant_secret(namespace)})
    if role:
        rbac = client.RbacAuthorizationV1Api(cluster.api)
        rbac.create_namespaced_role(
            namespace, {"metadata": {"name": "fedtune-launcher"}, "rules": LAUNCHER_RULES}
        )
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": "fedtune-launcher"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "fedtune-launcher"},
            "subjects": [{"kind": "ServiceAccount", "name": LAUNCHER_SA,
                          "namespace": PROVIDER_NS}],
        })
    return namespace


def inside_a_kfp_task(
    monkeypatch: pytest.MonkeyPatch,
    cluster: Cluster,
    folder: Path,
    tenants: dict[str, str],
    launcher: dict[str, Any] | None = None,
    extra: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """Make this process a KFP task pod run as the launcher ServiceAccount: the in-cluster
    variables, the account's token and the cluster CA where the client reads them, and the
    tenants file the chart mounts (``tenants``: tenant name -> namespace; ``extra``: more
    fields of a tenant's entry; ``launcher``: the Job limits). Returns that file."""
    from kubernetes.config import incluster_config

    token = folder / "token"
    token.write_text(cluster.token(PROVIDER_NS, LAUNCHER_SA))
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", cluster.plane.ca_file)
    host, port = cluster.host_port
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(port))
    path = folder / "tenants.json"
    path.write_text(json.dumps({
        "tenants": [{"name": t, "namespace": ns, "bucketSecretName": f"{ns}-bucket",
                     **(extra or {}).get(t, {})} for t, ns in tenants.items()],
        "launcher": launcher or {},
    }))
    monkeypatch.setenv("FEDTUNE_TENANTS_FILE", str(path))
    return path
