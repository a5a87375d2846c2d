"""FedAvg's config section: no settings beyond the weighted mean's."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedtune.config.capabilities import Capabilities
from fedtune.config.packages import AlgorithmSpec, Smoke
from fedtune.config.sections import WeightedMeanConfig


class FedAvgConfig(WeightedMeanConfig):
    """FedAvg on LoRA adapters (McMahan et al. 2017; FedIT, Zhang et al. 2024)."""

    #: Tenants train LoRA on the base model (a tenant-readable copy, see model.tenant_uri);
    #: the server folds a weighted mean of the adapters (a sum, so secure aggregation and
    #: central DP apply).
    capabilities: ClassVar[Capabilities] = Capabilities(
        module=f"{__package__}.algorithm", family="fedit", central_dp=True, splittable_client_step=True
    )

    name: Literal["fedavg"] = Field(description="Algorithm name.")


ALGORITHM = AlgorithmSpec(sections=(FedAvgConfig,), smoke={"fedavg": Smoke({"name": "fedavg"})})
