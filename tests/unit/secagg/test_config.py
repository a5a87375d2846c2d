"""The secure_aggregation job option: off by default, bad values refused with a fix."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from fedtune.config import parse_job
from fedtune.core.errors import ConfigError
from fedtune.engines.local import config_fingerprint
from fedtune.engines.secagg_steps import refuse_pipeline
from fedtune.pipelines.compiling import compile_job

from tests.integration.conftest import tiny_job_dict


def job(tmp_path: Path, **overrides):  # type: ignore[no-untyped-def]
    return parse_job(tiny_job_dict(tmp_path, **overrides))


def test_off_by_default_and_the_fingerprint_of_older_jobs_holds(tmp_path: Path) -> None:
    plain = job(tmp_path)
    assert not plain.secure_aggregation.enabled
    dump = plain.model_dump(
        mode="json", exclude={"rounds", "engine", "tracking", "audit", "secure_aggregation", "differential_privacy"}
    )
    expected = hashlib.sha256(json.dumps(dump, sort_keys=True).encode()).hexdigest()
    assert config_fingerprint(plain) == expected  # as before the option existed
    on = job(tmp_path, secure_aggregation={"enabled": True})
    assert config_fingerprint(plain) != config_fingerprint(on)
    assert on.secure_aggregation.threshold_for(3) == 2


@pytest.mark.parametrize(
    ("section", "overrides", "message"),
    [
        ({"enabled": True, "threshold": 4}, {}, "secure_aggregation.threshold=4 must be in 2..3 for 3 sampled"),
        ({"enabled": True, "threshold": 1}, {}, "secure_aggregation.threshold=1 must be in 2..3"),
        ({"enabled": True}, {"algorithm": {"name": "scaffold"}, "training": {"local_steps": 2, "batch_size": 4, "lr": 0.01, "max_seq_len": 160, "optimizer": "sgd"}}, "enabled for algorithm 'scaffold'"),
        ({"enabled": True, "frac_bits": 60}, {}, "frac_bits"),
    ],
)
def test_bad_settings_are_refused(tmp_path: Path, section, overrides, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises((ConfigError, ValueError)) as info:
        job(tmp_path, secure_aggregation=section, **overrides)
    assert message in str(info.value)


def test_pipelines_refuse_it_until_wired(tmp_path: Path) -> None:
    on = job(tmp_path, secure_aggregation={"enabled": True})
    with pytest.raises(ConfigError, match="compiled pipelines") as info:
        refuse_pipeline(on)
    assert "--engine local" in info.value.fix
    with pytest.raises(ConfigError, match="compiled pipelines"):
        compile_job(on, tmp_path / "p.yaml")
