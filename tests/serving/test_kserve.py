"""Rendering the InferenceService: physical storage URIs, names, LoRA args, schema checks."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from fedtune.core.errors import ConfigError, ModelError
from fedtune.serving.kserve import (
    KServeOptions,
    ServedModel,
    default_name,
    physical_storage_uri,
    render_inferenceservice,
    to_yaml,
)
from fedtune.serving.schema import inferenceservice_problems, validate_inferenceservice

REPO = Path(__file__).resolve().parents[2]
LLAMA = ServedModel(
    registered_name="Quickstart_Model",
    version=3,
    alias="champion",
    storage_uri="s3://fedtune-mlflow/artifacts/1/models/m-1/artifacts/artifacts/model",
    model_type="llama",
    lora_rank=8,
    audit=0.125,
)
GPT2 = ServedModel("chat", 1, "champion", "gs://b/m/artifacts/model", "gpt2", lora_rank=4)


@pytest.mark.parametrize(
    ("location", "destination", "expected"),
    [
        ("s3://bucket/1/models/m-1/artifacts", None, "s3://bucket/1/models/m-1/artifacts"),
        ("gs://bucket/x/", None, "gs://bucket/x"),
        (
            "mlflow-artifacts:/1/models/m-2/artifacts",
            "s3://fedtune-mlflow/artifacts",
            "s3://fedtune-mlflow/artifacts/1/models/m-2/artifacts",
        ),
        (
            "mlflow-artifacts://mlflow.fedtune:5000/1/models/m-2/artifacts",
            "s3://b/p/",
            "s3://b/p/1/models/m-2/artifacts",
        ),
    ],
)
def test_physical_storage_uri(location: str, destination: str | None, expected: str) -> None:
    assert physical_storage_uri(location, destination) == expected


@pytest.mark.parametrize(
    ("location", "destination", "message", "fix"),
    [
        ("mlflow-artifacts:/1/models/m", None, "proxied", "--artifacts-destination"),
        ("mlflow-artifacts:/1/models/m", "/data/artifacts", "not an object-store URI", "s3"),
        (
            "file:///home/me/.fedtune/mlartifacts/models/m",
            None,
            "this machine's disk",
            "object store",
        ),
        ("/home/me/mlartifacts/models/m", None, "this machine's disk", "object store"),
        ("dbfs:/databricks/m", None, "scheme 'dbfs'", "s3"),
    ],
)
def test_unfetchable_locations_are_refused(
    location: str, destination: str | None, message: str, fix: str
) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        physical_storage_uri(location, destination)
    assert (destination or location) in str(info.value)  # the offending value is shown
    assert fix in info.value.fix


@pytest.mark.parametrize(
    ("name", "alias", "expected"),
    [
        ("quickstart", "champion", "quickstart-champion"),
        ("Team_Model.v2", "prod", "team-model-v2-prod"),
        ("x" * 80, "champion", "x" * 63),
    ],
)
def test_default_name_is_a_dns_label(name: str, alias: str, expected: str) -> None:
    assert default_name(name, alias) == expected


def test_rendered_manifest_serves_the_physical_directory_and_validates() -> None:
    doc = render_inferenceservice(LLAMA, KServeOptions(namespace="fedtune-serving"))
    validate_inferenceservice(doc)
    meta, model = doc["metadata"], doc["spec"]["predictor"]["model"]
    assert meta["name"] == "quickstart-model-champion"
    assert meta["namespace"] == "fedtune-serving"
    assert meta["annotations"]["fedtune.io/registered-model"] == "Quickstart_Model"
    assert meta["annotations"]["fedtune.io/model-version"] == "3"
    assert meta["annotations"]["fedtune.io/audit-memorization"] == "0.125"
    assert model["modelFormat"] == {"name": "huggingface"}
    assert model["storageUri"] == LLAMA.storage_uri
    assert model["args"] == ["--model_name=quickstart-model-champion"]
    assert model["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert model["securityContext"]["runAsNonRoot"] is True
    assert "runtime" not in model


def test_lora_args_point_vllm_at_the_adapter_folder() -> None:
    doc = render_inferenceservice(LLAMA, KServeOptions(name="chat", lora=True, runtime="kserve-hf"))
    validate_inferenceservice(doc)
    model = doc["spec"]["predictor"]["model"]
    assert model["args"] == [
        "--model_name=chat",
        "--enable-lora",
        "--lora-modules",
        "chat-lora=/mnt/models/adapter",
    ]
    assert model["runtime"] == "kserve-hf"
    big = render_inferenceservice(
        ServedModel(**{**LLAMA.__dict__, "lora_rank": 48}), KServeOptions(name="chat", lora=True)
    )
    assert big["spec"]["predictor"]["model"]["args"][-1] == "--max-lora-rank=64"


def test_lora_is_refused_for_non_llama_models_and_without_adapter() -> None:
    with pytest.raises(ConfigError, match="Llama-architecture.*'gpt2'"):
        render_inferenceservice(GPT2, KServeOptions(lora=True))
    no_adapter = ServedModel(**{**LLAMA.__dict__, "lora_rank": None})
    with pytest.raises(ModelError, match="no adapter"):
        render_inferenceservice(no_adapter, KServeOptions(lora=True))
    too_big = ServedModel(**{**LLAMA.__dict__, "lora_rank": 1024})
    with pytest.raises(ModelError, match="exceeds vLLM's largest"):
        render_inferenceservice(too_big, KServeOptions(lora=True))


def test_cpu_only_predictor_has_no_gpu_and_extra_fields_render() -> None:
    doc = render_inferenceservice(GPT2, KServeOptions(gpus=0, service_account="storage-reader"))
    validate_inferenceservice(doc)
    predictor = doc["spec"]["predictor"]
    assert predictor["serviceAccountName"] == "storage-reader"
    assert "nvidia.com/gpu" not in predictor["model"]["resources"]["limits"]


@pytest.mark.parametrize(
    ("options", "option"),
    [
        (KServeOptions(name="Chat_Model"), "--isvc-name"),
        (KServeOptions(namespace="a" * 64), "--namespace"),
    ],
)
def test_invalid_kubernetes_names_are_refused(options: KServeOptions, option: str) -> None:
    with pytest.raises(ConfigError, match=option):
        render_inferenceservice(LLAMA, options)


def test_schema_rejects_typos_and_wrong_types_with_every_problem() -> None:
    doc = render_inferenceservice(LLAMA, KServeOptions())
    broken = copy.deepcopy(doc)
    model = broken["spec"]["predictor"]["model"]
    model["storageURI"] = model.pop("storageUri")
    model["securityContext"]["runAsUser"] = "root"
    problems = inferenceservice_problems(broken)
    assert any("storageURI" in p for p in problems)
    assert any(p.startswith("spec.predictor.model.securityContext.runAsUser") for p in problems)
    with pytest.raises(ConfigError, match="storageURI") as info:
        validate_inferenceservice(broken)
    assert "runAsUser" in str(info.value)
    local = copy.deepcopy(doc)
    local["spec"]["predictor"]["model"]["storageUri"] = "file:///tmp/model"
    assert inferenceservice_problems(local)


def test_yaml_round_trips() -> None:
    import yaml

    doc = render_inferenceservice(LLAMA, KServeOptions(lora=True))
    assert yaml.safe_load(to_yaml(doc)) == doc


def test_shipped_schema_is_the_chart_schema_with_kubernetes_types_bundled() -> None:
    """The runtime copy must not drift from the schema the chart tests validate against."""
    pytest.importorskip("kubernetes_validate")
    from fedtune.serving.schema_bundle import (
        TARGET,
        bundle,
        kubernetes_definitions,
        render,
    )

    source = json.loads((REPO / "tests/charts/schemas/inferenceservice-v1beta1.json").read_text())
    expected = render(bundle(source, kubernetes_definitions()))
    assert TARGET.read_text() == expected, "run: python -m fedtune.serving.schema_bundle"
    assert "https://kubernetes.io" not in json.dumps(json.loads(expected)["$defs"])


def test_bundler_keeps_fields_named_description() -> None:
    from fedtune.serving.schema_bundle import bundle

    defs = {
        "$defs": {
            "T": {
                "description": "drop me",
                "type": "object",
                "properties": {"description": {"type": "string", "description": "x"}},
            }
        }
    }
    schema = {"properties": {"t": {"$ref": "https://kubernetes.io/api/_definitions.json#/$defs/T"}}}
    out = bundle(schema, defs)
    assert out["properties"]["t"] == {"$ref": "#/$defs/T"}
    assert out["$defs"]["T"] == {
        "type": "object",
        "properties": {"description": {"type": "string"}},
    }


def test_serving_data_files_are_package_data() -> None:
    """`pip install .` (the images) must ship the schema, not only an editable checkout."""
    import fnmatch
    import tomllib

    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["fedtune"]
    root = REPO / "src" / "fedtune"
    data = [
        p.relative_to(root).as_posix()
        for p in (root / "serving").rglob("*")
        if p.is_file() and p.suffix not in {".py", ".pyc"}
    ]
    assert data
    uncovered = [d for d in data if not any(fnmatch.fnmatch(d, pat) for pat in patterns)]
    assert not uncovered, f"add to [tool.setuptools.package-data] fedtune: {uncovered}"
