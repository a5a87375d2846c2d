"""JobConfig validation: every problem reported at once, with its field path and a fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from fedtune.algorithms.fedopt.config import FedOptConfig
from fedtune.config import load_job, parse_job
from fedtune.core.errors import ConfigError

VALID = {
    "name": "demo",
    "model": {"source": "tiny", "arch": "llama"},
    "algorithm": {"name": "fedavg"},
    "tenants": [
        {"name": "tenant-a", "data_uri": "a.jsonl"},
        {"name": "tenant-b", "data_uri": "s3://bucket/b.jsonl"},
    ],
}


def _with(**changes: object) -> dict:
    job = dict(VALID)
    job.update(changes)
    return job


def test_valid_job_parses_with_defaults(tmp_path: Path) -> None:
    job = parse_job(VALID, base_dir=tmp_path)
    assert job.sampled_per_round == 2
    assert job.tenants[0].data_uri == str(tmp_path / "a.jsonl")  # relative -> job dir
    assert job.tenants[1].data_uri == "s3://bucket/b.jsonl"  # URIs untouched
    assert job.tenants[0].k8s_namespace == "tenant-a"
    with pytest.raises(ValidationError, match="frozen"):
        job.rounds = 5


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"typo": 1}, "typo: Extra inputs are not permitted"),
        ({"algorithm": {"name": "fedsgdx"}}, "algorithm.name: unknown algorithm 'fedsgdx'; the installed"),
        ({"name": "Tenant_A"}, "name: 'Tenant_A' is not a DNS-1123 label"),
        (
            {"tenants": [{"name": "UPPER", "data_uri": "x"}]},
            "tenants.0.name: 'UPPER' is not a DNS-1123 label",
        ),
        ({"tenants": [{"name": "a"}]}, "tenants.0.data_uri: Field required"),
        ({"rounds": 0}, "rounds: Input should be greater than or equal to 1"),
        ({"clients_per_round": 3}, "clients_per_round=3 exceeds the 2 tenants"),
        ({"min_clients": 3}, "min_clients=3 exceeds clients_per_round=2"),
        (
            {"algorithm": {"name": "fedadam", "server_optimizer": "yogi"}},
            "conflicts with name='fedadam'",
        ),
        (
            {"training": {"local_steps": None}},
            "set exactly one of local_steps and local_epochs",
        ),
    ],
    ids=[
        "unknown-field",
        "unknown-algorithm",
        "bad-job-name",
        "bad-tenant-name",
        "missing-data-uri",
        "zero-rounds",
        "too-many-per-round",
        "quorum-too-high",
        "optimizer-conflict",
        "steps-and-epochs",
    ],
)
def test_bad_config_is_reported_with_path(change: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_job(_with(**change))
    assert expected in str(info.value)
    assert info.value.exit_code == 2


def test_every_problem_is_reported_at_once() -> None:
    bad = _with(typo=1, rounds=0, name="BAD", algorithm={"name": "nope"})
    with pytest.raises(ConfigError) as info:
        parse_job(bad)
    message = str(info.value)
    assert "4 problem(s)" in message
    for path in ("typo:", "rounds:", "name:", "algorithm.name:"):
        assert path in message


def test_duplicate_tenants_and_shared_namespaces_are_rejected() -> None:
    tenants = [{"name": "a", "data_uri": "x"}, {"name": "a", "data_uri": "y"}]
    with pytest.raises(ConfigError, match=r"repeated: \['a'\]"):
        parse_job(_with(tenants=tenants))
    tenants = [
        {"name": "a", "data_uri": "x", "namespace": "shared"},
        {"name": "b", "data_uri": "y", "namespace": "shared"},
    ]
    with pytest.raises(ConfigError, match="must not share a namespace"):
        parse_job(_with(tenants=tenants))


def test_fedopt_names_imply_their_optimizer() -> None:
    assert FedOptConfig(name="fedyogi").optimizer == "yogi"
    assert FedOptConfig(name="fedopt").optimizer == "sgd"
    assert FedOptConfig(name="fedopt", server_optimizer="adam").optimizer == "adam"


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: demo\nmodel: {source: tiny\nrounds: 3\n")
    with pytest.raises(ConfigError, match=r"malformed YAML at line \d+"):
        load_job(path)


def test_missing_job_file_and_non_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_job(tmp_path / "nope.yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_job(path)


def test_shipped_examples_validate() -> None:
    for path in sorted(Path("examples").glob("*.yaml")):
        job = load_job(path)
        assert job.name == yaml.safe_load(path.read_text())["name"]


# -- SCAFFOLD's optimizer and the sample cap (boundary issue) ----------------------------------
def _scaffold(**training: object) -> dict[str, object]:
    return {
        "name": "scaffold-job",
        "model": {"source": "tiny"},
        "algorithm": {"name": "scaffold"},
        "training": {"local_steps": 2, **training},
        "tenants": [{"name": "a", "data_uri": "a.jsonl"}],
    }


def test_scaffold_with_adamw_clients_is_a_config_error_with_the_fix() -> None:
    with pytest.raises(ConfigError) as info:
        parse_job(_scaffold(optimizer="adamw"))
    assert "assumes plain SGD" in str(info.value) and "allow_non_sgd_optimizer" in str(info.value)


def test_scaffold_runs_with_sgd_or_an_explicit_override() -> None:
    assert parse_job(_scaffold(optimizer="sgd")).algorithm.name == "scaffold"
    raw = _scaffold(optimizer="adamw")
    raw["algorithm"] = {"name": "scaffold", "allow_non_sgd_optimizer": True}
    assert parse_job(raw).training.optimizer == "adamw"


def test_a_tenants_declared_bound_overrides_the_job_cap() -> None:
    raw = _scaffold(optimizer="sgd")
    raw["tenants"] = [{"name": "a", "data_uri": "a.jsonl", "max_samples": 50}, {"name": "b", "data_uri": "b.jsonl"}]
    raw["limits"] = {"max_samples_per_tenant": 1000}
    job = parse_job(raw)
    assert [job.limits.sample_cap(t) for t in job.tenants] == [50, 1000]
