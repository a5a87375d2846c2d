"""Bases that ship inside the package (``builtin://NAME``) and the prompt template of saved models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedtune.core.errors import ModelError
from fedtune.models.builtin_bases import SCHEME, available, base_dir
from fedtune.models.loading import load_pretrained, save_pretrained_dir
from fedtune.models.prompt_frame import PROMPT_FILE, framed, read_template

BASES = available()
#: What a shipped base may weigh in all: it is in every install and every image.
MAX_BYTES = 8_000_000


def test_the_quickstart_base_ships() -> None:
    assert "quickstart" in BASES


@pytest.mark.parametrize("name", BASES)
def test_every_shipped_base_says_how_it_was_made_and_is_small(name: str) -> None:
    from fedtune.benchmarks.pretrain import ModelShape, PretrainSpec, spec_hash

    folder = Path(base_dir(SCHEME + name))
    report = json.loads((folder / "fedtune_pretrain.json").read_text("utf-8"))
    spec = PretrainSpec(**{**report["spec"], "shape": ModelShape(**report["spec"]["shape"])})
    assert report["spec_hash"] == spec_hash(spec, report["corpus_sha256"])
    assert len(report["loss_curve"]) >= 10 and report["machine"]["torch"]
    assert sum(p.stat().st_size for p in folder.iterdir()) <= MAX_BYTES
    assert not list(folder.glob("*.bin"))  # safetensors only


@pytest.mark.parametrize("name", BASES)
def test_a_shipped_base_loads_with_the_shape_its_report_names(name: str) -> None:
    model, tokenizer = load_pretrained(SCHEME + name)
    shape = json.loads((Path(base_dir(SCHEME + name)) / "fedtune_pretrain.json").read_text())["spec"]["shape"]
    assert model.config.hidden_size == shape["hidden_size"]
    assert model.config.num_hidden_layers == shape["num_layers"]
    assert len(tokenizer) == model.config.vocab_size


def test_an_unknown_base_is_refused_with_the_names_there_are() -> None:
    with pytest.raises(ModelError, match="no base named 'nope'") as info:
        load_pretrained("builtin://nope")
    assert "builtin://quickstart" in info.value.fix


def test_a_builtin_base_compiles_for_a_cluster_and_a_local_folder_does_not(tmp_path: Path) -> None:
    from fedtune.config import parse_job
    from fedtune.pipelines.builder import DEFAULT_CLUSTER
    from fedtune.pipelines.compiling import cluster_problems

    def problems(uri: str) -> list[str]:
        raw = {
            "name": "demo",
            "model": {"source": "pretrained", "uri": uri, "tenant_uri": uri},
            "algorithm": {"name": "fedavg"},
            "tenants": [{"name": "tenant-a", "data_uri": "s3://b/a.jsonl"}],
        }
        job = parse_job(raw, base_dir=tmp_path)
        return [p for p in cluster_problems(job, DEFAULT_CLUSTER) if p.startswith("model.uri")]

    assert problems("builtin://quickstart") == []
    assert problems("weights") and "set an s3:// URI" in problems("weights")[0]


def test_every_saved_model_carries_its_training_prompt_and_serving_frames_prompts_with_it(
    tmp_path: Path,
) -> None:
    from fedtune.data.formats import to_example
    from fedtune.data.templates import render_prompt

    model, tokenizer = load_pretrained("builtin://quickstart")
    out = save_pretrained_dir(model, tokenizer, tmp_path / "m")
    template = read_template(out)
    assert template is not None and (out / PROMPT_FILE).is_file()
    instruction = "Is 'plum' an animal, a fruit or a color?"
    trained = render_prompt(to_example({"instruction": instruction, "response": "fruit"}))
    assert framed(instruction, template) == trained
    assert framed(trained, template) == trained  # already framed: kept
    assert framed(instruction, None) == instruction  # older models: as sent
