"""The chart's pipeline upload hook, run as rendered against a KFP API over HTTP.

``helm template`` renders the hook Job and the pipeline ConfigMaps; the ConfigMaps' files are
laid out as the Job's projected volume would mount them, and the Job's command runs here with
its rendered arguments (only ``--host`` pointed at the stand-in KFP API of
``tests/helpers/kfp_api.py``, which speaks the REST API ``kfp.Client`` uses and, like KFP,
refuses a second pipeline of one name in one namespace). Each test is what a platform
engineer does: install, upgrade, upgrade with another image setting, a namespaced install.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import CHART_DIR, REPO_ROOT, Renderer

from fedtune.core.images import provider_image, tenant_image
from tests.helpers.kfp_api import FakeKfp

SHIPPED = sorted((CHART_DIR / "files" / "pipelines").glob("*.yaml"))
MIRROR = "registry.example.com:5000/mirror"
CPU_DIGEST = "sha256:" + "c" * 64
GPU_DIGEST = "sha256:" + "9" * 64


@pytest.fixture
def kfp_api() -> Iterator[FakeKfp]:
    server = FakeKfp(token="projected-token").start()
    try:
        yield server
    finally:
        server.stop()


def hook(render: Renderer, *set_values: str) -> tuple[list[str], dict[str, str]]:
    """The upload Job's command and the files its projected volume mounts."""
    rendered = render("minimal", set_values=list(set_values))
    assert rendered.returncode == 0, rendered.stderr
    (job,) = [d for d in rendered.of_kind("Job") if d["metadata"]["name"].endswith("-pipelines-upload")]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    maps = {d["metadata"]["name"]: d["data"] for d in rendered.of_kind("ConfigMap")}
    volume = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "pipelines")
    files: dict[str, str] = {}
    for source in volume["projected"]["sources"]:
        files.update(maps[source["configMap"]["name"]])
    return [*container["command"], *container["args"]], files


def run_hook(
    command: list[str], files: dict[str, str], kfp: FakeKfp, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """Run the rendered command here: container paths mapped into ``tmp_path``."""
    mounted = tmp_path / "pipelines"
    mounted.mkdir(exist_ok=True)
    for old in mounted.iterdir():
        old.unlink()
    for name, text in files.items():
        (mounted / name).write_text(text)
    token = tmp_path / "token"
    token.write_text(kfp.token or "")
    args = []
    for arg in command[2:]:
        if arg.startswith("--host="):
            arg = f"--host={kfp.url}"
        elif arg.startswith("--dir="):
            arg = f"--dir={mounted}"
        args.append(arg)
    script = CHART_DIR / "files" / "scripts" / Path(command[1]).name
    env = {
        **os.environ,
        "KF_PIPELINES_SA_TOKEN_PATH": str(token),  # the Job's projected KFP token
        "PYTHONPATH": f"{REPO_ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    return subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )


def by_name(kfp: FakeKfp) -> dict[tuple[str, str], dict[str, Any]]:
    return {(p.get("namespace", ""), p["display_name"]): p for p in kfp.pipelines.values()}


def images_of(text: str) -> set[str]:
    spec = next(yaml.safe_load_all(text))
    found = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
    for executor in spec["deploymentSpec"]["executors"].values():
        found |= {
            e["value"] for e in executor["container"].get("env", [])
            if e["name"] == "FEDTUNE_TENANT_IMAGE"
        }
    return found


def test_install_uploads_every_shipped_pipeline_under_the_name_submit_uses(
    render: Renderer, kfp_api: FakeKfp, tmp_path: Path
) -> None:
    command, files = hook(render)
    done = run_hook(command, files, kfp_api, tmp_path)
    assert done.returncode == 0, done.stderr
    names = sorted(next(yaml.safe_load_all(p.read_text()))["pipelineInfo"]["name"] for p in SHIPPED)
    assert names == sorted(f"fedtune-{p.stem.removeprefix('fedtune-')}" for p in SHIPPED)
    assert sorted(n for _, n in by_name(kfp_api)) == names
    assert {"fedtune-fedit", "fedtune-fedit-gpu", "fedtune-fedmkt", "fedtune-fedit-secure"} <= set(names)
    for pipeline in kfp_api.pipelines.values():
        (version,) = kfp_api.versions[pipeline["pipeline_id"]]
        assert version["display_name"].startswith(f"{pipeline['display_name']}-")
        # Uploaded as shipped: the chart's default images are the compiled defaults.
        shipped = (CHART_DIR / "files" / "pipelines" / f"{pipeline['display_name']}.yaml").read_text()
        assert kfp_api.uploads[version["pipeline_version_id"]] == shipped
    # Every request carried the Job's projected token.
    assert {h.get("Authorization") or h.get("authorization") for _, _, h in kfp_api.requests} == {
        "Bearer projected-token"
    }


def test_an_upgrade_with_the_same_files_changes_nothing_and_new_images_add_a_version(
    render: Renderer, kfp_api: FakeKfp, tmp_path: Path
) -> None:
    command, files = hook(render)
    assert run_hook(command, files, kfp_api, tmp_path).returncode == 0
    before = {k: list(v) for k, v in kfp_api.versions.items()}
    again = run_hook(command, files, kfp_api, tmp_path)  # helm upgrade, nothing changed
    assert again.returncode == 0, again.stderr
    assert kfp_api.versions == before and "already has version" in again.stderr
    # helm upgrade --set image.registry=... (a mirror), digests pinned: one new version each,
    # every task image and the launcher's tenant image in the mirror, by digest.
    command, files = hook(
        render, "image.registry=registry.example.com:5000", "image.cpuRepository=mirror/fedtune-cpu",
        "image.gpuRepository=mirror/fedtune-gpu", f"image.cpuDigest={CPU_DIGEST}",
        f"image.gpuDigest={GPU_DIGEST}",
    )
    moved = run_hook(command, files, kfp_api, tmp_path)
    assert moved.returncode == 0, moved.stderr
    for pipeline_id, versions in kfp_api.versions.items():
        assert len(versions) == 2, kfp_api.pipelines[pipeline_id]
        text = kfp_api.uploads[versions[1]["pipeline_version_id"]]
        assert images_of(text) <= {f"{MIRROR}/fedtune-cpu@{CPU_DIGEST}", f"{MIRROR}/fedtune-gpu@{GPU_DIGEST}"}
        assert f"{MIRROR}/fedtune-cpu@{CPU_DIGEST}" in images_of(text)
        assert provider_image() not in text and tenant_image() not in text
    gpu = next(p for p in kfp_api.pipelines.values() if p["display_name"] == "fedtune-fedit-gpu")
    heavy = next(yaml.safe_load_all(kfp_api.uploads[kfp_api.versions[gpu["pipeline_id"]][1]["pipeline_version_id"]]))
    assert heavy["deploymentSpec"]["executors"]["exec-aggregate"]["container"]["image"] == f"{MIRROR}/fedtune-gpu@{GPU_DIGEST}"


def test_a_namespaced_install_is_found_again_on_upgrade(
    render: Renderer, kfp_api: FakeKfp, tmp_path: Path
) -> None:
    # A shared pipeline of the same name exists already (another team's install).
    shared = run_hook(*hook(render), kfp_api, tmp_path)
    assert shared.returncode == 0, shared.stderr
    command, files = hook(render, "pipelines.kfpNamespace=team-a")
    assert "--namespace=team-a" in command
    for attempt in ("install", "upgrade"):
        done = run_hook(command, files, kfp_api, tmp_path)
        assert done.returncode == 0, f"{attempt}: {done.stderr}"
    pipelines = by_name(kfp_api)
    assert ("team-a", "fedtune-fedit") in pipelines and ("", "fedtune-fedit") in pipelines
    assert len(pipelines) == 2 * len(SHIPPED)
    assert all(len(v) == 1 for v in kfp_api.versions.values())


def test_half_an_image_setting_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(CHART_DIR / "files" / "scripts" / "upload_pipelines.py"),
         "--host=http://127.0.0.1:9", f"--dir={tmp_path}", "--version-name=1",
         "--cpu-image=r/fedtune-cpu:1"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 2 and "--cpu-image and --gpu-image go together" in proc.stderr
