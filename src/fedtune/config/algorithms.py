"""Per-algorithm config sections, a discriminated union on ``name``.

Each algorithm module imports its own section from here; adding an algorithm adds one class
and one union member.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from fedtune.config.base import StrictModel


class FedAvgConfig(StrictModel):
    """FedAvg on LoRA adapters (McMahan et al. 2017; FedIT, Zhang et al. 2024)."""

    name: Literal["fedavg"] = Field(description="Algorithm name.")


class FedProxConfig(StrictModel):
    """FedProx (Li et al. 2020): FedAvg plus a proximal term on the client."""

    name: Literal["fedprox"] = Field(description="Algorithm name.")
    mu: float = Field(
        0.01, ge=0.0, le=100.0, description="Proximal weight mu in (mu/2)*||w - w_global||^2."
    )


class ScaffoldConfig(StrictModel):
    """SCAFFOLD option II (Karimireddy et al. 2020) with client control variates."""

    name: Literal["scaffold"] = Field(description="Algorithm name.")
    global_lr: float = Field(
        1.0, gt=0.0, le=10.0, description="Server learning rate eta_g in x += eta_g * mean(y_i - x)."
    )


class FedOptConfig(StrictModel):
    """FedOPT (Reddi et al. 2021, Algorithm 2): a server optimizer on the mean client delta.

    No bias correction, as in the paper. ``eta``/``tau`` defaults follow the paper's LoRA-scale
    sweeps rather than Flower's (eta=0.1, tau=1e-3 makes first steps several times the delta).
    """

    name: Literal["fedopt", "fedadagrad", "fedadam", "fedyogi"] = Field(
        description="fedadagrad / fedadam / fedyogi, or fedopt with an explicit server_optimizer."
    )
    server_optimizer: Literal["sgd", "adagrad", "adam", "yogi"] | None = Field(
        None,
        description="Only for name=fedopt: the server optimizer. Implied by the other names.",
    )
    eta: float = Field(1e-2, gt=0.0, le=10.0, description="Server learning rate eta.")
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="First-moment decay beta_1.")
    beta2: float = Field(0.99, ge=0.0, lt=1.0, description="Second-moment decay beta_2.")
    tau: float = Field(1e-3, gt=0.0, le=1.0, description="Adaptivity tau (added to sqrt(v)).")

    @model_validator(mode="after")
    def _optimizer_only_for_fedopt(self) -> FedOptConfig:
        if self.name != "fedopt" and self.server_optimizer is not None:
            raise ValueError(
                f"server_optimizer={self.server_optimizer!r} conflicts with name={self.name!r}; "
                "drop server_optimizer, or set name: fedopt"
            )
        return self

    @property
    def optimizer(self) -> Literal["sgd", "adagrad", "adam", "yogi"]:
        """The server optimizer this section selects."""
        implied = {"fedadagrad": "adagrad", "fedadam": "adam", "fedyogi": "yogi"}
        if self.name == "fedopt":
            return self.server_optimizer or "sgd"
        return implied[self.name]  # type: ignore[return-value]


AlgorithmConfig = Annotated[
    FedAvgConfig | FedProxConfig | ScaffoldConfig | FedOptConfig,
    Field(discriminator="name"),
]
