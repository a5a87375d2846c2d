"""One image setting reaches every task image: ``fedtune compile --image-registry``, digests
preferred, and the launcher's tenant Jobs with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fedtune import __version__
from fedtune.cli.main import main
from fedtune.config import parse_job
from fedtune.core.images import TENANT_IMAGE_ENV, Images, image_ref
from fedtune.engines.launcher_manifest import TenantDeployment, build_job_manifest
from fedtune.pipelines.images import retarget_text
from fedtune.pipelines.validate import validate_compiled
from tests.kfp.conftest import cluster_job_dict

REG = "registry.example.com:5000/mirror/fedtune"
CPU_DIGEST = "sha256:" + "0123456789abcdef" * 4
GPU_DIGEST = "sha256:" + "fedcba9876543210" * 4
JOBS = Path(__file__).resolve().parents[2] / "pipelines" / "jobs"


def executors(path: Path) -> dict[str, dict[str, Any]]:
    spec = next(yaml.safe_load_all(path.read_text()))
    return {k: v["container"] for k, v in spec["deploymentSpec"]["executors"].items()}


def tenant_images(containers: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {
        name: e["value"]
        for name, c in containers.items()
        for e in c.get("env", [])
        if e["name"] == TENANT_IMAGE_ENV
    }


@pytest.mark.parametrize("job_file", ["fedit.yaml", "fedit-secure.yaml"])
def test_compile_points_every_task_at_the_registry_by_digest(job_file: str, tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    assert main(["compile", str(JOBS / job_file), "-o", str(out), "--image-registry", REG,
                 "--cpu-digest", CPU_DIGEST, "--gpu-digest", GPU_DIGEST]) == 0
    validate_compiled(out)  # still a strict PipelineSpec / PlatformSpec
    containers = executors(out)
    # Every executor, whatever the graph: no default reference is left anywhere.
    assert {c["image"] for c in containers.values()} == {f"{REG}/fedtune-cpu@{CPU_DIGEST}"}
    launchers = tenant_images(containers)
    assert launchers and set(launchers.values()) == {f"{REG}/fedtune-gpu@{GPU_DIGEST}"}
    assert "ghcr.io/fedtune" not in out.read_text()


def test_without_digests_the_registry_gets_version_tags_and_gpu_steps_the_gpu_image(
    tmp_path: Path,
) -> None:
    job = tmp_path / "gpu.yaml"
    raw = yaml.safe_load((JOBS / "fedit.yaml").read_text())
    raw["provider"] = {"gpu": 1}
    job.write_text(yaml.safe_dump(raw))
    out = tmp_path / "p.yaml"
    assert main(["compile", str(job), "-o", str(out), "--image-registry", REG]) == 0
    containers = executors(out)
    gpu, cpu = f"{REG}/fedtune-gpu:{__version__}", f"{REG}/fedtune-cpu:{__version__}"
    for step in ("exec-server-init", "exec-aggregate", "exec-export-and-register"):
        assert containers[step]["image"] == gpu
    assert containers["exec-configure-round"]["image"] == cpu
    assert set(tenant_images(containers).values()) == {gpu}


def test_a_jobs_own_provider_image_is_kept() -> None:
    text = Path(__file__).resolve().parents[2].joinpath("pipelines/compiled/fedit.yaml").read_text()
    own = "example.org/own/provider:7"
    swapped = text.replace(f"ghcr.io/fedtune/fedtune-cpu:{__version__}", own, 1)
    moved = retarget_text(swapped, Images.of(REG))
    assert own in moved and moved.count(f"{REG}/fedtune-cpu:") >= 1


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--image-registry", "https://registry.example.com", "is not a registry path"),
        ("--image-registry", "registry.example.com/", "is not a registry path"),
        ("--cpu-digest", "sha256:abc", "is not sha256:<64 lowercase hex digits>"),
        ("--gpu-digest", "latest", "is not sha256:<64 lowercase hex digits>"),
    ],
)
def test_bad_image_settings_are_refused_with_the_flag_and_value(
    flag: str, value: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["compile", str(JOBS / "fedit.yaml"), "-o", str(tmp_path / "p.yaml"), flag, value])
    err = capsys.readouterr().err
    assert code == 2 and message in err and repr(value) in err and "--image-registry" in err
    assert not (tmp_path / "p.yaml").exists()


def test_image_ref_prefers_the_digest() -> None:
    assert image_ref("r.example/x", "fedtune-gpu", "1.0", GPU_DIGEST) == f"r.example/x/fedtune-gpu@{GPU_DIGEST}"
    assert image_ref("r.example/x", "fedtune-gpu", "1.0") == "r.example/x/fedtune-gpu:1.0"


def test_tenant_jobs_run_the_charts_image_else_the_compiled_one(monkeypatch: pytest.MonkeyPatch) -> None:
    job = parse_job(cluster_job_dict())

    def image(deployment: TenantDeployment) -> str:
        m = build_job_manifest(job, "tenant-a", "client", 1, deployment)
        return str(m["spec"]["template"]["spec"]["containers"][0]["image"])

    compiled = f"{REG}/fedtune-gpu@{GPU_DIGEST}"
    monkeypatch.setenv(TENANT_IMAGE_ENV, compiled)  # as compiled into the launcher task
    charted = "chart.example/fedtune-gpu@" + GPU_DIGEST
    assert image(TenantDeployment("fedtune-tenant-a", "s", image=charted)) == charted
    assert image(TenantDeployment("fedtune-tenant-a", "s")) == compiled
