"""Shared checks of the component folders (``components/<name>/``) and step fixtures for them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from fedtune.config import JobConfig
from fedtune.entrypoints import common, configure_round, server_init
from fedtune.pipelines.catalog import repo_root
from fedtune.pipelines.run_form import JOB_SCOPE, RunForm, family_of

COMPONENTS_DIR = repo_root() / "components"
_PARAMETER_TYPES = {
    "STRING": "String",
    "NUMBER_INTEGER": "Integer",
    "NUMBER_DOUBLE": "Float",
    "BOOLEAN": "Boolean",
    "LIST": "List",
}


def spec_interface(name: str) -> dict[str, dict[str, str]]:
    """Inputs and outputs of ``components/<name>/component.yaml`` as ``{name: type}``."""
    spec = yaml.safe_load((COMPONENTS_DIR / name / "component.yaml").read_text())
    (component,) = spec["components"].values()

    def kinds(section: dict[str, Any]) -> dict[str, str]:
        out = {
            k: _PARAMETER_TYPES[v["parameterType"]]
            for k, v in section.get("parameters", {}).items()
        }
        for key, value in section.get("artifacts", {}).items():
            kind = value["artifactType"]["schemaTitle"].removeprefix("system.")
            out[key] = f"List[{kind}]" if value.get("isArtifactList") else kind
        return out

    return {
        "inputs": kinds(component.get("inputDefinitions", {})),
        "outputs": kinds(component.get("outputDefinitions", {})),
    }


def assert_folder_consistent(name: str) -> None:
    """metadata.yaml and README.md describe exactly what component.yaml declares."""
    folder = COMPONENTS_DIR / name
    meta = yaml.safe_load((folder / "metadata.yaml").read_text())
    declared = {
        kind: {k: v["type"] for k, v in meta[kind].items()} for kind in ("inputs", "outputs")
    }
    assert meta["name"] == name
    assert declared == spec_interface(name)
    readme = (folder / "README.md").read_text()
    for kind in ("inputs", "outputs"):
        for key in meta[kind]:
            assert f"`{key}`" in readme, f"{name}/README.md does not document {key}"
    assert (
        f"fedtune.entrypoints.{name}" in readme
        and meta["entrypoint"] == f"fedtune.entrypoints.{name}"
    )


def initialised(tmp_path: Path, job: JobConfig, rounds_configured: int = 0) -> Path:
    """Run server init (and configure rounds 1..n) through the component bodies; return the job artifact."""
    job_path = tmp_path / "artifacts" / "job"
    server_init.component(
        RunForm(job_config=json.dumps(job.model_dump(mode="json")), resume_run_id=JOB_SCOPE),
        family_of(job.algorithm.name),
        str(job_path),
        str(tmp_path / "artifacts" / "state-0"),
        job.secure_aggregation.enabled,  # the pipeline variant that runs the job
    )
    for round_index in range(1, rounds_configured + 1):
        configure_round.component(
            str(job_path), round_index, str(tmp_path / "artifacts" / f"b{round_index}")
        )
    return job_path


def marker(path: Path) -> dict[str, Any]:
    """A marker written by a component body."""
    return common.read_marker(path)
