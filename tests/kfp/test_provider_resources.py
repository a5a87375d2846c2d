"""The job's ``provider:`` section: validated, compiled into the heavy provider steps (real KFP
compiler), and held against the run's job at run time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedtune import __version__
from fedtune.config import parse_job
from fedtune.core.errors import ConfigError
from fedtune.pipelines import catalog
from fedtune.pipelines.builder import DEFAULT_CLUSTER, HEAVY_STEPS, ClusterSettings
from fedtune.pipelines.compiling import compile_job
from fedtune.pipelines.run_form import PROVIDER_ENV, RunForm, check_compiled_provider, resolve_job
from tests.kfp.conftest import cluster_job_dict

CPU_IMAGE = f"ghcr.io/fedtune/fedtune-cpu:{__version__}"
GPU_IMAGE = f"ghcr.io/fedtune/fedtune-gpu:{__version__}"
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
GPU_PROVIDER = {
    "cpu": "8",
    "memory": "64Gi",
    "gpu": 2,
    "node_selector": {"pool": "h100", "nvidia.com/gpu.present": "true"},
    "tolerations": [TOLERATION],
}
LIGHT_STEPS = (
    "configure-round", "close-rounds", "record-audit", "client-step", "evaluate", "audit",
)


def compile_with(
    tmp_path: Path, provider: dict[str, Any] | None, settings: ClusterSettings | None = DEFAULT_CLUSTER
) -> dict[str, Any]:
    raw = cluster_job_dict() if provider is None else cluster_job_dict(provider=provider)
    path, _ = compile_job(parse_job(raw), tmp_path / "p.yaml", settings=settings)
    docs = list(yaml.safe_load_all(path.read_text()))
    spec = docs[0]
    platform = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"] if len(docs) > 1 else {}
    return {
        step: {
            "container": spec["deploymentSpec"]["executors"][f"exec-{step}"]["container"],
            "platform": platform.get(f"exec-{step}", {}),
        }
        for step in HEAVY_STEPS + LIGHT_STEPS
    }


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def test_gpu_steps_get_the_gpu_image_limits_node_selector_and_tolerations(tmp_path: Path) -> None:
    steps = compile_with(tmp_path, GPU_PROVIDER)
    for step in HEAVY_STEPS:
        container, platform = steps[step]["container"], steps[step]["platform"]
        assert container["image"] == GPU_IMAGE, step
        res = container["resources"]
        assert res["accelerator"]["resourceType"] == "nvidia.com/gpu", step
        assert res["accelerator"]["resourceCount"] == "2", step
        assert (res["resourceCpuRequest"], res["resourceCpuLimit"]) == ("8", "8"), step
        assert (res["resourceMemoryRequest"], res["resourceMemoryLimit"]) == ("64Gi", "64Gi")
        assert platform["nodeSelector"] == {"labels": GPU_PROVIDER["node_selector"]}, step
        assert platform["tolerations"] == [TOLERATION], step
        # Two GPUs: ranks on one node share memory beyond the pod's default 64 MiB /dev/shm.
        assert platform["emptyDirMounts"] == [
            {"volumeName": "dshm", "mountPath": "/dev/shm", "medium": "Memory"}
        ], step
    for step in LIGHT_STEPS:
        container, platform = steps[step]["container"], steps[step]["platform"]
        assert container["image"] == CPU_IMAGE, step
        assert "accelerator" not in container.get("resources", {}), step
        assert "nodeSelector" not in platform and "tolerations" not in platform, step
    # The launchers keep their own small pod whatever the provider asks.
    assert steps["client-step"]["container"]["resources"]["resourceMemoryLimit"] == "2Gi"


def test_a_cpu_only_provider_section_keeps_the_cpu_image_and_an_own_image_wins(
    tmp_path: Path,
) -> None:
    steps = compile_with(tmp_path, {"cpu": "4", "memory": "32Gi"})
    for step in HEAVY_STEPS:
        container = steps[step]["container"]
        assert container["image"] == CPU_IMAGE
        assert "accelerator" not in container["resources"]
        assert container["resources"]["resourceMemoryLimit"] == "32Gi"
    own = "registry.example/fedtune-gpu@sha256:" + "a" * 64
    steps = compile_with(tmp_path, {"gpu": 1, "image": own})
    assert {steps[s]["container"]["image"] for s in HEAVY_STEPS} == {own}
    assert not any("emptyDirMounts" in steps[s]["platform"] for s in HEAVY_STEPS)  # one GPU
    assert {steps[s]["container"]["image"] for s in LIGHT_STEPS} == {CPU_IMAGE}


def test_without_a_provider_section_the_shipped_pipelines_are_unchanged(tmp_path: Path) -> None:
    # The committed pipelines are compiled from jobs without one and must not have moved.
    assert catalog.stale(catalog.repo_root()) == []
    steps = compile_with(tmp_path, None)
    for step, parts in steps.items():
        assert parts["container"]["image"] == CPU_IMAGE, step
        assert PROVIDER_ENV not in env_of(parts["container"]), step
        assert "nodeSelector" not in parts["platform"], step
    for step in HEAVY_STEPS:
        assert "resources" not in steps[step]["container"], step


def test_the_kfp_local_form_carries_the_marker_but_no_cluster_settings(tmp_path: Path) -> None:
    steps = compile_with(tmp_path, GPU_PROVIDER, settings=None)
    init = steps["server-init"]["container"]
    assert init["image"] == CPU_IMAGE and "resources" not in init
    assert json.loads(env_of(init)[PROVIDER_ENV]) == parse_job(
        cluster_job_dict(provider=GPU_PROVIDER)
    ).provider.model_dump(mode="json", exclude_defaults=True)


def test_a_run_must_ask_for_the_provider_resources_the_pipeline_was_compiled_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = compile_with(tmp_path, GPU_PROVIDER)
    marker = env_of(steps["server-init"]["container"])[PROVIDER_ENV]
    monkeypatch.setenv(PROVIDER_ENV, marker)  # as in the compiled server-init pod

    def form(**provider: Any) -> RunForm:
        raw = cluster_job_dict(provider=provider) if provider else cluster_job_dict()
        return RunForm(job_config=json.dumps(raw), kfp_run_id="run-1")

    job = resolve_job(form(**GPU_PROVIDER), "fedit")
    assert job.provider.gpu == 2
    with pytest.raises(ConfigError) as info:
        resolve_job(form(**{**GPU_PROVIDER, "gpu": 4}), "fedit")
    assert '"gpu": 4' in str(info.value) and '"gpu": 2' in str(info.value)
    assert "fedtune compile" in info.value.fix
    with pytest.raises(ConfigError, match=r"provider section \{\} differs"):
        resolve_job(form(), "fedit")
    # A pipeline compiled without one refuses a job that asks for GPUs.
    monkeypatch.delenv(PROVIDER_ENV)
    with pytest.raises(ConfigError, match=r"compiled with \(\{\}\)"):
        resolve_job(form(gpu=1), "fedit")
    assert resolve_job(form(), "fedit").provider.gpu == 0


def test_check_compiled_provider_compares_values_not_spelling() -> None:
    job = parse_job(cluster_job_dict(provider={"gpu": 1, "tolerations": [TOLERATION]}))
    marker = json.dumps({"tolerations": [dict(reversed(TOLERATION.items()))], "gpu": 1})
    check_compiled_provider(job, "job", marker)  # same section, other key order


@pytest.mark.parametrize(
    ("provider", "expected"),
    [
        ({"gpu": -1}, "provider.gpu: Input should be greater than or equal to 0 (got -1)"),
        ({"gpu": 17}, "provider.gpu: Input should be less than or equal to 16 (got 17)"),
        ({"memory": "64GB"}, "provider.memory: String should match pattern"),
        ({"cpu": "two"}, "provider.cpu: String should match pattern"),
        (
            {"tolerations": [{"key": "gpu", "operator": "Exists", "tolerationSecond": "5"}]},
            "provider.tolerations: toleration {'key': 'gpu', 'operator': 'Exists', "
            "'tolerationSecond': '5'} has unknown key(s) ['tolerationSecond']",
        ),
        (
            {"tolerations": [{"key": "gpu", "operator": "In"}]},
            "has operator 'In'; use one of ['Equal', 'Exists']",
        ),
        (
            {"tolerations": [{"key": "gpu", "effect": "NoRun"}]},
            "has effect 'NoRun'",
        ),
        ({"image": "bad image"}, "provider.image: String should match pattern"),
        ({"gpus": 1}, "provider.gpus: Extra inputs are not permitted"),
    ],
    ids=[
        "negative-gpu", "too-many-gpus", "bad-memory", "bad-cpu", "toleration-unknown-key",
        "toleration-operator", "toleration-effect", "bad-image", "typo",
    ],
)
def test_bad_provider_input_is_a_collected_config_error(
    provider: dict[str, Any], expected: str
) -> None:
    raw = cluster_job_dict(provider=provider, rounds=0)  # a second problem: both are listed
    with pytest.raises(ConfigError) as info:
        parse_job(raw)
    message = str(info.value)
    assert expected in message
    assert "2 problem(s)" in message and "rounds:" in message
    if "memory" in provider:
        assert "(got '64GB')" in message


def test_tenant_tolerations_are_checked_the_same_way() -> None:
    raw = cluster_job_dict()
    raw["tenants"][1]["resources"] = {"tolerations": [{"key": "gpu", "operator": "Exist"}]}
    with pytest.raises(ConfigError, match=r"tenants\.1\.resources\.tolerations: .*'Exist'"):
        parse_job(raw)


# -- tenant steps: the launcher's Job ------------------------------------------------------------
def test_a_tenant_job_that_requests_gpus_runs_the_gpu_image() -> None:
    from fedtune.engines.launcher_manifest import TenantDeployment, build_job_manifest

    raw = cluster_job_dict(provider=GPU_PROVIDER)
    raw["tenants"][0]["resources"] = {"gpu": 2, "tolerations": [TOLERATION]}
    job = parse_job(raw)

    def container(deployment: TenantDeployment) -> dict[str, Any]:
        m = build_job_manifest(job, "tenant-a", "client", 1, deployment, run_key="r")
        (only,) = m["spec"]["template"]["spec"]["containers"]
        return only

    # Without the chart's tenants file entry for the image: this release's GPU image.
    plain = container(TenantDeployment("fedtune-tenant-a", "s", tolerations=[TOLERATION]))
    assert plain["image"] == GPU_IMAGE
    assert plain["resources"]["limits"]["nvidia.com/gpu"] == "2"
    # With it: the chart's GPU image, pinned by digest (what the tenant's admission admits).
    pinned = f"ghcr.io/fedtune/fedtune-gpu@sha256:{'b' * 64}"
    chart = container(TenantDeployment("fedtune-tenant-a", "s", image=pinned, tolerations=[TOLERATION]))
    assert chart["image"] == pinned
    # The pod's copy of the job keeps the tenant's resources but not the provider's.
    seen = json.loads(next(e["value"] for e in chart["env"] if e["name"] == "FEDTUNE_JOB_JSON"))
    assert seen["tenant"]["resources"]["gpu"] == 2
    assert "provider" not in seen and "h100" not in json.dumps(seen)


# -- kfp.local: the marker travels with the compiled pipeline -------------------------------------
@pytest.mark.slow
def test_kfp_local_runs_a_job_with_a_provider_section_and_refuses_a_foreign_pipeline(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from fedtune.core.errors import FedtuneError
    from fedtune.engines.local import RunOptions
    from fedtune.pipelines import kfp_local
    from fedtune.pipelines.builder import compile_pipeline
    from tests.kfp.conftest import two_tenant_job

    job = two_tenant_job(tmp_path / "run", provider=GPU_PROVIDER, training={"local_steps": 1})
    # A pipeline compiled without provider resources: server-init refuses the job.
    plain = compile_pipeline("fedit", tmp_path / "plain.yaml", None)
    with pytest.raises(FedtuneError, match="server-init"):
        kfp_local.run_job(job, RunOptions(progress=False), pipeline_file=plain)
    out = capfd.readouterr()
    assert "differs from the one this pipeline was compiled with" in out.out + out.err
    # Compiled from the job (what the engine does): it runs, the resources ignored locally.
    fresh = two_tenant_job(tmp_path / "fresh", provider=GPU_PROVIDER, training={"local_steps": 1})
    summary = kfp_local.run_job(fresh, RunOptions(progress=False))
    assert summary["completed"]


def test_provider_resources_may_change_when_a_run_resumes() -> None:
    from fedtune.engines.fingerprint import check_resumable, config_fingerprint, run_record

    plain = parse_job(cluster_job_dict())
    bigger = parse_job(cluster_job_dict(provider=GPU_PROVIDER))
    # Runs stored before the section existed keep their fingerprint, and a resume may move
    # the heavy steps to other nodes (e.g. after running out of memory).
    assert config_fingerprint(plain) == config_fingerprint(bigger)
    assert check_resumable(run_record(plain), bigger, "s3://provider/runs")["fingerprint"]


def test_the_secure_variants_aggregate_is_a_heavy_step_too(tmp_path: Path) -> None:
    """Under secure aggregation the round ends in ``secure-aggregate`` (FedBiOT's alignment
    runs there), so it gets the provider's GPU image and resources like ``aggregate``."""
    raw = cluster_job_dict(provider=GPU_PROVIDER, secure_aggregation={"enabled": True, "threshold": 2})
    path, _ = compile_job(parse_job(raw), tmp_path / "secure.yaml", settings=DEFAULT_CLUSTER)
    docs = list(yaml.safe_load_all(path.read_text()))
    container = docs[0]["deploymentSpec"]["executors"]["exec-secure-aggregate"]["container"]
    platform = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-secure-aggregate"]
    assert container["image"] == GPU_IMAGE
    assert container["resources"]["accelerator"]["resourceCount"] == "2"
    assert platform["tolerations"] == [TOLERATION]
