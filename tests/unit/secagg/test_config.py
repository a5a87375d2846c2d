"""The secure_aggregation job option: off by default, bad values refused with a fix."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from fedtune.config import parse_job
from fedtune.core.errors import ConfigError
from fedtune.engines.fingerprint import config_fingerprint, legacy_fingerprint
from tests.integration.conftest import tiny_job_dict

FIVE = [{"name": f"tenant-{x}", "data_uri": f"{x}.jsonl"} for x in "abcde"]


def job(tmp_path: Path, **overrides):  # type: ignore[no-untyped-def]
    return parse_job(tiny_job_dict(tmp_path, **overrides))


def test_off_by_default_and_the_fingerprint_of_older_jobs_holds(tmp_path: Path) -> None:
    plain = job(tmp_path)
    assert not plain.secure_aggregation.enabled
    dump = plain.model_dump(
        mode="json",
        exclude={
            "rounds", "engine", "tracking", "audit", "provider", "storage", "export",
            "secure_aggregation", "differential_privacy",
        },
    )
    for name in ("device", "precision", "gradient_checkpointing", "compile", "kernels"):
        del dump["training"][name]  # at their defaults: as before the fields existed
    for tenant in dump["tenants"]:
        del tenant["identity_key"], tenant["dp_sgd"]  # unset: as before the fields existed
    # The limits a job had then (later ones are left out of the legacy form).
    dump["limits"] = {k: dump["limits"][k] for k in ("max_update_bytes", "max_samples_per_tenant")}
    expected = hashlib.sha256(json.dumps(dump, sort_keys=True).encode()).hexdigest()
    assert legacy_fingerprint(plain) == expected  # as before the option existed
    on = job(tmp_path, secure_aggregation={"enabled": True})
    assert config_fingerprint(plain) != config_fingerprint(on)
    assert on.secure_aggregation.threshold_for(3) == 2


@pytest.mark.parametrize(
    ("section", "overrides", "message"),
    [
        ({"enabled": True, "threshold": 4}, {}, "secure_aggregation.threshold=4 must be in 2..3 for 3 sampled"),
        ({"enabled": True, "threshold": 1}, {}, "secure_aggregation.threshold=1 must be in 2..3"),
        ({"enabled": True, "frac_bits": 60}, {}, "frac_bits"),
        ({"enabled": True, "neighbours": 3}, {}, "secure_aggregation.neighbours=3 must be an even number"),
        ({"enabled": True, "neighbours": 2, "threshold": 4}, {"tenants": FIVE},
         "secure_aggregation.threshold=4 must be in 2..3 for neighbourhoods of 3 of 5 sampled tenants"),
        ({"enabled": True, "threshold": 6}, {"tenants": FIVE}, "threshold=6 must be in 3..5 for 5 sampled tenants"),
        ({"enabled": True}, {"tenants": [{"name": "tenant-a", "data_uri": "a.jsonl", "identity_key": "zz"}]},
         "identity_key"),
        # One update's sum is that update: nothing left to hide it in.
        ({"enabled": True}, {"clients_per_round": 1, "min_clients": 1},
         "secure_aggregation is enabled with 1 sampled tenant per round"),
        ({"enabled": True}, {"tenants": [{"name": "tenant-a", "data_uri": "a.jsonl"}], "min_clients": 1},
         "the sum the provider unmasks would be that tenant's own update"),
    ],
)
def test_bad_settings_are_refused(tmp_path: Path, section, overrides, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises((ConfigError, ValueError)) as info:
        job(tmp_path, secure_aggregation=section, **overrides)
    assert message in str(info.value)


def test_every_algorithm_but_fedmkt_aggregates_a_sum() -> None:
    """FedMKT exchanges knowledge on public data, not summable tensors; every other
    registered algorithm declares (and its tests check) that the sum is all it needs."""
    from fedtune.algorithms.registry import algorithm_names
    from fedtune.config.algorithms import summed_update_algorithms

    assert summed_update_algorithms() == sorted(set(algorithm_names()) - {"fedmkt"})


@pytest.mark.parametrize(("neighbours", "degree", "threshold"), [("all", 9, 6), ("auto", 8, 5), (4, 4, 3), (2, 2, 2)])
def test_neighbourhoods_set_degree_and_default_threshold(tmp_path: Path, neighbours, degree: int, threshold: int) -> None:  # type: ignore[no-untyped-def]
    ten = [{"name": f"t{i}", "data_uri": f"{i}.jsonl"} for i in range(10)]
    sa = job(tmp_path, tenants=ten, secure_aggregation={"enabled": True, "neighbours": neighbours}).secure_aggregation
    assert sa.degree_for(10) == degree and sa.threshold_for(10) == threshold
