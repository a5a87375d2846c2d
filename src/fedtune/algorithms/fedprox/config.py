"""FedProx's config section: the proximal weight mu, which its tenants read."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedtune.config.capabilities import Capabilities
from fedtune.config.packages import AlgorithmSpec, Smoke
from fedtune.config.sections import WeightedMeanConfig


class FedProxConfig(WeightedMeanConfig):
    """FedProx (Li et al. 2020): FedAvg plus a proximal term on the client."""

    #: As FedAvg; the proximal term reads only the broadcast.
    capabilities: ClassVar[Capabilities] = Capabilities(
        module=f"{__package__}.algorithm", family="fedit", central_dp=True, splittable_client_step=True
    )

    tenant_fields: ClassVar[tuple[str, ...]] = ("name", "aggregation_weights", "mu")

    name: Literal["fedprox"] = Field(description="Algorithm name.")
    mu: float = Field(
        0.01, ge=0.0, le=100.0, description="Proximal weight mu in (mu/2)*||w - w_global||^2."
    )


ALGORITHM = AlgorithmSpec(
    sections=(FedProxConfig,), smoke={"fedprox": Smoke({"name": "fedprox", "mu": 0.1})}
)
