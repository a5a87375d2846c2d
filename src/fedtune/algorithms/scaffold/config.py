"""SCAFFOLD's config section: the server learning rate and the optimizer check."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedtune.config.capabilities import Capabilities
from fedtune.config.packages import AlgorithmSpec, Smoke
from fedtune.config.sections import UniformMeanConfig


class ScaffoldConfig(UniformMeanConfig):
    """SCAFFOLD option II (Karimireddy et al. 2020) with client control variates.

    Its server update averages client models and control deltas uniformly (Algorithm 1,
    lines 16-17), the default; ``aggregation_weights: samples`` weights the model mean by
    samples, while the control variate stays the uniform mean (``c`` must remain the mean
    of every client's ``c_i``, Algorithm 1 line 17). Its control variate assumes plain SGD
    local steps: a job with another client optimizer is refused unless
    ``allow_non_sgd_optimizer`` is set.
    """

    #: Line 17 needs only the sums of y_i and of c_i+ - c_i: secure aggregation can run it.
    #: Central DP is refused: clipping the adapter delta leaves the control variates unbounded.
    capabilities: ClassVar[Capabilities] = Capabilities(
        module=f"{__package__}.algorithm", family="fedit", splittable_client_step=True
    )

    name: Literal["scaffold"] = Field(description="Algorithm name.")
    global_lr: float = Field(
        1.0, gt=0.0, le=10.0, description="Server learning rate eta_g in x += eta_g * mean(y_i - x)."
    )
    allow_non_sgd_optimizer: bool = Field(
        False,
        description="Run with training.optimizer other than sgd anyway. The option-II control "
        "variate c_i+ = c_i - c + (x - y_i)/(K*lr) assumes K plain SGD steps; with AdamW it "
        "no longer estimates the client's gradient drift.",
    )


ALGORITHM = AlgorithmSpec(
    sections=(ScaffoldConfig,),
    # The smoke job runs the default AdamW clients, so it opts in explicitly.
    smoke={"scaffold": Smoke({"name": "scaffold", "allow_non_sgd_optimizer": True})},
)
