"""Method labels of the quality benchmark: an algorithm, optionally with its own settings.

A label is a registered algorithm name, or a *variant*: the name followed by ``@FIELD=VALUE``
once per setting, e.g. ``fewfedpit@beta=0`` or ``fewfedpit@beta=0.5@candidates=8``. Values
are read as YAML scalars, like ``--param``. The label, exactly as written, names the method's
row in the results and in the paper claims, so the same algorithm can run with several
settings side by side. A variant's settings override ``--param ALGORITHM.FIELD=VALUE``,
which applies to every variant of that algorithm.

Settings named ``dp.FIELD`` go to the job's ``differential_privacy`` section instead of the
algorithm's (over the benchmark's ``privacy`` defaults): ``fedavg@dp.noise_multiplier=1`` runs
DP-FedAvg with noise multiplier 1 (and, as DP requires, uniform aggregation weights).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import yaml
from pydantic import TypeAdapter, ValidationError

from fedtune.config.algorithms import AlgorithmConfig
from fedtune.config.loading import format_validation_errors
from fedtune.core.errors import ConfigError

__all__ = ["DP_PREFIX", "VARIANT_SEP", "Method", "check_settings", "parse_method"]

VARIANT_SEP: Final = "@"
DP_PREFIX: Final = "dp."
_FIX: Final = (
    "Write a variant as ALGORITHM@FIELD=VALUE, one @FIELD=VALUE per setting, "
    "e.g. fewfedpit@beta=0 or fewfedpit@beta=0.5@candidates=8."
)


@dataclass(frozen=True)
class Method:
    """A method's label, the algorithm it runs and the settings of its variant."""

    label: str
    algorithm: str
    params: Mapping[str, Any] = field(default_factory=dict)
    privacy: Mapping[str, Any] = field(default_factory=dict)  # the dp.* settings


def parse_method(label: str) -> Method:
    """Split ``label`` into its algorithm and variant settings (see the module docstring).

    Raises:
        ConfigError: On an empty algorithm name, a setting without ``=`` or a field name,
            or a field given twice.
    """
    algorithm, *settings = label.split(VARIANT_SEP)
    if not algorithm:
        raise ConfigError(
            f"method {label!r} has no algorithm name before {VARIANT_SEP!r}", fix=_FIX
        )
    params: dict[str, Any] = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key or not value:
            raise ConfigError(
                f"method {label!r}: setting {setting!r} is not FIELD=VALUE", fix=_FIX
            )
        if key in params:
            raise ConfigError(f"method {label!r} sets {key!r} twice", fix=_FIX)
        params[key] = yaml.safe_load(value)
    privacy = {k.removeprefix(DP_PREFIX): v for k, v in params.items() if k.startswith(DP_PREFIX)}
    if privacy:  # DP-FedAvg bounds a tenant's influence only with uniform weights
        params = {k: v for k, v in params.items() if not k.startswith(DP_PREFIX)}
        params.setdefault("aggregation_weights", "uniform")
    return Method(label=label, algorithm=algorithm, params=params, privacy=privacy)


def check_settings(method: Method, common: Mapping[str, Any]) -> None:
    """Validate the algorithm config ``method`` runs with (``common`` then its variant),
    before any run starts. Missing fields are left to the benchmark, which fills some in
    (FedPT's large model).

    Raises:
        ConfigError: Listing each invalid or unknown field, with the method's label.
    """
    raw = {**common, **method.params, "name": method.algorithm}
    try:
        TypeAdapter(AlgorithmConfig).validate_python(raw)
    except ValidationError as exc:
        problems = [
            line
            for line, item in zip(format_validation_errors(exc), exc.errors(), strict=True)
            if item["type"] != "missing"
        ]
        if problems:
            raise ConfigError(
                f"method {method.label!r}: invalid {method.algorithm} settings {dict(raw)}: "
                + "; ".join(problems),
                fix=f"Correct the settings; `fedtune algorithms` lists {method.algorithm}'s "
                "fields.",
            ) from None
