"""The chart lints, renders every scenario, and every manifest is valid Kubernetes."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections import defaultdict
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chart_helpers import (
    CHART_DIR,
    KUBE_VERSION,
    SCENARIOS,
    SCHEMAS_DIR,
    VALUES_DIR,
    Rendered,
    Renderer,
    copy_chart,
    install_notes,
)
from referencing import Registry, Resource

# Kinds that are not in kubernetes-validate's schemas, with the JSON schema kept for them here.
CRD_SCHEMAS = {("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice-v1beta1.json"}


def crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    """Validator for a CRD kind, resolving Kubernetes types in kubernetes-validate's schemas."""
    schema = json.loads((SCHEMAS_DIR / CRD_SCHEMAS[(api_version, kind)]).read_text())
    minor = ".".join(KUBE_VERSION.split(".")[:2])
    defs_path = (
        files("kubernetes_validate")
        / "kubernetes-json-schema"
        / (f"v{minor}.0-local-strict")
        / "_definitions.json"
    )
    definitions = Resource.from_contents(json.loads(defs_path.read_text()))
    registry = definitions @ Registry()
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate_manifest(doc: dict[str, Any]) -> None:
    """Validate one rendered object strictly; raises on the first problem."""
    key = (doc["apiVersion"], doc["kind"])
    if key in CRD_SCHEMAS:
        crd_validator(*key).validate(doc)
    else:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_passes_strict(helm_bin: Path, scenario: str) -> None:
    proc = subprocess.run(
        [
            str(helm_bin),
            "lint",
            "--strict",
            str(CHART_DIR),
            "--values",
            str(VALUES_DIR / f"{scenario}.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_scenario_files_cover_the_required_cases() -> None:
    assert {"minimal", "multi-tenant-gpu", "external-s3-auth-serving"} <= set(SCENARIOS)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_manifest_validates_against_kubernetes_schemas(
    rendered_scenarios: dict[str, Rendered], scenario: str
) -> None:
    docs = rendered_scenarios[scenario].docs
    assert docs, "nothing rendered"
    problems = []
    for doc in docs:
        try:
            validate_manifest(doc)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            message = getattr(exc, "message", None) or getattr(exc, "caught", exc)
            problems.append(f"{doc['kind']}/{doc['metadata']['name']}: {message}")
    assert not problems, "\n".join(problems)


def test_validation_catches_a_broken_manifest(rendered_scenarios: dict[str, Rendered]) -> None:
    """The validators above really are strict: a misspelled field fails both kinds of check."""
    deployment = copy.deepcopy(rendered_scenarios["minimal"].of_kind("Deployment")[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_manifest(deployment)
    isvc = copy.deepcopy(
        rendered_scenarios["external-s3-auth-serving"].of_kind("InferenceService")[0]
    )
    isvc["spec"]["predictor"]["model"]["storageURI"] = "s3://x/y"
    with pytest.raises(jsonschema.ValidationError, match="storageURI"):
        validate_manifest(isvc)
    isvc = copy.deepcopy(
        rendered_scenarios["external-s3-auth-serving"].of_kind("InferenceService")[0]
    )
    isvc["spec"]["predictor"]["model"]["securityContext"]["runAsUser"] = "root"
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(isvc)


def test_one_resource_kind_per_template_file(rendered_scenarios: dict[str, Rendered]) -> None:
    kinds_by_file: dict[str, set[str]] = defaultdict(set)
    for rendered in rendered_scenarios.values():
        for chunk in rendered.stdout.split("\n---\n"):
            match = re.search(r"^# Source: (\S+)$", chunk, re.MULTILINE)
            doc = yaml.safe_load(chunk)
            if match and doc:
                kinds_by_file[match.group(1)].add(doc["kind"])
    mixed = {path: kinds for path, kinds in kinds_by_file.items() if len(kinds) > 1}
    assert not mixed
    assert len(kinds_by_file) >= 15


def test_expected_objects_per_scenario(rendered_scenarios: dict[str, Rendered]) -> None:
    minimal = rendered_scenarios["minimal"]
    assert not minimal.of_kind("Namespace")
    assert {d["metadata"]["name"] for d in minimal.of_kind("Deployment")} == {
        "ft-fedtune-mlflow",
        "ft-fedtune-minio",
    }
    assert not minimal.of_kind("InferenceService")
    multi = rendered_scenarios["multi-tenant-gpu"]
    assert sorted(d["metadata"]["name"] for d in multi.of_kind("Namespace")) == [
        "clinic-c-federated",
        "fedtune-hospital-a",
        "fedtune-hospital-b",
    ]
    external = rendered_scenarios["external-s3-auth-serving"]
    assert [d["metadata"]["name"] for d in external.of_kind("Deployment")] == ["ft-fedtune-mlflow"]
    assert not external.of_kind("PersistentVolumeClaim"), "postgresql + external S3 need no PVC"
    assert len(external.of_kind("InferenceService")) == 1


def test_images_are_pinned_to_the_app_version(rendered_scenarios: dict[str, Rendered]) -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == "0.1.0"
    images = {
        c["image"]
        for r in rendered_scenarios.values()
        for d in r.docs
        if d["kind"] in ("Deployment", "Job", "Pod")
        for c in (d["spec"] if d["kind"] == "Pod" else d["spec"]["template"]["spec"])["containers"]
    }
    fedtune_images = {i for i in images if "fedtune" in i}
    assert fedtune_images == {"ghcr.io/fedtune/fedtune-cpu:0.1.0"}
    assert all(":" in i and not i.endswith(":latest") for i in images)
    (tenants_cm,) = [
        c
        for c in rendered_scenarios["multi-tenant-gpu"].of_kind("ConfigMap")
        if c["metadata"]["name"].endswith("-tenants")
    ]
    tenants = json.loads(tenants_cm["data"]["tenants.json"])
    # Pinned by digest: what each tenant's admission policy admits (tests/charts/test_chart_admission.py).
    assert tenants["image"].startswith("ghcr.io/fedtune/fedtune-gpu@sha256:")


def test_helm_test_hook_checks_mlflow_health(rendered_scenarios: dict[str, Rendered]) -> None:
    for rendered in rendered_scenarios.values():
        (pod,) = [
            d
            for d in rendered.of_kind("Pod")
            if d["metadata"]["annotations"].get("helm.sh/hook") == "test"
        ]
        command = pod["spec"]["containers"][0]["command"]
        assert command[-1] == "http://ft-fedtune-mlflow.fedtune.svc.cluster.local:5000/health"


def test_hook_jobs_run_after_install_and_upgrade(rendered_scenarios: dict[str, Rendered]) -> None:
    jobs = {d["metadata"]["name"]: d for d in rendered_scenarios["minimal"].of_kind("Job")}
    assert sorted(jobs) == ["ft-fedtune-bucket-bootstrap", "ft-fedtune-pipelines-upload"]
    for hook in jobs.values():
        assert hook["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    job = jobs["ft-fedtune-bucket-bootstrap"]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-3:] == ["fedtune-exchange", "fedtune-provider", "fedtune-mlflow"]
    pod_annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert pod_annotations["sidecar.istio.io/inject"] == "false"


def test_pipelines_are_skipped_without_files(render: Renderer, tmp_path: Path) -> None:
    chart = copy_chart(tmp_path)
    for path in (chart / "files" / "pipelines").glob("*.yaml"):
        path.unlink()
    rendered = render("minimal", chart=chart)
    assert rendered.returncode == 0, rendered.stderr
    # The run's Role and RoleBinding (``-pipeline-run``) stay: runs need them whatever is shipped.
    assert not [
        d
        for d in rendered.docs
        if d["kind"] in ("ConfigMap", "Job") and "-pipeline" in d["metadata"]["name"]
    ]


def test_shipped_pipelines_become_configmaps_and_an_upload_job(
    rendered_scenarios: dict[str, Rendered], render: Renderer
) -> None:
    shipped = sorted((CHART_DIR / "files" / "pipelines").glob("*.yaml"))
    assert len(shipped) >= 12  # every family, plain and GPU, and FedIT's secure variants
    for rendered in rendered_scenarios.values():
        maps = {
            d["metadata"]["name"]: d
            for d in rendered.of_kind("ConfigMap")
            if "-pipeline-" in d["metadata"]["name"]
        }
        # One ConfigMap per file (all of them in one would be near the 1 MiB limit), each
        # holding the file as shipped, byte for byte.
        assert sorted(maps) == sorted(f"ft-fedtune-pipeline-{p.stem}" for p in shipped)
        for path in shipped:
            assert maps[f"ft-fedtune-pipeline-{path.stem}"]["data"] == {path.name: path.read_text()}
        (job,) = [
            d for d in rendered.of_kind("Job") if d["metadata"]["name"].endswith("-pipelines-upload")
        ]
        volume = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "pipelines")
        assert sorted(s["configMap"]["name"] for s in volume["projected"]["sources"]) == sorted(maps)
        container = job["spec"]["template"]["spec"]["containers"][0]
        assert "--host=http://ml-pipeline.kubeflow.svc.cluster.local:8888" in container["args"]
        for doc in (*maps.values(), job):
            validate_manifest(doc)
    # No KFP URL while pipelines are shipped is a collected validation error.
    failed = render("minimal", set_values=["pipelines.kfpApiUrl="])
    assert failed.returncode != 0
    assert "pipelines.kfpApiUrl is empty" in failed.stderr


def test_notes_tell_the_user_what_to_do_next(helm_bin: Path) -> None:
    notes = install_notes(helm_bin, "--values", str(VALUES_DIR / "external-s3-auth-serving.yaml"))
    for expected in (
        "helm test ft -n fedtune",
        "kubectl -n fedtune port-forward svc/ft-fedtune-mlflow 5000:5000",
        "kubectl -n kubeflow port-forward svc/ml-pipeline-ui 8080:80",
        "fedtune submit job.yaml",
        "kubectl -n fedtune-bank-a create secret generic bank-a-bucket",
        "password in Secret mlflow-auth",
        "kubectl -n fedtune-serving get inferenceservice fedtune-llama",
    ):
        assert expected in notes, expected


def test_tenant_job_limits_in_the_values_reach_the_launcher(
    render: Renderer, tmp_path: Path
) -> None:
    from fedtune.engines.launcher_manifest import LauncherSettings, load_settings

    result = render(
        "multi-tenant-gpu",
        set_values=[
            "tenantDefaults.job.backoffLimit=0",
            "tenantDefaults.job.activeDeadlineSeconds=900",
            "tenantDefaults.job.ttlSecondsAfterFinished=60",
            "tenantDefaults.job.startTimeoutSeconds=120",
        ],
    )
    assert result.returncode == 0, result.stderr
    (tenants_cm,) = [
        c for c in result.of_kind("ConfigMap") if c["metadata"]["name"].endswith("-tenants")
    ]
    path = tmp_path / "tenants.json"
    path.write_text(tenants_cm["data"]["tenants.json"])
    assert load_settings(str(path)) == LauncherSettings(
        backoff_limit=0, active_deadline_s=900, ttl_s=60, start_timeout_s=120
    )
