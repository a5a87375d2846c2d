"""Security and isolation policies, checked on the rendered manifests of every scenario."""

from __future__ import annotations

from typing import Any

import pytest
from chart_helpers import NAMESPACE, SCENARIOS, VALUES_DIR, Rendered, load_yaml, pod_specs

from fedtune.engines.launcher_rbac import LAUNCHER_RULES, kfp_run_rules

LAUNCHER_SA = "ft-fedtune-launcher"

# Containers allowed a writable root filesystem, with the reason. Everything else is read-only.
WRITABLE_ROOT_EXCEPTIONS = {
    ("InferenceService", "kserve-container"): (
        "KServe's Hugging Face / vLLM server writes its model cache and compiled kernels under "
        "its home directory, and KServe owns the container's layout"
    ),
}


def tenants_of(scenario: str) -> list[dict[str, Any]]:
    """The tenant entries of a scenario's values file, namespaces filled in."""
    tenants = load_yaml(VALUES_DIR / f"{scenario}.yaml").get("tenants", [])
    return [{**t, "namespace": t.get("namespace") or f"fedtune-{t['name']}"} for t in tenants]


def in_namespace(docs: list[dict[str, Any]], kind: str, namespace: str) -> list[dict[str, Any]]:
    """Objects of one kind in one namespace."""
    return [d for d in docs if d["kind"] == kind and d["metadata"].get("namespace") == namespace]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_tenant_namespace_is_fenced(
    rendered_scenarios: dict[str, Rendered], scenario: str
) -> None:
    docs = rendered_scenarios[scenario].docs
    tenants = tenants_of(scenario)
    assert sorted(
        d["metadata"]["name"] for d in rendered_scenarios[scenario].of_kind("Namespace")
    ) == sorted(t["namespace"] for t in tenants)
    for tenant in tenants:
        ns = tenant["namespace"]
        policies = in_namespace(docs, "NetworkPolicy", ns)
        deny = [
            p
            for p in policies
            if p["spec"]["podSelector"] == {}
            and sorted(p["spec"]["policyTypes"]) == ["Egress", "Ingress"]
            and not p["spec"].get("ingress")
            and not p["spec"].get("egress")
        ]
        assert len(deny) == 1, f"{ns}: no default-deny NetworkPolicy"
        # No policy in a tenant namespace lets anything in.
        assert not any(p["spec"].get("ingress") for p in policies)
        (quota,) = in_namespace(docs, "ResourceQuota", ns)
        hard = quota["spec"]["hard"]
        assert hard["requests.nvidia.com/gpu"] == str(tenant["quota"]["gpu"])
        assert hard["limits.cpu"] == str(tenant["quota"]["cpu"])
        assert hard["requests.memory"] == tenant["quota"]["memory"]
        assert len(in_namespace(docs, "LimitRange", ns)) == 1
        (namespace,) = [
            d
            for d in rendered_scenarios[scenario].of_kind("Namespace")
            if d["metadata"]["name"] == ns
        ]
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_tenant_egress_allows_only_dns_exchange_and_own_bucket(
    rendered_scenarios: dict[str, Rendered], scenario: str
) -> None:
    docs = rendered_scenarios[scenario].docs
    values = load_yaml(VALUES_DIR / f"{scenario}.yaml")
    external = values["objectStore"].get("mode") == "external"
    for tenant in tenants_of(scenario):
        (allow,) = [
            p
            for p in in_namespace(docs, "NetworkPolicy", tenant["namespace"])
            if p["spec"].get("egress")
        ]
        rules = allow["spec"]["egress"]
        assert all(rule.get("to") and rule.get("ports") for rule in rules), "an open egress rule"
        dns, exchange, bucket = rules
        assert dns["to"][0]["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": "kube-system"
        }
        assert dns["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
        assert sorted((p["protocol"], p["port"]) for p in dns["ports"]) == [
            ("TCP", 53),
            ("UDP", 53),
        ]
        if external:
            assert [t["ipBlock"]["cidr"] for t in exchange["to"]] == values["objectStore"][
                "external"
            ]["cidrs"]
        else:
            (peer,) = exchange["to"]
            assert peer["namespaceSelector"]["matchLabels"] == {
                "kubernetes.io/metadata.name": NAMESPACE
            }
            assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "minio"
        assert [t["ipBlock"]["cidr"] for t in bucket["to"]] == tenant["bucketCIDRs"]
        assert bucket["ports"] == [{"protocol": "TCP", "port": tenant.get("bucketPort", 443)}]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_launcher_rbac_is_namespaced_and_exactly_the_launcher_rules(
    rendered_scenarios: dict[str, Rendered], scenario: str
) -> None:
    rendered = rendered_scenarios[scenario]
    assert not rendered.of_kind("ClusterRole")
    assert not rendered.of_kind("ClusterRoleBinding")
    tenants = tenants_of(scenario)
    # The provider namespace holds one Role: what KFP v2 and Argo do as the run's account.
    (run_role,) = in_namespace(rendered.docs, "Role", NAMESPACE)
    assert run_role["rules"] == kfp_run_rules()
    (run_binding,) = in_namespace(rendered.docs, "RoleBinding", NAMESPACE)
    assert run_binding["roleRef"]["name"] == run_role["metadata"]["name"]
    assert run_binding["subjects"] == [
        {"kind": "ServiceAccount", "name": LAUNCHER_SA, "namespace": NAMESPACE}
    ]
    roles = [r for r in rendered.of_kind("Role") if r is not run_role]
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(
        t["namespace"] for t in tenants
    )
    for role in roles:
        assert role["rules"] == LAUNCHER_RULES, role["metadata"]["namespace"]
    bindings = [b for b in rendered.of_kind("RoleBinding") if b is not run_binding]
    assert len(bindings) == len(tenants)
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "ft-fedtune-launcher",
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": LAUNCHER_SA, "namespace": NAMESPACE}
        ]
    (launcher,) = [
        sa for sa in rendered.of_kind("ServiceAccount") if sa["metadata"]["name"] == LAUNCHER_SA
    ]
    assert launcher["metadata"]["namespace"] == NAMESPACE


def test_launcher_rules_grant_nothing_beyond_jobs_pod_reads_and_creating_secrets() -> None:
    granted = {
        (g, r, v)
        for rule in LAUNCHER_RULES
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert not any("*" in (g, r, v) for g, r, v in granted)
    # Secrets: only create (each Job's URL Secret); it never reads or changes one.
    assert {v for _, r, v in granted if r == "secrets"} == {"create"}
    assert ("batch", "jobs", "create") in granted
    assert not any(r == "pods/log" for _, r, _ in granted)  # pod logs stay the tenant's
    assert not any(
        r.startswith("pods") and v in ("create", "delete", "update", "patch") for _, r, v in granted
    )


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pods_run_non_root_read_only_with_limits(
    rendered_scenarios: dict[str, Rendered], scenario: str
) -> None:
    problems = []
    for doc in rendered_scenarios[scenario].docs:
        for where, spec in pod_specs(doc):
            pod_sc = spec.get("securityContext", {})
            if pod_sc.get("runAsNonRoot") is not True:
                problems.append(f"{where}: pod runAsNonRoot is not true")
            if pod_sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
                problems.append(f"{where}: pod seccompProfile is not RuntimeDefault")
            if (
                doc["kind"] != "InferenceService"
                and spec.get("automountServiceAccountToken") is not False
            ):
                problems.append(f"{where}: mounts a Kubernetes API token it does not need")
            tmp_volumes = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
            for c in spec.get("initContainers", []) + spec["containers"]:
                name = f"{where}/{c['name']}"
                sc = c.get("securityContext", {})
                uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
                if not (isinstance(uid, int) and uid > 0):
                    problems.append(f"{name}: runAsUser {uid!r} is not a non-zero uid")
                if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
                    problems.append(f"{name}: runAsNonRoot is not true")
                if sc.get("allowPrivilegeEscalation") is not False:
                    problems.append(f"{name}: allowPrivilegeEscalation is not false")
                if sc.get("privileged", False):
                    problems.append(f"{name}: privileged")
                if sc.get("capabilities", {}).get("drop") != ["ALL"]:
                    problems.append(f"{name}: capabilities are not dropped")
                if (
                    sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
                    != "RuntimeDefault"
                ):
                    problems.append(f"{name}: seccompProfile is not RuntimeDefault")
                limits = c.get("resources", {}).get("limits", {})
                if not {"cpu", "memory"} <= set(limits):
                    problems.append(f"{name}: resources.limits lacks cpu or memory: {limits}")
                if (doc["kind"], c["name"]) in WRITABLE_ROOT_EXCEPTIONS:
                    continue
                if sc.get("readOnlyRootFilesystem") is not True:
                    problems.append(f"{name}: root filesystem is writable")
                tmp_mounts = [
                    m
                    for m in c.get("volumeMounts", [])
                    if m["mountPath"] == "/tmp" and m["name"] in tmp_volumes
                ]
                if not tmp_mounts:
                    problems.append(f"{name}: read-only root but no emptyDir at /tmp")
    assert not problems, "\n".join(problems)


def test_writable_root_exceptions_are_still_in_use(rendered_scenarios: dict[str, Rendered]) -> None:
    """An exception that no longer matches anything must be removed from the list."""
    seen = {
        (doc["kind"], c["name"])
        for r in rendered_scenarios.values()
        for doc in r.docs
        for _, spec in pod_specs(doc)
        for c in spec["containers"]
    }
    assert set(WRITABLE_ROOT_EXCEPTIONS) <= seen


def test_mlflow_server_flags(rendered_scenarios: dict[str, Rendered]) -> None:
    (minimal,) = [
        d
        for d in rendered_scenarios["minimal"].of_kind("Deployment")
        if d["metadata"]["name"] == "ft-fedtune-mlflow"
    ]
    container = minimal["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert container["command"] == ["mlflow"] and args[0] == "server"
    assert "--artifacts-destination=s3://fedtune-mlflow/artifacts" in args
    assert "--serve-artifacts" in args
    assert not any(a.startswith("--app-name") for a in args)
    (hosts,) = [a.split("=", 1)[1].split(",") for a in args if a.startswith("--allowed-hosts=")]
    for name in (
        "ft-fedtune-mlflow",
        "ft-fedtune-mlflow.fedtune",
        "ft-fedtune-mlflow.fedtune.svc.cluster.local",
    ):
        assert name in hosts and f"{name}:5000" in hosts
    env = {e["name"]: e for e in container["env"]}
    assert env["MLFLOW_BACKEND_STORE_URI"]["value"] == "sqlite:////data/mlflow.db"
    assert (
        env["MLFLOW_S3_ENDPOINT_URL"]["value"]
        == "http://ft-fedtune-minio.fedtune.svc.cluster.local:9000"
    )

    (auth,) = rendered_scenarios["external-s3-auth-serving"].of_kind("Deployment")
    container = auth["spec"]["template"]["spec"]["containers"][0]
    assert "--app-name=basic-auth" in container["args"]
    assert "mlflow.acme.example" in next(
        a for a in container["args"] if a.startswith("--allowed-hosts=")
    )
    env = {e["name"]: e for e in container["env"]}
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "mlflow-auth",
        "key": "admin-password",
    }
    assert env["MLFLOW_FLASK_SERVER_SECRET_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "mlflow-auth",
        "key": "flask-secret-key",
    }
    assert env["MLFLOW_BACKEND_STORE_URI"]["valueFrom"]["secretKeyRef"]["name"] == "mlflow-postgres"
    assert env["MLFLOW_S3_ENDPOINT_URL"]["value"] == "https://s3.eu-west-1.amazonaws.com"


def test_serving_renders_vllm_lora_arguments(rendered_scenarios: dict[str, Rendered]) -> None:
    (isvc,) = rendered_scenarios["external-s3-auth-serving"].of_kind("InferenceService")
    assert isvc["metadata"]["namespace"] == "fedtune-serving"
    model = isvc["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "huggingface"}
    assert model["storageUri"] == "s3://acme-fedtune-mlflow/artifacts/1/models/m-0123/artifacts"
    assert model["args"] == [
        "--model_name=fedtune-llama",
        "--enable-lora",
        "--lora-modules",
        "fedavg-round10=/mnt/models/adapter",
    ]
    # The serving namespace may fetch from MinIO only when MinIO is in use; here S3 is external.
    assert not [
        p
        for p in rendered_scenarios["external-s3-auth-serving"].of_kind("NetworkPolicy")
        if p["metadata"]["name"].endswith("-minio")
    ]


def test_minio_admits_the_tenant_namespaces_only(rendered_scenarios: dict[str, Rendered]) -> None:
    rendered = rendered_scenarios["multi-tenant-gpu"]
    (policy,) = [
        p for p in rendered.of_kind("NetworkPolicy") if p["metadata"]["name"] == "ft-fedtune-minio"
    ]
    peers = policy["spec"]["ingress"][0]["from"]
    assert peers[0] == {"podSelector": {}}
    assert sorted(
        p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in peers[1:]
    ) == sorted(t["namespace"] for t in tenants_of("multi-tenant-gpu"))


def test_tenant_service_accounts_mount_no_token(rendered_scenarios: dict[str, Rendered]) -> None:
    for tenant in tenants_of("multi-tenant-gpu"):
        (sa,) = in_namespace(
            rendered_scenarios["multi-tenant-gpu"].docs, "ServiceAccount", tenant["namespace"]
        )
        assert sa["automountServiceAccountToken"] is False
        assert (
            sa["metadata"]["annotations"]["fedtune.io/bucket-secret-name"]
            == tenant["bucketSecretName"]
        )
