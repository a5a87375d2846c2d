"""Wrong values fail `helm template` with messages that say what is wrong and how to fix it."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from chart_helpers import CHART_DIR, VALUES_DIR, Renderer, load_yaml

INVALID_DIR = VALUES_DIR / "invalid"


def test_schema_rejects_a_typo_naming_the_key(render: Renderer) -> None:
    result = render(INVALID_DIR / "typo.yaml")
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert "at '/objectStore': additional properties 'existingSecrte' not allowed" in result.stderr


@pytest.mark.parametrize(
    ("set_value", "expected"),
    [
        pytest.param(
            "tenants[0].gpus=2", "additional properties 'gpus' not allowed", id="tenant-typo"
        ),
        pytest.param(
            "mlflow.auth.enable=true",
            "additional properties 'enable' not allowed",
            id="nested-typo",
        ),
        pytest.param("security.runAsUser=0", "/security/runAsUser", id="root-uid"),
        pytest.param("tenants[0].name=Hospital_A", "/tenants/0/name", id="not-dns-1123"),
        pytest.param("objectStore.mode=s3", "/objectStore/mode", id="unknown-mode"),
        pytest.param("tenants[0].bucketCIDRs=null", "/tenants/0", id="tenant-without-cidrs"),
        pytest.param("image.cpuDigest=latest", "/image/cpuDigest", id="cpu-digest-not-sha256"),
    ],
)
def test_schema_rejects_bad_values(render: Renderer, set_value: str, expected: str) -> None:
    result = render("multi-tenant-gpu", set_values=[set_value])
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr


def test_defaults_alone_fail_because_there_is_no_default_password(render: Renderer) -> None:
    result = render()
    assert result.returncode != 0
    assert "1 problem(s)" in result.stderr
    assert "objectStore.existingSecret is empty" in result.stderr
    assert "Fix: create a Secret" in result.stderr


def test_cross_field_problems_are_all_listed_in_one_failure(render: Renderer) -> None:
    result = render(INVALID_DIR / "cross-field.yaml")
    assert result.returncode != 0
    expected = [
        "objectStore.existingSecret is empty",
        "objectStore.external.cidrs is empty",
        'objectStore.exchangeBucket and objectStore.artifactsBucket are both "same-bucket"',
        "image.gpuDigest is empty while tenantAdmission.enabled=true",
        "mlflow.replicas is 3 but mlflow.backend.type=sqlite",
        "mlflow.auth.enabled=true but mlflow.auth.existingSecret is empty",
        "tenants[0] (dup) has quota.gpu=1 but neither nodeSelector nor tolerations",
        'tenants[1].name "dup" is used twice',
        'tenants[1] (dup) namespace "fedtune" is the provider\'s (release) namespace',
        "serving.enabled=true but serving.storageUri is empty",
        'serving.lora.enabled=true with serving.architecture="gpt2"',
        "serving.lora.enabled=true but serving.lora.modules is empty",
    ]
    stderr = result.stderr
    assert f"fedtune: {len(expected)} problem(s) in the values:" in stderr
    for number, text in enumerate(expected, start=1):
        line = next((ln for ln in stderr.splitlines() if ln.strip().startswith(f"{number}. ")), "")
        assert text in line, f"problem {number} should be {text!r}, got {line!r}"
        assert "Fix:" in line, f"problem {number} has no fix: {line!r}"
    # One failure, not one per problem.
    assert stderr.count("problem(s) in the values") == 1


def test_duplicate_tenant_namespaces_and_system_namespaces_are_rejected(render: Renderer) -> None:
    result = render(
        "multi-tenant-gpu",
        set_values=["tenants[1].namespace=fedtune-hospital-a", "tenants[2].namespace=kube-system"],
    )
    assert result.returncode != 0
    assert 'uses namespace "fedtune-hospital-a", already used by tenant hospital-a' in result.stderr
    assert 'namespace "kube-system" is a system namespace' in result.stderr
    assert "2 problem(s)" in result.stderr


def test_fixing_the_listed_problems_renders(render: Renderer) -> None:
    fixes = [
        "objectStore.mode=minio",
        "objectStore.existingSecret=fedtune-s3",
        "objectStore.artifactsBucket=other-bucket",
        "mlflow.replicas=1",
        "mlflow.auth.existingSecret=mlflow-auth",
        "tenants[0].nodeSelector.gpu=yes",
        "tenants[1].name=dup2",
        "tenants[1].namespace=dup2",
        "serving.storageUri=s3://b/m",
        "serving.architecture=llama",
        "serving.lora.modules[0].name=a",
        "serving.lora.modules[0].path=/mnt/models/a",
        "image.gpuDigest=sha256:" + "a" * 64,
    ]
    result = render(INVALID_DIR / "cross-field.yaml", set_values=fixes)
    assert result.returncode == 0, result.stderr


def _walk_schema(node: Any, path: str = "$") -> list[str]:
    """Paths of object schemas with declared properties that still allow unknown keys."""
    loose = []
    if isinstance(node, dict):
        if "properties" in node and node.get("additionalProperties") is not False:
            loose.append(path)
        for key, value in node.items():
            loose += _walk_schema(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            loose += _walk_schema(value, f"{path}[{i}]")
    return loose


def test_schema_is_strict_everywhere() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    assert _walk_schema(schema) == []


def test_every_default_value_is_in_the_schema_and_documented() -> None:
    """Every key of values.yaml is typed in the schema and has a comment above it (or above
    the map it belongs to)."""
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    values = load_yaml(CHART_DIR / "values.yaml")

    def check(node: dict[str, Any], props: dict[str, Any], path: str) -> list[str]:
        missing = []
        for key, value in node.items():
            if key not in props:
                missing.append(f"{path}{key}")
            elif isinstance(value, dict) and "properties" in (
                sub := (
                    schema["definitions"][props[key]["$ref"].rsplit("/", 1)[1]]
                    if "$ref" in props[key]
                    else props[key]
                )
            ):
                missing += check(value, sub["properties"], f"{path}{key}.")
        return missing

    assert check(values, schema["properties"], "") == []
    # A key that only groups others ("mlflow:") needs no comment: its children are checked.
    undocumented = []
    stack: list[tuple[int, bool]] = []  # (indent, has its own comment) of the enclosing keys
    previous = ""
    for line in (CHART_DIR / "values.yaml").read_text().splitlines():
        match = re.match(r"^(\s*)([A-Za-z][\w.-]*):(.*)$", line)
        if match:
            indent, has_value = len(match.group(1)), bool(match.group(3).strip())
            while stack and stack[-1][0] >= indent:
                stack.pop()
            commented = previous.lstrip().startswith("#")
            if has_value and not commented and not any(d for _, d in stack):
                undocumented.append(line.strip())
            stack.append((indent, commented))
        if line.strip():
            previous = line
    assert undocumented == []
