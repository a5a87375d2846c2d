"""The ``differential_privacy`` job section: client-level DP-FedAvg (McMahan et al. 2018).

Off unless present. Example::

    differential_privacy:
      noise_multiplier: 1.0
      clipping: {norm: 0.5}            # or {adaptive: {target_quantile: 0.5}}
      placement: central               # or distributed (each tenant adds its share)
      delta: 1.0e-5
      target_epsilon: 8.0              # optional: stop before a round would exceed it

The field checks are pydantic's (collected, every problem at once); the checks that need the
rest of the job (algorithm, weights, secure aggregation, sampled tenants) are in
:meth:`DifferentialPrivacyConfig.job_problems`, which the job's validator calls.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from fedtune.config.base import StrictModel


class AdaptiveClipping(StrictModel):
    """Andrew et al. 2021, "Differentially Private Learning with Adaptive Clipping", Alg. 1:
    ``C <- C * exp(-eta_C (b~ - gamma))`` with ``b~`` the noised fraction of unclipped updates."""

    initial_norm: float = Field(0.1, gt=0.0, le=1e6, description="C at round 1 (paper: 0.1).")
    target_quantile: float = Field(
        0.5, gt=0.0, lt=1.0, description="gamma: the share of updates left unclipped (paper: 0.5)."
    )
    learning_rate: float = Field(
        0.2, gt=0.0, le=10.0, description="eta_C of the geometric update (paper: 0.2)."
    )
    count_noise: float | None = Field(
        None,
        gt=0.0,
        le=1e6,
        description="sigma_b: std of the noise on the count of unclipped updates (default: "
        "sampled tenants / 20, the paper's choice).",
    )

    def count_noise_for(self, sampled: int) -> float:
        """sigma_b of a round with ``sampled`` tenants."""
        return self.count_noise if self.count_noise is not None else sampled / 20.0


class ClippingConfig(StrictModel):
    """Per-update L2 clipping: a fixed ``norm``, or ``adaptive`` (exactly one)."""

    norm: float | None = Field(None, gt=0.0, le=1e6, description="Fixed L2 bound C on each delta.")
    adaptive: AdaptiveClipping | None = Field(None, description="Adaptive C (Andrew et al. 2021).")

    @model_validator(mode="after")
    def _one_kind(self) -> ClippingConfig:
        if (self.norm is None) == (self.adaptive is None):
            raise ValueError(
                "set exactly one of clipping.norm and clipping.adaptive, e.g. `clipping: {norm: "
                "0.5}` or `clipping: {adaptive: {target_quantile: 0.5}}`"
            )
        return self


class DifferentialPrivacyConfig(StrictModel):
    """Client-level differential privacy of the released model (DP-FedAvg)."""

    noise_multiplier: float = Field(
        gt=0.0,
        le=1e4,
        description="z: noise std on the sum of clipped deltas is z * C (with adaptive "
        "clipping, z is the total: the delta's share is derived as in Andrew et al. Thm. 1).",
    )
    clipping: ClippingConfig = Field(description="`{norm: C}` or `{adaptive: {...}}`.")
    placement: Literal["central", "distributed"] = Field(
        "central",
        description="Who adds the noise: the provider to the sum (central), or every tenant a "
        "share N(0, z^2 C^2 / n) to its own update (distributed; pairs with secure aggregation).",
    )
    delta: float = Field(1e-5, gt=0.0, lt=1.0, description="delta of the (epsilon, delta) reported.")
    target_epsilon: float | None = Field(
        None, gt=0.0, le=1e4, description="Stop before a round that would push epsilon above it."
    )

    def delta_noise_multiplier(self, sampled: int) -> float:
        """z_Delta, the noise multiplier of the update sum.

        With fixed clipping it is ``z``. With adaptive clipping the count query spends part of
        the budget: Andrew et al. 2021, Theorem 1 (centred bits, sensitivity 1/2) gives
        ``z = (z_Delta^-2 + (2 sigma_b)^-2)^(-1/2)``, so ``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)``.
        """
        z = self.noise_multiplier
        if self.clipping.adaptive is None:
            return z
        sigma_b = self.clipping.adaptive.count_noise_for(sampled)
        rest = z**-2 - (2 * sigma_b) ** -2
        return math.inf if rest <= 0 else rest**-0.5

    def job_problems(
        self, algorithm: str, weights: str | None, secure_aggregation: bool, sampled: int
    ) -> list[str]:
        """What the rest of the job rules out (every problem, each with its fix)."""
        from fedtune.config.capabilities import names_where

        problems = []
        # Algorithms whose update is a mean of adapter tensors the provider folds in one call,
        # so clipping each tenant's adapter delta bounds its influence on the whole round.
        supported = names_where("central_dp")
        if algorithm not in supported:
            problems.append(
                f"differential_privacy is set for algorithm {algorithm!r}, whose update is not a "
                f"mean of adapter deltas; use one of {supported} or remove "
                "differential_privacy"
            )
        if weights not in (None, "uniform"):
            problems.append(
                f"differential_privacy needs algorithm.aggregation_weights: uniform (got "
                f"{weights!r}): DP-FedAvg bounds each tenant's influence by C only when no "
                "tenant's weight grows with its claimed sample count (McMahan et al. 2018, Sec. 2); "
                "set aggregation_weights: uniform"
            )
        if self.placement == "distributed" and not secure_aggregation:
            problems.append(
                "differential_privacy.placement: distributed needs secure_aggregation.enabled: "
                "true: without it the provider sees each update with only 1/n of the noise; "
                "enable secure aggregation, or use placement: central"
            )
        adaptive = self.clipping.adaptive
        if adaptive is not None and self.placement == "distributed":
            problems.append(
                "differential_privacy.clipping.adaptive with placement: distributed: the count of unclipped updates "
                "would reach the provider un-noised per tenant; use clipping.norm, or placement: central"
            )
        if adaptive is not None and secure_aggregation:
            problems.append(
                "differential_privacy.clipping.adaptive with secure_aggregation: each tenant's clipped/unclipped bit "
                "would reach the provider outside the masked sum; use clipping.norm"
            )
        if adaptive is not None and math.isinf(self.delta_noise_multiplier(sampled)):
            sigma_b = adaptive.count_noise_for(sampled)
            problems.append(
                f"differential_privacy.clipping.adaptive.count_noise={sigma_b:g} leaves no budget for the update: "
                f"Andrew et al. need 2 * count_noise > noise_multiplier={self.noise_multiplier:g}; "
                f"set clipping.adaptive.count_noise above {self.noise_multiplier / 2:g} (or lower "
                "noise_multiplier)"
            )
        return problems
