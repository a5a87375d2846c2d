"""The leakage gate: a model version is promoted only with a memorization audit that passes.

The design is deliberately small. The audit (:func:`fedtune.eval.memorization.memorization_audit`)
produces one number, the mean Rouge-L between what the model generates for training prompts and
the true private responses; it is recorded on the model *version* as the tag
:data:`AUDIT_TAG`. A threshold turns the gate on; it comes from ``fedtune promote
--max-leakage X`` or, so that a team can set it once per model, from the *registered model*
tag :data:`GATE_TAG`. With a threshold, the version must carry the audit tag and its value
must be at most the threshold. ``--require-audit`` alone demands the audit without a bound.
Without any of the three, promotion does not look at the audit.

Both numbers are Rouge-L values in [0, 1]; anything else is refused rather than guessed at.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from fedtune.core.errors import ConfigError, FedtuneError, ModelError

AUDIT_TAG = "fedtune.audit.memorization"
"""Model-version tag: mean Rouge-L of the discoverable-memorization audit, a float in [0, 1]."""

GATE_TAG = "fedtune.gate.max_memorization"
"""Registered-model tag: the highest audit value a version may have to be promoted."""

_AUDIT_FIX = (
    f"Run the memorization audit on this version and record its mean Rouge-L as the version "
    f"tag {AUDIT_TAG} (e.g. `mlflow.MlflowClient().set_model_version_tag(NAME, VERSION, "
    f"'{AUDIT_TAG}', '0.12')`), then promote again."
)


def _unit_float(raw: str | float, what: str, fix: str, error: type[FedtuneError]) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise error(f"{what} is {raw!r}, not a number", fix=fix) from None
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise error(f"{what} is {raw!r}; it must be a Rouge-L value between 0 and 1", fix=fix)
    return value


@dataclass(frozen=True)
class GateResult:
    """What the gate saw: the audit value (None when not audited) and the bound applied."""

    checked: bool
    audit: float | None
    threshold: float | None

    def describe(self) -> str:
        """One line for the terminal."""
        if not self.checked:
            return "leakage gate: off (no threshold configured)"
        if self.threshold is None:
            return f"leakage gate: audit present (memorization {self.audit:.4f}, no bound)"
        return f"leakage gate: memorization {self.audit:.4f} <= {self.threshold:.4f}"


@dataclass(frozen=True)
class LeakageGate:
    """The gate's settings from the command line.

    Attributes:
        max_leakage: Threshold given on the command line; overrides the registered-model tag.
        require_audit: Demand an audit result even when no threshold is configured.
    """

    max_leakage: float | None = None
    require_audit: bool = False

    def __post_init__(self) -> None:
        if self.max_leakage is not None:
            _unit_float(
                self.max_leakage,
                "--max-leakage",
                "Pass the highest acceptable mean Rouge-L, e.g. --max-leakage 0.3.",
                ConfigError,
            )

    def threshold(self, model_tags: Mapping[str, str]) -> float | None:
        """The bound in force: the command line's, else the registered model's tag.

        Raises:
            ConfigError: The registered model's tag is not a number in [0, 1].
        """
        if self.max_leakage is not None:
            return float(self.max_leakage)
        if GATE_TAG in model_tags:
            return _unit_float(
                model_tags[GATE_TAG],
                f"registered-model tag {GATE_TAG}",
                f"Set the tag {GATE_TAG} to a number between 0 and 1, or delete it.",
                ConfigError,
            )
        return None

    def check(
        self,
        name: str,
        version: int,
        version_tags: Mapping[str, str],
        model_tags: Mapping[str, str],
    ) -> GateResult:
        """Pass or refuse one version.

        Raises:
            ModelError: The gate is on and the audit result is missing, malformed or too high.
            ConfigError: The configured threshold is malformed.
        """
        threshold = self.threshold(model_tags)
        if threshold is None and not self.require_audit:
            return GateResult(checked=False, audit=None, threshold=None)
        where = f"{name} version {version}"
        why = (
            f"a leakage threshold of {threshold} is configured"
            if threshold is not None
            else "--require-audit was given"
        )
        if AUDIT_TAG not in version_tags:
            raise ModelError(
                f"refusing to promote {where}: it has no audit result (tag {AUDIT_TAG}) and {why}",
                fix=_AUDIT_FIX,
            )
        audit = _unit_float(
            version_tags[AUDIT_TAG], f"the audit tag {AUDIT_TAG} of {where}", _AUDIT_FIX, ModelError
        )
        if threshold is not None and audit > threshold:
            raise ModelError(
                f"refusing to promote {where}: its memorization audit {audit:.4f} exceeds the "
                f"leakage threshold {threshold:.4f}",
                fix="Retrain with stronger privacy settings (fewer rounds or epochs, FewFedPIT's "
                "synthetic mixing), audit the new version, and promote that one.",
            )
        return GateResult(checked=True, audit=audit, threshold=threshold)
