"""What every algorithm's config section shares: the tenant-part allowlist, the weighted mean
of client updates, and the DeepSpeed settings of the provider's heavy steps.

Each algorithm's own section lives in its package (``fedtune/algorithms/<name>/config.py``)
and subclasses one of these; :mod:`fedtune.config.algorithms` joins them into the job's union.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, create_model, model_validator

from fedtune.config.base import StrictModel
from fedtune.config.capabilities import Capabilities

_WEIGHTS_HELP = (
    "How client updates are weighted in the server's mean: by their num_samples (capped by "
    "limits.max_samples_per_tenant / tenants[].max_samples) or equally (no tenant can "
    "dominate by its claimed sample count). "
)


class AlgorithmSection(StrictModel):
    """An algorithm's config section, and the part of it its tenants receive.

    ``tenant_fields`` is the allowlist of settings a tenant's phases read; the class's
    ``TenantPart`` is a model of exactly those fields (same types, bounds and defaults),
    generated once per section. Everything else (a provider's large model, its alignment
    or distillation settings) is never in a tenant's view: a new field stays with the
    provider until it is added here.
    """

    tenant_fields: ClassVar[tuple[str, ...]] = ("name",)
    TenantPart: ClassVar[type[StrictModel]]
    #: What the algorithm can do, declared once (set by every algorithm's section).
    capabilities: ClassVar[Capabilities]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "name" not in cls.model_fields:
            return  # an intermediate base (WeightedMeanConfig): no algorithm of its own
        unknown = sorted(set(cls.tenant_fields) - set(cls.model_fields))
        if unknown:
            raise TypeError(f"{cls.__name__}.tenant_fields names no field(s) {unknown}")
        fields: Any = {f: (cls.model_fields[f].annotation, cls.model_fields[f]) for f in cls.tenant_fields}
        part = create_model(f"{cls.__name__}TenantPart", __base__=StrictModel, **fields)
        part.__doc__ = f"What a tenant receives of {cls.__name__}: {', '.join(cls.tenant_fields)}."
        # The tenant side reads the section's capabilities through its part too.
        part.capabilities = cls.capabilities  # type: ignore[attr-defined]
        cls.TenantPart = part

    def tenant_part(self) -> StrictModel:
        """This section's tenant part, built field by field from the allowlist."""
        return self.TenantPart.model_validate({f: getattr(self, f) for f in self.tenant_fields})


class WeightedMeanConfig(AlgorithmSection):
    """Algorithms whose aggregation is a weighted mean of client updates.

    Each algorithm's default follows its paper: FedAvg and FedProx weight by samples
    (McMahan et al. 2017, Algorithm 1: ``w <- sum_k n_k/n w_k``; Li et al. 2020 keep it);
    FedOPT and SCAFFOLD average uniformly (Reddi et al. 2021, Algorithm 2:
    ``Delta_t = 1/|S| sum_i Delta_i``; Karimireddy et al. 2020, Algorithm 1 line 16).
    """

    #: A tenant weights its securely summed update itself (``sum_weight``).
    tenant_fields: ClassVar[tuple[str, ...]] = ("name", "aggregation_weights")

    aggregation_weights: Literal["samples", "uniform"] = Field(
        "samples",
        description=_WEIGHTS_HELP + "Default samples (McMahan et al. 2017, Algorithm 1).",
    )


class UniformMeanConfig(WeightedMeanConfig):
    """A weighted-mean algorithm whose paper averages client updates uniformly."""

    aggregation_weights: Literal["samples", "uniform"] = Field(
        "uniform",
        description=_WEIGHTS_HELP
        + "Default uniform (Reddi et al. 2021, Algorithm 2; Karimireddy et al. 2020, "
        "Algorithm 1 line 16).",
    )



class DeepSpeedSection(StrictModel):
    """Run the provider's emulator alignment under DeepSpeed ZeRO (FedBiOT family).

    Either inline settings (``zero_stage``, ``bf16``) or ``config_path``, a DeepSpeed JSON
    file used as given (batch sizes are filled in when it leaves them out). Single process
    on CPU needs nothing else; with ``provider.gpu > 1`` the step starts one rank per GPU
    itself (docs/multi-gpu.md).
    """

    zero_stage: Literal[2, 3] | None = Field(
        None, description="ZeRO stage (2 or 3); default 2 unless config_path is given."
    )
    bf16: bool | None = Field(
        None, description="Train the emulator in bfloat16 under DeepSpeed (default false)."
    )
    config_path: str | None = Field(
        None,
        min_length=1,
        max_length=2048,
        description="Path of a DeepSpeed JSON config (relative to the working directory); "
        "exclusive with zero_stage and bf16.",
    )

    @model_validator(mode="after")
    def _inline_or_file(self) -> DeepSpeedSection:
        if self.config_path is not None and (self.zero_stage is not None or self.bf16 is not None):
            raise ValueError(
                f"deepspeed.config_path={self.config_path!r} conflicts with inline settings "
                f"(zero_stage={self.zero_stage}, bf16={self.bf16}); set them in the JSON file "
                "or drop config_path"
            )
        return self
