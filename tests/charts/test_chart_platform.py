"""What the chart asks of the cluster it lands on: Kubernetes version, the run's account, Istio."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
from chart_helpers import (
    CHART_DIR,
    NAMESPACE,
    SCENARIOS,
    VALUES_DIR,
    Rendered,
    Renderer,
    install_notes,
    load_yaml,
    pod_specs,
)

from fedtune.engines.launcher_rbac import kfp_run_rules

ISTIO_OPT_OUT = {"sidecar.istio.io/inject": "false"}
RUN_SA = "ft-fedtune-launcher"


def kube_version_floor() -> tuple[int, int]:
    """The (major, minor) of Chart.yaml's ``kubeVersion: ">=X.Y.Z-0"``."""
    constraint = load_yaml(CHART_DIR / "Chart.yaml")["kubeVersion"]
    match = re.fullmatch(r">=\s*(\d+)\.(\d+)\.0-0", constraint)
    assert match, f"kubeVersion {constraint!r} is not a plain lower bound"
    return int(match.group(1)), int(match.group(2))


def _unserved(rendered: Rendered, version: str) -> list[str]:
    """Objects whose kind/apiVersion the given Kubernetes version does not serve."""
    problems = []
    for doc in rendered.docs:
        if doc["kind"] == "InferenceService":  # a CRD of KServe, not of Kubernetes
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(f"{doc['apiVersion']} {doc['kind']}")
    return problems


@pytest.fixture(scope="module")
def at_floor(render: Renderer) -> dict[str, Rendered]:
    """Every scenario rendered for the lowest Kubernetes version Chart.yaml admits."""
    major, minor = kube_version_floor()
    out = {}
    for scenario in SCENARIOS:
        result = render(scenario, extra_args=["--kube-version", f"{major}.{minor}.0"])
        assert result.returncode == 0, result.stderr
        out[scenario] = result
    return out


def test_kube_version_floor_serves_every_rendered_api(at_floor: dict[str, Rendered]) -> None:
    major, minor = kube_version_floor()
    unserved = {s: _unserved(r, f"{major}.{minor}.0") for s, r in at_floor.items()}
    assert unserved == {s: [] for s in SCENARIOS}


def test_kube_version_floor_is_needed(at_floor: dict[str, Rendered]) -> None:
    """One minor below the floor a rendered API is missing, so the bound is not loose."""
    major, minor = kube_version_floor()
    missing = {s: _unserved(r, f"{major}.{minor - 1}.0") for s, r in at_floor.items()}
    assert (
        "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy" in missing["multi-tenant-gpu"]
    )


def test_helm_refuses_a_cluster_below_the_floor(render: Renderer) -> None:
    major, minor = kube_version_floor()
    result = render("minimal", extra_args=["--kube-version", f"{major}.{minor - 1}.9"])
    assert result.returncode != 0
    assert "kubeVersion" in result.stderr or "incompatible" in result.stderr, result.stderr


def test_pod_rights_only_for_argo_before_3_4(render: Renderer) -> None:
    """Patching pods would let a run change MinIO's pod: granted only when asked for."""
    pods = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "patch"]}
    assert pods not in kfp_run_rules()
    result = render("minimal", set_values=["launcher.kfp.argoBeforeV34=true"])
    assert result.returncode == 0, result.stderr
    (role,) = [r for r in result.of_kind("Role") if r["metadata"]["namespace"] == NAMESPACE]
    assert role["rules"] == kfp_run_rules(argo_before_v34=True)
    assert pods in role["rules"]


def test_the_run_account_reads_only_the_named_kfp_settings(render: Renderer) -> None:
    result = render(
        "minimal",
        set_values=[
            "launcher.kfp.launcherConfigMap=kfp-launcher-gpu",
            "launcher.kfp.artifactSecretNames={mlpipeline-minio-artifact,s3-artifacts}",
        ],
    )
    assert result.returncode == 0, result.stderr
    (role,) = [r for r in result.of_kind("Role") if r["metadata"]["namespace"] == NAMESPACE]
    assert role["rules"] == kfp_run_rules(
        "kfp-launcher-gpu", ("mlpipeline-minio-artifact", "s3-artifacts")
    )


@pytest.mark.parametrize(
    "unset", ["launcher.kfp.artifactSecretNames=null", "launcher.kfp.launcherConfigMap=null"]
)
def test_the_run_account_never_reads_unnamed_objects(render: Renderer, unset: str) -> None:
    """A Role rule with no resourceNames would grant every Secret of the namespace."""
    result = render("minimal", set_values=[unset])
    assert result.returncode != 0
    assert "a Role with no names would grant every Secret" in result.stderr


def test_an_empty_artifact_secret_list_is_refused(render: Renderer) -> None:
    result = render("minimal", set_values=["launcher.kfp.artifactSecretNames={}"])
    assert result.returncode != 0
    assert "artifactSecretNames" in result.stderr


def test_notes_and_readme_name_the_run_account_for_the_ui(helm_bin: Path) -> None:
    notes = install_notes(helm_bin, "--values", str(VALUES_DIR / "multi-tenant-gpu.yaml"))
    ui_step = notes.split("3. Open the Kubeflow Pipelines UI", 1)[1].split("4.", 1)[0]
    assert f'Service account "{RUN_SA}"' in ui_step
    assert f"namespace {NAMESPACE}" in ui_step
    assert f"--service-account {RUN_SA}" in notes
    readme = (CHART_DIR.parents[1] / "README.md").read_text()
    ui = readme.split("In the UI, *Pipelines -> Upload pipeline*", 1)[1][:600]
    assert "**Service account** `<release>-fedtune-launcher`" in ui


def _pod_annotations(rendered: Rendered) -> dict[str, dict[str, str]]:
    """Every pod template's annotations but Helm's hook ones, by ``Kind/name``."""
    out = {}
    for doc in rendered.docs:
        if doc["kind"] == "InferenceService":
            continue
        for where, _ in pod_specs(doc):
            meta = doc["metadata"] if doc["kind"] == "Pod" else doc["spec"]["template"]["metadata"]
            annotations = meta.get("annotations") or {}
            out[where] = {k: v for k, v in annotations.items() if not k.startswith("helm.sh/")}
    return out


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_with_istio_every_pod_of_the_chart_stays_out_of_the_mesh(
    rendered_scenarios: dict[str, Rendered], scenario: str
) -> None:
    """Tenant pods run without a sidecar; a meshed MinIO under STRICT mTLS would refuse them."""
    annotations = _pod_annotations(rendered_scenarios[scenario])
    assert any(w.startswith("Deployment/") for w in annotations)
    missing = [w for w, a in annotations.items() if ISTIO_OPT_OUT.items() - a.items()]
    assert missing == []


def test_istio_opt_out_wins_over_pod_annotations(render: Renderer) -> None:
    result = render(
        "minimal",
        set_values=["jobPodAnnotations=null", "podAnnotations.team=ml"],
        extra_args=["--set-string", "podAnnotations.sidecar\\.istio\\.io/inject=true"],
    )
    assert result.returncode == 0, result.stderr
    for where, found in _pod_annotations(result).items():
        assert found == {**ISTIO_OPT_OUT, "team": "ml"}, where


def test_without_istio_the_servers_carry_only_the_users_annotations(render: Renderer) -> None:
    result = render("minimal", set_values=["istio.enabled=false", "podAnnotations.team=ml"])
    assert result.returncode == 0, result.stderr
    annotations = _pod_annotations(result)
    servers = {w: a for w, a in annotations.items() if w.startswith("Deployment/")}
    assert servers == {
        "Deployment/ft-fedtune-minio": {"team": "ml"},
        "Deployment/ft-fedtune-mlflow": {"team": "ml"},
    }
    # Jobs keep jobPodAnnotations' default opt-out: a Job with a sidecar never completes.
    jobs = [a for w, a in annotations.items() if w.startswith("Job/")]
    assert jobs and all(a["sidecar.istio.io/inject"] == "false" for a in jobs)
