"""The tenant admission policy, evaluated with a real CEL implementation.

The chart renders one ValidatingAdmissionPolicy per tenant. Its CEL expressions are evaluated
here (``cel-python``) the way the API server would: match conditions first, then variables in
order, then every validation. The launcher's real manifest, built from the rendered tenants
ConfigMap, must be admitted; each way of misusing the launcher's rights must be refused with
the policy's message.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import celpy
import pytest

from fedtune.config import parse_job
from fedtune.engines.launcher_manifest import build_job_manifest, load_deployment
from tests.charts.chart_helpers import NAMESPACE, Rendered
from tests.kfp.conftest import cluster_job_dict

LAUNCHER = f"system:serviceaccount:{NAMESPACE}:ft-fedtune-launcher"
TENANT = "hospital-a"


def _cel(value: Any) -> Any:
    return celpy.json_to_cel(value)


class Policy:
    """A rendered ValidatingAdmissionPolicy, evaluated like the API server does."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.env = celpy.Environment()
        spec = doc["spec"]
        self.match = [self._compile(m["expression"]) for m in spec.get("matchConditions", [])]
        self.variables = [(v["name"], self._compile(v["expression"])) for v in spec.get("variables", [])]
        self.validations = [(self._compile(v["expression"]), v["message"]) for v in spec["validations"]]

    def _compile(self, text: str) -> Any:
        return self.env.program(self.env.compile(text))

    def review(self, obj: dict[str, Any], *, user: str = LAUNCHER, resource: str = "jobs") -> list[str]:
        """The messages of the failed validations; [] means admitted (or not matched)."""
        group = "batch" if resource in ("jobs", "cronjobs") else ""
        request = {"userInfo": {"username": user}, "resource": {"group": group, "resource": resource}}
        activation: dict[str, Any] = {"object": _cel(obj), "request": _cel(request)}
        if not all(bool(m.evaluate(activation)) for m in self.match):
            return []
        variables: dict[str, Any] = {}
        for name, program in self.variables:
            activation["variables"] = celpy.celtypes.MapType(
                {celpy.celtypes.StringType(k): v for k, v in variables.items()}
            )
            variables[name] = program.evaluate(activation)
        activation["variables"] = celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in variables.items()}
        )
        failed = []
        for program, message in self.validations:
            result = program.evaluate(activation)
            if isinstance(result, Exception) or not bool(result):
                failed.append(message)
        return failed


@pytest.fixture(scope="module")
def rendered(rendered_scenarios: dict[str, Rendered]) -> Rendered:
    return rendered_scenarios["multi-tenant-gpu"]


@pytest.fixture(scope="module")
def policy(rendered: Rendered) -> Policy:
    (doc,) = [
        d
        for d in rendered.of_kind("ValidatingAdmissionPolicy")
        if d["metadata"]["name"].endswith(f"-{TENANT}-launcher-jobs")
    ]
    return Policy(doc)


@pytest.fixture(scope="module")
def launcher_manifest(rendered: Rendered, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The Job the real launcher builds for hospital-a from the chart's tenants ConfigMap."""
    (config_map,) = [c for c in rendered.of_kind("ConfigMap") if c["metadata"]["name"].endswith("-tenants")]
    tenants_file = tmp_path_factory.mktemp("cm") / "tenants.json"
    tenants_file.write_text(config_map["data"]["tenants.json"])
    raw = cluster_job_dict()
    raw["tenants"][0]["name"] = TENANT
    raw["tenants"][0]["namespace"] = "fedtune-hospital-a"
    job = parse_job(raw)
    deployment = load_deployment(job.tenants[0], str(tenants_file))
    urls = {"get": {"k": "https://x/get"}, "put": {"k": "https://x/put"}}
    return build_job_manifest(job, TENANT, "client", 1, deployment, urls, run_key="run")


def test_one_policy_and_binding_per_tenant_scoped_to_its_namespace(rendered: Rendered) -> None:
    policies = rendered.of_kind("ValidatingAdmissionPolicy")
    bindings = rendered.of_kind("ValidatingAdmissionPolicyBinding")
    assert len(policies) == len(bindings) == 3
    for binding in bindings:
        assert binding["spec"]["validationActions"] == ["Deny"]
        selected = binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]
        assert selected["kubernetes.io/metadata.name"].startswith("fedtune-") or selected
    names = {b["spec"]["policyName"] for b in bindings}
    assert names == {p["metadata"]["name"] for p in policies}


def test_the_launchers_real_manifest_is_admitted(policy: Policy, launcher_manifest: dict[str, Any]) -> None:
    assert "@sha256:" in launcher_manifest["spec"]["template"]["spec"]["containers"][0]["image"]
    assert policy.review(launcher_manifest) == []


def _pod(m: dict[str, Any]) -> dict[str, Any]:
    return m["spec"]["template"]["spec"]


def _container(m: dict[str, Any]) -> dict[str, Any]:
    return _pod(m)["containers"][0]


def _set(path: Callable[[dict[str, Any]], dict[str, Any]], **fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda m: path(m).update(fields)


REJECTED: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "another-image": (_set(_container, image="evil.example/miner@sha256:" + "0" * 64), "pinned fedtune image"),
    "tag-not-digest": (
        lambda m: _container(m).update(image=_container(m)["image"].split("@")[0] + ":0.1.0"),
        "pinned fedtune image",
    ),
    "other-entrypoint": (_set(_container, command=["sh", "-c", "cat /secrets/*"]), "entrypoint"),
    "other-secret-volume": (
        lambda m: _pod(m)["volumes"].append({"name": "s", "secret": {"secretName": "hospital-b-bucket"}}),
        "no Secret but",
    ),
    "other-secret-env": (
        lambda m: _container(m)["env"].append(
            {"name": "K", "valueFrom": {"secretKeyRef": {"name": "db-password", "key": "k"}}}
        ),
        "no Secret but",
    ),
    "other-secret-envfrom": (
        lambda m: _container(m)["envFrom"].append({"secretRef": {"name": "db-password"}}),
        "no Secret but",
    ),
    "privileged": (
        lambda m: _container(m)["securityContext"].update(privileged=True),
        "may not be privileged",
    ),
    "privilege-escalation": (
        lambda m: _container(m)["securityContext"].update(allowPrivilegeEscalation=True),
        "may not be privileged",
    ),
    "added-capability": (
        lambda m: _container(m)["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]}),
        "add capabilities",
    ),
    "root-user": (lambda m: _pod(m)["securityContext"].update(runAsUser=0), "non-root"),
    "host-path": (
        lambda m: _pod(m)["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "hostPath",
    ),
    "host-network": (_set(_pod, hostNetwork=True), "host's network"),
    "init-container": (
        lambda m: _pod(m).update(initContainers=[copy.deepcopy(_container(m))]),
        "exactly one container",
    ),
    "api-token": (_set(_pod, automountServiceAccountToken=True), "without a mounted API token"),
}


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_a_misused_launcher_right_is_refused(
    policy: Policy, launcher_manifest: dict[str, Any], case: str
) -> None:
    change, words = REJECTED[case]
    manifest = copy.deepcopy(launcher_manifest)
    change(manifest)
    failed = policy.review(manifest)
    assert failed, f"{case} was admitted"
    assert any(words in message for message in failed), failed


def test_the_launcher_may_create_no_bare_pod(policy: Policy, launcher_manifest: dict[str, Any]) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "spec": copy.deepcopy(_pod(launcher_manifest))}
    assert any("only batch/v1 Jobs" in m for m in policy.review(pod, resource="pods"))


def test_the_tenants_own_admins_are_not_restricted(policy: Policy, launcher_manifest: dict[str, Any]) -> None:
    manifest = copy.deepcopy(launcher_manifest)
    _container(manifest)["image"] = "hospital-a.example/own-tool:1"
    assert policy.review(manifest, user="alice@hospital-a.example") == []


def test_a_tenant_release_without_a_digest_is_refused(render: Any) -> None:
    result = render("multi-tenant-gpu", set_values=["image.gpuDigest="])
    assert result.returncode != 0 and "image.gpuDigest is empty" in result.stderr


def test_the_policy_can_be_switched_off(render: Any) -> None:
    result = render("multi-tenant-gpu", set_values=["tenantAdmission.enabled=false", "image.gpuDigest="])
    assert result.returncode == 0
    assert not result.of_kind("ValidatingAdmissionPolicy")
    tenants = json.loads(
        next(c for c in result.of_kind("ConfigMap") if c["metadata"]["name"].endswith("-tenants"))["data"][
            "tenants.json"
        ]
    )
    assert tenants["image"].endswith(":0.1.0")
