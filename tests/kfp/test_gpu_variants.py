"""The shipped GPU variants: every family's heavy provider steps on a GPU without recompiling.

Parsed as KFP's backend reads them (strict PipelineSpec and PlatformSpec protos), not by
text: the heavy steps ask for one ``nvidia.com/gpu``, run the GPU image and tolerate the GPU
taint; the light steps and the tenant launchers do not; and the run form's default job runs
on the variant as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from fedtune.core.images import provider_image, tenant_image
from fedtune.pipelines import catalog
from fedtune.pipelines.builder import HEAVY_STEPS
from fedtune.pipelines.run_form import PROVIDER_ENV, RunForm, resolve_job

ROOT = catalog.repo_root()
COMPILED = ROOT / "pipelines" / "compiled"
GPU_FILES = sorted(COMPILED.glob("*-gpu.yaml"))
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def parsed(path: Path) -> tuple[Any, Any]:
    """The file's PipelineSpec and PlatformSpec, parsed strictly."""
    docs = list(yaml.safe_load_all(path.read_text()))
    spec = json_format.ParseDict(docs[0], pipeline_spec_pb2.PipelineSpec())
    platform = json_format.ParseDict(docs[1], pipeline_spec_pb2.PlatformSpec())
    return spec, platform


def heavy(name: str) -> bool:
    step = name.removeprefix("exec-")
    return step in HEAVY_STEPS or step.startswith("secure-aggregate")


def test_every_job_file_has_a_gpu_variant_shipped_in_the_chart() -> None:
    stems = sorted(p.stem for p in (ROOT / "pipelines" / "jobs").glob("*.yaml"))
    assert [p.stem for p in GPU_FILES] == [f"{s}-gpu" for s in stems]
    chart = ROOT / catalog.CHART_PIPELINES
    for path in GPU_FILES:
        spec, _ = parsed(path)
        assert spec.pipeline_info.name == f"fedtune-{path.stem}"
        assert (chart / f"{spec.pipeline_info.name}.yaml").read_text() == path.read_text()


@pytest.mark.parametrize("path", GPU_FILES, ids=lambda p: p.stem)
def test_heavy_steps_ask_for_a_gpu_and_tolerate_the_gpu_taint(path: Path) -> None:
    spec, platform = parsed(path)
    executors = spec.deployment_spec.fields["executors"]
    k8s = json_format.MessageToDict(platform.platforms["kubernetes"])["deploymentSpec"]["executors"]
    seen_heavy = 0
    for name, value in executors.struct_value.fields.items():
        container = json_format.MessageToDict(value)["container"]
        accelerator = container.get("resources", {}).get("accelerator")
        tolerations = k8s.get(name, {}).get("tolerations", [])
        if heavy(name):
            seen_heavy += 1
            assert accelerator == {
                "count": "1", "resourceCount": "1",
                "type": "nvidia.com/gpu", "resourceType": "nvidia.com/gpu",
            }, name
            assert container["image"] == tenant_image(), name
            assert TOLERATION in tolerations, name
        else:
            assert accelerator is None and tolerations == [], name
            assert container["image"] == provider_image(), name
    # server-init, (secure-)aggregate, final-broadcast, export-and-register
    assert seen_heavy == 4


@pytest.mark.parametrize("path", GPU_FILES, ids=lambda p: p.stem)
def test_the_variants_default_job_runs_on_it_and_a_cpu_job_is_sent_to_the_plain_one(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = next(yaml.safe_load_all(path.read_text()))
    init = spec["deploymentSpec"]["executors"]["exec-server-init"]["container"]
    marker = next(e["value"] for e in init["env"] if e["name"] == PROVIDER_ENV)
    monkeypatch.setenv(PROVIDER_ENV, marker)  # as in the compiled server-init pod
    default = spec["root"]["inputDefinitions"]["parameters"]["job_config"]["defaultValue"]
    family = path.stem.removesuffix("-gpu").removesuffix("-secure")
    secure = "-secure" in path.stem
    job = resolve_job(RunForm(job_config=default, kfp_run_id="r1"), family, secure)
    assert job.provider.gpu == 1
    # The plain pipeline's job (no provider section) is refused with the pipeline to use.
    plain = json.loads(default)
    plain.pop("provider")
    from fedtune.core.errors import ConfigError

    with pytest.raises(ConfigError, match="differs from the one this pipeline was compiled with"):
        resolve_job(RunForm(job_config=json.dumps(plain), kfp_run_id="r1"), family, secure)


def test_the_plain_pipelines_ask_for_no_gpu() -> None:
    for path in sorted(set(COMPILED.glob("*.yaml")) - set(GPU_FILES)):
        assert "accelerator" not in path.read_text() and "nvidia.com/gpu\n" not in path.read_text()


def test_a_job_of_the_other_variant_is_sent_to_the_matching_gpu_pipeline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fedtune.core.errors import ConfigError

    spec = next(yaml.safe_load_all((COMPILED / "fedit-gpu.yaml").read_text()))
    init = spec["deploymentSpec"]["executors"]["exec-server-init"]["container"]
    monkeypatch.setenv(PROVIDER_ENV, next(e["value"] for e in init["env"] if e["name"] == PROVIDER_ENV))
    job = json.loads(spec["root"]["inputDefinitions"]["parameters"]["job_config"]["defaultValue"])
    job["secure_aggregation"] = {"enabled": True}
    with pytest.raises(ConfigError) as info:
        resolve_job(RunForm(job_config=json.dumps(job), kfp_run_id="r1"), "fedit", False)
    assert "the 'fedtune-fedit-gpu' pipeline runs rounds without" in str(info.value)
    assert "'fedtune-fedit-secure-gpu'" in info.value.fix
