"""Strict scalars, duplicate keys, finite floats and store URI schemes in job files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fedtune.config import load_job, parse_job
from fedtune.core.errors import ConfigError


def job(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "strict",
        "workdir": "/tmp/strict-work",
        "model": {"source": "tiny"},
        "algorithm": {"name": "fedavg"},
        "tenants": [{"name": "a", "data_uri": "/tmp/a.jsonl"}, {"name": "b", "data_uri": "/tmp/b.jsonl"}],
    }
    raw.update(overrides)
    return raw


def problem(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_job(raw)
    assert info.value.exit_code == 2
    return str(info.value)


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        ({"seed": True}, ["seed", "boolean true", "write a number"]),
        ({"seed": "7"}, ["seed", "'7'", "without quotes"]),
        ({"rounds": 2.5}, ["rounds", "2.5"]),
        ({"rounds": 2.0}, ["rounds", "whole number"]),
        ({"training": {"batch_size": False}}, ["batch_size", "boolean false"]),
        ({"training": {"lr": float("nan")}}, ["training.lr", "finite number"]),
        ({"training": {"lr": float("inf")}}, ["training.lr", "finite number"]),
    ],
)
def test_strict_scalars(overrides: dict[str, Any], fragments: list[str]) -> None:
    message = problem(job(**overrides))
    for fragment in fragments:
        assert fragment in message
    assert "<= 10" not in message


def test_float_written_as_yaml_string_is_still_a_float() -> None:
    assert parse_job(job(training={"lr": "1e-3"})).training.lr == 1e-3  # YAML reads 1e-3 as str


@pytest.mark.parametrize("field", ["store_uri", "data_uri"])
def test_unsupported_store_scheme_is_refused(field: str) -> None:
    raw = job()
    raw["tenants"][0][field] = "gs://bucket/tenant-a"
    message = problem(raw)
    assert f"tenants.0.{field}" in message and "'gs://'" in message and "s3://" in message


def test_unsupported_provider_store_scheme_is_refused() -> None:
    message = problem(job(provider_store_uri="http://example.com/x", exchange_uri="s3://b/x"))
    assert "provider_store_uri" in message and "'http://'" in message


def test_duplicate_yaml_keys_are_an_error(tmp_path: Path) -> None:
    text = yaml.safe_dump(job()) + "seed: 3\nseed: 4\n"
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert "duplicate key 'seed'" in str(info.value) and str(path) in str(info.value)
    nested = "name: x\ntraining:\n  lr: 0.1\n  lr: 0.2\n"
    path.write_text(nested)
    with pytest.raises(ConfigError, match="duplicate key 'lr' at line 4"):
        load_job(path)
