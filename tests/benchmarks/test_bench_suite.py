"""The task suite: deterministic files, non-IID tenants, drifted public set, clean test set."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from fedtune.benchmarks.suite import (
    SuiteSpec,
    build_suite,
    category_shares,
    load_manifest,
    write_suite,
)
from fedtune.core.errors import ConfigError, DataError
from fedtune.data.synthetic import CATEGORIES

# The default pretraining corpus (12,000 records and 3,000 demonstrations) at half and a tenth.
SMALL = SuiteSpec(tenants=3, private_records=300, public_records=200, test_per_category=10,
                  pretrain_records=6000, self_instruct_records=300)


def _shares(records: list[dict[str, str]]) -> dict[str, float]:
    counts = Counter(r["category"] for r in records)
    return {c: counts[c] / len(records) for c in CATEGORIES}


def _distance(a: dict[str, float], b: dict[str, float]) -> float:
    """Total variation distance between two category distributions."""
    return 0.5 * sum(abs(a[c] - b[c]) for c in CATEGORIES)


def test_same_spec_same_bytes_other_seed_other_data() -> None:
    assert build_suite(SMALL).files() == build_suite(SMALL).files()
    other = build_suite(SuiteSpec(**{**SMALL.to_json(), "seed": 1}))
    assert other.files()["test.jsonl"] != build_suite(SMALL).files()["test.jsonl"]


def test_tenants_are_non_iid_and_public_set_drifts() -> None:
    suite = build_suite(SMALL)
    pooled = _shares(suite.central)
    # Dirichlet(0.5): every tenant's task mix is far from the pooled one.
    assert min(_distance(_shares(r), pooled) for r in suite.tenants.values()) > 0.1
    assert _distance(_shares(suite.public), pooled) > 0.15
    assert sorted(map(str, suite.central)) == sorted(
        str(r) for records in suite.tenants.values() for r in records
    )


def test_test_set_is_balanced_and_unseen() -> None:
    suite = build_suite(SMALL)
    assert Counter(r["category"] for r in suite.test) == {c: 10 for c in CATEGORIES}
    seen = {(r["instruction"], r["context"]) for r in suite.central + suite.pretrain}
    assert not seen & {(r["instruction"], r["context"]) for r in suite.test}


def test_pretraining_corpus_extends_the_public_set_with_its_mixture() -> None:
    suite = build_suite(SMALL)
    assert suite.pretrain[: len(suite.public)] == suite.public
    assert len(suite.pretrain) == len(suite.public) + SMALL.pretrain_records + SMALL.self_instruct_records
    extra = suite.pretrain[len(suite.public) : len(suite.public) + SMALL.pretrain_records]
    # The scarce classify records are not drawn again; the rest follows the public mixture.
    assert not any(r["category"] == "classify" for r in extra)
    assert _distance(_shares(extra), _shares([r for r in suite.public if r["category"] != "classify"])) < 0.05


def test_pathological_split_gives_each_tenant_k_categories() -> None:
    suite = build_suite(SuiteSpec(tenants=5, private_records=500, partition="pathological", k=2))
    for records in suite.tenants.values():
        assert len({r["category"] for r in records}) == 2


def test_written_suite_round_trips_and_detects_tampering(tmp_path: Path) -> None:
    suite = build_suite(SMALL)
    manifest = write_suite(suite, tmp_path)
    assert load_manifest(tmp_path) == manifest
    shares = category_shares(manifest, "tenant-1")
    assert shares == pytest.approx(_shares(suite.tenants["tenant-1"]))
    (tmp_path / "tenant-2.jsonl").write_text("{}\n")
    with pytest.raises(DataError, match="tenant-2.jsonl"):
        load_manifest(tmp_path)


def test_missing_suite_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_manifest(tmp_path)
    assert "fedtune bench pretrain" in info.value.fix


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"tenants": 0}, "tenants=0"),
        ({"partition": "random"}, "partition='random'"),
        ({"test_per_category": 0}, "test_per_category=0"),
        ({"self_instruct_records": -1}, "self_instruct_records=-1"),
    ],
)
def test_invalid_spec_is_a_config_error(changes: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        build_suite(SuiteSpec(**{**SMALL.to_json(), **changes}))


def test_too_many_classify_records_is_a_data_error() -> None:
    # The classify lexicon has 180 distinct records; asking for more must fail clearly.
    with pytest.raises(DataError, match="classify"):
        build_suite(SuiteSpec(private_records=2000, tenant_mixture={"classify": 1.0}, tenants=2))


def test_results_name_the_constant_answer_em_recorded_or_rebuilt_from_the_suite_spec() -> None:
    """A quality results file gives the test set's constant-answer EM: as recorded (the
    manifest has it), or, for results recorded before it did, from the test set rebuilt from
    the recorded spec, only when that is the recorded test set (its sha256)."""
    from fedtune.benchmarks.suite import constant_answer_em, recorded_constant_answers

    suite = build_suite(SMALL)
    manifest = suite.manifest()
    expected = constant_answer_em(suite.test)
    assert manifest["test"]["constant_answer_em"] == expected
    recorded = {"suite": {"spec": manifest["spec"], "test": manifest["test"]},
                "split": {"files": {"test.jsonl": manifest["files"]["test.jsonl"]}}}
    assert recorded_constant_answers(recorded) == expected
    older = json.loads(json.dumps(recorded))
    del older["suite"]["test"]["constant_answer_em"]
    assert recorded_constant_answers(older) == expected  # rebuilt, digest checked
    older["split"]["files"]["test.jsonl"] = "0" * 64  # another test set: not guessed
    assert recorded_constant_answers(older) is None
    older["suite"]["spec"] = {**manifest["spec"], "no_such_field": 1}  # a spec this code cannot read
    assert recorded_constant_answers(older) is None
    assert recorded_constant_answers({"runs": []}) is None
