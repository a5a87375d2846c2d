"""The differential_privacy job option: off by default; every bad value refused with its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedtune.config import parse_job
from fedtune.core.errors import ConfigError
from fedtune.engines.fingerprint import config_fingerprint
from tests.integration.conftest import tiny_job_dict

UNIFORM = {"name": "fedavg", "aggregation_weights": "uniform"}
GOOD = {"noise_multiplier": 1.0, "clipping": {"norm": 0.5}}


def job(tmp_path: Path, dp: Any = GOOD, **overrides: Any):  # type: ignore[no-untyped-def]
    overrides.setdefault("algorithm", UNIFORM)
    return parse_job(tiny_job_dict(tmp_path, differential_privacy=dp, **overrides))


def test_off_by_default_and_the_target_does_not_change_the_fingerprint(tmp_path: Path) -> None:
    plain = parse_job(tiny_job_dict(tmp_path))
    assert plain.differential_privacy is None
    on = job(tmp_path)
    assert config_fingerprint(on) != config_fingerprint(job(tmp_path, algorithm=UNIFORM, dp=None))
    targeted = job(tmp_path, dp={**GOOD, "target_epsilon": 3.0})
    assert config_fingerprint(targeted) == config_fingerprint(on)  # resumable with another target


@pytest.mark.parametrize(
    ("dp", "overrides", "message"),
    [
        ({**GOOD, "noise_multiplier": -1.0}, {}, "noise_multiplier"),
        ({**GOOD, "noise_multiplier": 0.0}, {}, "noise_multiplier"),
        ({**GOOD, "delta": 0.0}, {}, "delta"),
        ({**GOOD, "delta": 1.5}, {}, "delta"),
        ({**GOOD, "target_epsilon": -2.0}, {}, "target_epsilon"),
        ({**GOOD, "placement": "local"}, {}, "placement"),
        ({"noise_multiplier": 1.0, "clipping": {"norm": -0.5}}, {}, "norm"),
        ({"noise_multiplier": 1.0, "clipping": {}}, {}, "set exactly one of clipping.norm and clipping.adaptive"),
        ({"noise_multiplier": 1.0, "clipping": {"norm": 1.0, "adaptive": {}}}, {}, "set exactly one"),
        ({"noise_multiplier": 1.0, "clipping": {"adaptive": {"target_quantile": 1.5}}}, {}, "target_quantile"),
        (GOOD, {"algorithm": {"name": "fedavg"}}, "needs algorithm.aggregation_weights: uniform (got 'samples')"),
        (
            GOOD,
            {"algorithm": {"name": "scaffold"}, "training": {"local_steps": 2, "batch_size": 4, "lr": 0.01, "optimizer": "sgd"}},
            "differential_privacy is set for algorithm 'scaffold'",
        ),
        (
            {"noise_multiplier": 1.0, "clipping": {"adaptive": {"count_noise": 5.0}}, "placement": "distributed"},
            {},
            "clipping.adaptive with placement: distributed",
        ),
        ({**GOOD, "placement": "distributed"}, {}, "placement: distributed needs secure_aggregation.enabled: true"),
        (
            {"noise_multiplier": 1.0, "clipping": {"adaptive": {"count_noise": 5.0}}},
            {"secure_aggregation": {"enabled": True}},
            "clipping.adaptive with secure_aggregation",
        ),
        (
            {"noise_multiplier": 1.0, "clipping": {"adaptive": {}}},
            {},
            "set clipping.adaptive.count_noise above 0.5",
        ),
    ],
)
def test_bad_settings_are_refused_with_a_fix(tmp_path: Path, dp: Any, overrides: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        job(tmp_path, dp=dp, **overrides)
    assert message in str(info.value)
    assert "differential_privacy" in str(info.value)


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        job(tmp_path, dp={"noise_multiplier": -1.0, "delta": 2.0, "clipping": {"norm": 0.5}, "target_epsilon": 0})
    text = str(info.value)
    assert "noise_multiplier" in text and "delta" in text and "target_epsilon" in text
