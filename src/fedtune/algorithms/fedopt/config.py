"""FedOPT's config section: the server optimizer and its hyperparameters."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from fedtune.config.capabilities import Capabilities
from fedtune.config.packages import AlgorithmSpec, Smoke
from fedtune.config.sections import UniformMeanConfig


class FedOptConfig(UniformMeanConfig):
    """FedOPT (Reddi et al. 2021, Algorithm 2): a server optimizer on the mean client delta,
    uniform by default as in Algorithm 2 (``aggregation_weights: samples`` for FedAvg's).

    No bias correction, as in the paper. ``eta``/``tau`` defaults follow the paper's LoRA-scale
    sweeps rather than Flower's (eta=0.1, tau=1e-3 makes first steps several times the delta).
    """

    #: As FedAvg on the client; the server optimizer reads only the mean delta.
    capabilities: ClassVar[Capabilities] = Capabilities(
        module=f"{__package__}.algorithm", family="fedit", central_dp=True, splittable_client_step=True
    )

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


ALGORITHM = AlgorithmSpec(
    sections=(FedOptConfig,),
    smoke={
        "fedopt": Smoke({"name": "fedopt", "server_optimizer": "sgd", "eta": 1.0}),
        **{name: Smoke({"name": name}) for name in ("fedadagrad", "fedadam", "fedyogi")},
    },
)
