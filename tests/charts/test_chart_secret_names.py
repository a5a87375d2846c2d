"""One name per Secret everywhere: chart values, NOTES, READMEs, compile defaults, compiled files.

The NOTES' `fedtune submit` line is parsed by fedtune's own CLI parser and must name exactly
what the release rendered; a tenant's Secret line must hold the keys the launcher maps.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml
from chart_helpers import CHART_DIR, REPO_ROOT, VALUES_DIR, install_notes, load_yaml

from fedtune.cli.main import build_parser
from fedtune.config.secrets import MLFLOW_SECRET, PRESIGNER_SECRET, PROVIDER_S3_SECRET
from fedtune.engines.launcher_manifest import TENANT_SECRET_ENV
from fedtune.pipelines.builder import ClusterSettings


def submit_line(notes: str) -> list[str]:
    """The NOTES' `fedtune submit ...` command, continuation lines joined, as argv."""
    text = notes.split("fedtune submit", 1)[1]
    command = []
    for line in text.splitlines():
        command.append(line.strip().removesuffix("\\"))
        if not line.rstrip().endswith("\\"):
            break
    return ["submit", *shlex.split(" ".join(command))]


def test_the_notes_submit_line_names_this_releases_objects_and_parses(helm_bin: Path) -> None:
    notes = install_notes(
        helm_bin,
        "--values",
        str(VALUES_DIR / "multi-tenant-gpu.yaml"),
        "--set",
        "mlflow.auth.enabled=true,mlflow.auth.existingSecret=mlflow-auth",
    )
    args = build_parser().parse_args(submit_line(notes))
    values = load_yaml(VALUES_DIR / "multi-tenant-gpu.yaml")
    assert args.host == "http://localhost:8080" and args.namespace == "fedtune"
    assert args.store_secret == values["objectStore"]["existingSecret"] == PROVIDER_S3_SECRET
    assert args.tenants_configmap == "ft-fedtune-tenants"
    assert args.service_account == "ft-fedtune-launcher"
    assert args.s3_endpoint == "http://ft-fedtune-minio.fedtune.svc.cluster.local:9000"
    assert args.mlflow_uri == "http://ft-fedtune-mlflow.fedtune.svc.cluster.local:5000"
    assert args.mlflow_secret == MLFLOW_SECRET and args.presigner_secret == PRESIGNER_SECRET


def test_the_notes_tenant_secret_has_the_keys_the_launcher_maps(helm_bin: Path) -> None:
    notes = install_notes(helm_bin, "--values", str(VALUES_DIR / "multi-tenant-gpu.yaml"))
    line = next(row for row in notes.splitlines() if "--from-literal" in row)
    keys = {
        part.removeprefix("--from-literal=").split("=", 1)[0]
        for part in line.split()
        if part.startswith("--from-literal=")
    }
    required = {key for _, key, optional in TENANT_SECRET_ENV if not optional}
    assert keys == required
    optional = [key for _, key, opt in TENANT_SECRET_ENV if opt]
    assert f"optional keys: {', '.join(optional)}" in notes


def test_one_provider_secret_name_in_defaults_docs_and_compiled_pipelines() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values["objectStore"]["presignerSecret"] == PRESIGNER_SECRET
    assert values["mlflow"]["auth"]["pipelineSecret"] == MLFLOW_SECRET
    defaults = ClusterSettings()
    assert (defaults.store_secret, defaults.presigner_secret, defaults.mlflow_secret) == (
        PROVIDER_S3_SECRET,
        PRESIGNER_SECRET,
        MLFLOW_SECRET,
    )
    for doc in (
        CHART_DIR / "README.md",
        CHART_DIR / "templates" / "_validate.tpl",
        REPO_ROOT / "pipelines" / "README.md",
    ):
        text = doc.read_text()
        assert f"secret generic {PROVIDER_S3_SECRET}" in text or f"--store-secret {PROVIDER_S3_SECRET}" in text, doc
    for compiled in sorted((REPO_ROOT / "pipelines" / "compiled").glob("*.yaml")):
        platform = list(yaml.safe_load_all(compiled.read_text()))[-1]
        executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
        names = {s["secretName"] for e in executors.values() for s in e.get("secretAsEnv", [])}
        assert PROVIDER_S3_SECRET in names and names <= {
            PROVIDER_S3_SECRET,
            PRESIGNER_SECRET,
            MLFLOW_SECRET,
        }, compiled
    stale = [
        str(p.relative_to(REPO_ROOT))
        for p in [*REPO_ROOT.glob("*.md"), *CHART_DIR.rglob("*"), *(REPO_ROOT / "pipelines").rglob("*")]
        if p.is_file() and "fedtune-object-store" in p.read_text(errors="ignore")
    ]
    assert stale == []
