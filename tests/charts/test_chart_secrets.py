"""No credential ever passes through the chart: only Secret names, used as references."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chart_helpers import SCENARIOS, VALUES_DIR, Rendered, Renderer, pod_specs

# Environment variables that carry credentials: they may only come from Secrets.
CREDENTIAL_ENV = {
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "MINIO_ROOT_USER",
    "MINIO_ROOT_PASSWORD",
    "MLFLOW_AUTH_ADMIN_PASSWORD",
    "MLFLOW_FLASK_SERVER_SECRET_KEY",
    "MLFLOW_AUTH_DATABASE_URI",
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_no_secret_objects_and_credentials_only_from_secret_refs(
    rendered_scenarios: dict[str, Rendered], scenario: str
) -> None:
    rendered = rendered_scenarios[scenario]
    assert not rendered.of_kind("Secret")
    for doc in rendered.docs:
        for where, spec in pod_specs(doc):
            for c in spec.get("initContainers", []) + spec["containers"]:
                for env in c.get("env", []):
                    if env["name"] in CREDENTIAL_ENV or (
                        env["name"] == "MLFLOW_BACKEND_STORE_URI"
                        and not env.get("value", "").startswith("sqlite:")
                    ):
                        assert "value" not in env, f"{where}: {env['name']} given as plain value"
                        assert "secretKeyRef" in env["valueFrom"], f"{where}: {env['name']}"
                assert not any(
                    "password" in a.lower() or "secret" in a.lower() for a in c.get("args", [])
                ), f"{where}: credential-like argument"


SENTINEL = "sentinel-0xdeadbeef-do-not-render"

# Keys a user might reach for to hand the chart a credential directly. The strict schema has
# none of them, so each must fail before anything is rendered.
CREDENTIAL_KEYS = [
    "objectStore.secretAccessKey",
    "objectStore.minio.rootPassword",
    "mlflow.auth.adminPassword",
    "mlflow.auth.flaskSecretKey",
    "mlflow.backend.postgresql.uri",
    "tenants[0].bucketSecretKey",
]


@pytest.mark.parametrize("key", CREDENTIAL_KEYS)
def test_credential_values_cannot_be_given_to_the_chart(render: Renderer, key: str) -> None:
    result = render("multi-tenant-gpu", set_values=[f"{key}={SENTINEL}"])
    assert result.returncode != 0
    assert SENTINEL not in result.stdout
    assert "not allowed" in result.stderr


def test_secret_names_are_only_ever_references(render: Renderer) -> None:
    """Sentinel Secret names appear only where a Secret is referenced, never as data."""
    names = {
        "objectStore.existingSecret": "sentinel-s3",
        "mlflow.backend.postgresql.existingSecret": "sentinel-pg",
        "mlflow.auth.existingSecret": "sentinel-auth",
        "tenants[0].bucketSecretName": "sentinel-bucket-a",
    }
    result = render("external-s3-auth-serving", set_values=[f"{k}={v}" for k, v in names.items()])
    assert result.returncode == 0, result.stderr
    assert not result.of_kind("Secret")
    found: dict[str, list[str]] = {v: [] for v in names.values()}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for item in node:
                walk(item, f"{path}[]")
        elif isinstance(node, str):
            for sentinel, paths in found.items():
                if sentinel in node:
                    paths.append(path)

    for doc in result.docs:
        walk(doc, doc["kind"])
    allowed_suffixes = (
        ".secretKeyRef.name",
        ".annotations.fedtune.io/bucket-secret-name",
        ".data.tenants.json",
        # The tenant's admission policy names the one Secret a launched Job may read.
        "ValidatingAdmissionPolicy.spec.variables[].expression",
        "ValidatingAdmissionPolicy.spec.validations[].expression",
        "ValidatingAdmissionPolicy.spec.validations[].messageExpression",
        "ValidatingAdmissionPolicy.spec.validations[].message",
    )
    for sentinel, paths in found.items():
        assert paths, f"{sentinel} is not referenced at all"
        assert all(p.endswith(allowed_suffixes) for p in paths), (sentinel, paths)
    (tenants_cm,) = [
        c for c in result.of_kind("ConfigMap") if c["metadata"]["name"].endswith("-tenants")
    ]
    entry = json.loads(tenants_cm["data"]["tenants.json"])["tenants"][0]
    assert entry["bucketSecretName"] == "sentinel-bucket-a"


def test_values_files_hold_no_credentials() -> None:
    """The shipped values files (chart defaults and test scenarios) only name Secrets."""
    chart_values = Path(__file__).resolve().parents[2] / "charts" / "fedtune" / "values.yaml"
    for path in [chart_values, *VALUES_DIR.glob("*.yaml")]:
        text = path.read_text().lower()
        for word in ("password:", "secretaccesskey:", "accesskeyid:", "token:"):
            assert word not in text, f"{path.name} holds {word}"
