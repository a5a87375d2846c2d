"""Parameter flattening, truncation and secret filtering (no MLflow needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedtune.tracking import flatten, is_secret_key, loggable_params, redact


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("hf_token", True),
        ("store.aws_secret_access_key", True),
        ("apiKey", True),
        ("api-key", True),
        ("db.password", True),
        ("client_secret", True),
        ("credentials", True),
        ("max_new_tokens", False),
        ("tokenizer", False),
        ("train.keys_per_batch", False),
        ("monkey_patch", False),
        ("lora.r", False),
    ],
)
def test_secret_keys_are_recognised_by_word(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_nested_params_are_flattened_stringified_and_secrets_dropped() -> None:
    params = {
        "algorithm": {"name": "fedavg", "lora": {"r": 8, "alpha": 16.0}},
        "store": {"endpoint": "http://minio:9000", "aws_secret_access_key": "s3cr3t"},
        "hf_token": "hf_abc",
        "tenants": ["a", "b"],
        "seed": None,
    }
    assert loggable_params(params) == {
        "algorithm.name": "fedavg",
        "algorithm.lora.r": "8",
        "algorithm.lora.alpha": "16.0",
        "store.endpoint": "http://minio:9000",
        "tenants": "['a', 'b']",
        "seed": "None",
    }


def test_long_values_are_truncated_to_the_limit() -> None:
    out = loggable_params({"prompt": "x" * 7000}, max_value_length=6000)
    assert len(out["prompt"]) == 6000 and out["prompt"].endswith("...")


def test_flatten_keeps_leaves() -> None:
    assert flatten({"a": {"b": {"c": 1}}, "d": [1, 2]}) == {"a.b.c": 1, "d": [1, 2]}


def test_redact_removes_secret_entries_at_any_depth() -> None:
    obj = {"s3": {"secret_key": "x", "bucket": "b"}, "list": [{"token": "t", "n": 1}]}
    assert redact(obj) == {"s3": {"bucket": "b"}, "list": [{"n": 1}]}


def test_importing_the_tracking_package_does_not_import_mlflow() -> None:
    code = "import sys, fedtune.tracking; sys.exit('mlflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
