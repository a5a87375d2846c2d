"""Constants and helpers of the chart tests (imported by conftest and the test modules)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "fedtune"
VALUES_DIR = Path(__file__).resolve().parent / "values"
SCHEMAS_DIR = Path(__file__).resolve().parent / "schemas"
INSTALL_SCRIPT = REPO_ROOT / "scripts" / "install_helm.py"
RELEASE = "ft"
NAMESPACE = "fedtune"
# The Kubernetes minor version the manifests are rendered for and validated against.
KUBE_VERSION = "1.35.0"

# The valid scenarios every rendering test runs over.
SCENARIOS = sorted(p.stem for p in VALUES_DIR.glob("*.yaml"))


@dataclass(frozen=True)
class Rendered:
    """The outcome of one ``helm template``: exit code, output, and the parsed documents."""

    returncode: int
    stdout: str
    stderr: str
    docs: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        """All rendered objects of one kind."""
        return [d for d in self.docs if d.get("kind") == kind]


Renderer = Callable[..., Rendered]


def run_helm_template(
    helm: Path,
    chart: Path,
    values_files: list[Path],
    set_values: list[str] | None = None,
    extra_args: list[str] | None = None,
) -> Rendered:
    """Run ``helm template`` (tests included) and parse what it printed."""
    cmd = [
        str(helm),
        "template",
        RELEASE,
        str(chart),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBE_VERSION,
    ]
    for path in values_files:
        cmd += ["--values", str(path)]
    for item in set_values or []:
        cmd += ["--set", item]
    cmd += extra_args or []
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    docs = []
    if proc.returncode == 0:
        docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return Rendered(proc.returncode, proc.stdout, proc.stderr, docs)


def pod_specs(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (where, pod spec) for every pod template a rendered object carries."""
    kind = doc.get("kind")
    name = f"{kind}/{doc.get('metadata', {}).get('name')}"
    if kind == "Pod":
        yield name, doc["spec"]
    elif kind in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
        yield name, doc["spec"]["template"]["spec"]
    elif kind == "CronJob":
        yield name, doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    elif kind == "InferenceService":
        # KServe's predictor is a pod spec whose main container is the `model` field.
        predictor = dict(doc["spec"]["predictor"])
        predictor["containers"] = [{"name": "kserve-container", **predictor.pop("model")}]
        yield name, predictor


def copy_chart(tmp_path: Path) -> Path:
    """A scratch copy of the chart that a test may add files to."""
    dest = tmp_path / "fedtune"
    shutil.copytree(CHART_DIR, dest)
    return dest


def load_yaml(path: Path) -> Any:
    """Parse one YAML file."""
    return yaml.safe_load(path.read_text())


def install_notes(helm: Path, *extra: str) -> str:
    """The NOTES a `helm install ft --dry-run=client` of the chart prints (extra: its flags)."""
    proc = subprocess.run(
        [str(helm), "install", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE,
         "--dry-run=client", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("NOTES:", 1)[1]
