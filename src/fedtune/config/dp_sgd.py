"""A tenant's own example-level DP-SGD (Abadi et al. 2016), run by Opacus in its client step.

Set per tenant in the job (``tenants[].dp_sgd``), or by the tenant itself in its own store
(``dp-sgd.json``, same fields; see :mod:`fedtune.engines.tenant.dp_sgd`), which then wins::

    tenants:
      - name: tenant-a
        data_uri: ...
        dp_sgd:
          noise_multiplier: 1.0       # sigma: noise std on the clipped sum is sigma * C
          max_grad_norm: 1.0          # C: every example's gradient is clipped to L2 norm C
          delta: 1.0e-5
          target_epsilon: 8.0         # optional: the tenant stops taking part before exceeding it

The guarantee protects each training example of that tenant (add/remove one example), for
everything the tenant's adapter updates reveal, over every round it trains in.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedtune.config.base import StrictModel


class DpSgdConfig(StrictModel):
    """One tenant's example-level DP-SGD: per-example clipping + Gaussian noise (Opacus)."""

    noise_multiplier: float = Field(
        gt=0.0, le=1e4, description="sigma: the noise std on each step's sum of clipped "
        "per-example gradients is sigma * max_grad_norm (Abadi et al. 2016, Alg. 1)."
    )
    max_grad_norm: float = Field(
        gt=0.0, le=1e6, description="C: each example's gradient (over the trainable LoRA "
        "parameters) is scaled down to L2 norm at most C."
    )
    delta: float = Field(1e-5, gt=0.0, lt=1.0, description="delta of the (epsilon, delta) reported.")
    target_epsilon: float | None = Field(
        None, gt=0.0, le=1e4, description="The tenant refuses a round that would take its "
        "epsilon above this (the round goes on without it if the quorum holds)."
    )
    accountant: Literal["rdp", "prv"] = Field(
        "rdp", description="Opacus accountant: rdp (Mironov 2017) or prv (Gopi et al. 2021)."
    )
    share_epsilon: bool = Field(
        True, description="Put the tenant's epsilon into its update's metrics (the provider's "
        "tracking and run summary); false: the provider learns only that DP-SGD ran."
    )
    share_losses: bool = Field(
        False, description="Also send the train/eval losses and token count, which are "
        "computed from the private data outside the DP guarantee (off by default)."
    )


def dp_sgd_problem(algorithm: str) -> str | None:
    """Why ``algorithm`` cannot run a tenant's DP-SGD, or None when it can (its declared
    capabilities: ``dp_sgd_refused``)."""
    from fedtune.config.capabilities import capabilities_of, dp_sgd_algorithms

    try:
        why = capabilities_of(algorithm).dp_sgd_refused
    except KeyError:
        why = "its client step does not train through the shared loop"
    if why is None:
        return None
    return (
        f"algorithm {algorithm!r} cannot apply a tenant's dp_sgd: {why}; use one of "
        f"{dp_sgd_algorithms()}, or remove tenants[].dp_sgd"
    )
