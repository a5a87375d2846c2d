"""The config sections of FedBiOT and its baselines FedOT and Offsite-tuning."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from fedtune.config.capabilities import Capabilities
from fedtune.config.packages import AlgorithmSpec, Smoke
from fedtune.config.sections import DeepSpeedSection, WeightedMeanConfig


class OffsiteFamilyConfig(WeightedMeanConfig):
    """Settings shared by FedBiOT and its baselines Offsite-tuning and FedOT.

    The provider splits its model into an adapter (trained by tenants) and an emulator
    (a layer-dropped copy of the rest, aligned on public data by the provider only).
    """

    #: Tenants never get the full model: only the emulator package in the broadcast.
    capabilities: ClassVar[Capabilities] = Capabilities(
        module=f"{__package__}.algorithm", family="fedbiot", tenants_load_base=False
    )
    #: What a tenant's client step and AdapEmu evaluation read; the split, the alignment and
    #: the delta encoding are the provider's.
    tenant_fields: ClassVar[tuple[str, ...]] = (
        "name", "aggregation_weights", "adapter_training", "eval_every", "exact_match",
        "gsm8k_shots", "max_new_tokens", "max_generation_examples",
    )

    dropout: float = Field(
        0.2,
        ge=0.0,
        lt=1.0,
        description="Layer dropout rate 1 - beta of the emulator (paper: 0.2 or 0.5).",
    )
    pre_distill_steps: int = Field(
        500,
        ge=0,
        le=1_000_000,
        description="Emulator alignment steps (Eq. 2) on public data before round 1 (paper 500).",
    )
    kl_lambda: float = Field(
        0.0,
        ge=0.0,
        le=100.0,
        description="lambda of Eq. 2: weight of KL(full+adapter || emulator+adapter) "
        "(paper 0 for GSM8K/Dolly, 0.9 for code).",
    )
    normalize_l2: bool = Field(
        True,
        description="L2 term as mean(((t - s)/rms(t))^2) per token (as the reference does) "
        "instead of the plain mean squared error.",
    )
    align_lr: float = Field(
        5e-4, gt=0.0, le=10.0, description="Learning rate of the emulator alignment."
    )
    align_batch_size: int = Field(
        4, ge=1, le=4096, description="Public examples per alignment step."
    )
    align_optimizer: Literal["sgd", "adamw"] = Field(
        "sgd",
        description="Alignment optimizer (paper: SGD). AdamW moments restart with every "
        "alignment phase (pre-distillation, each round), since only weights are kept in state.",
    )
    public_eval_fraction: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="Share of the public dataset held out to measure alignment and AdapFu.",
    )
    adapter_training: Literal["full", "lora"] = Field(
        "full",
        description="Tenants train the adapter layers' full weights (paper) or a LoRA on them "
        "(the job's lora section).",
    )
    delta_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="dtype of the per-round emulator delta sent to tenants (bfloat16 halves "
        "the bytes; the provider tracks the tenants' copy, so rounding does not accumulate).",
    )
    eval_every: int = Field(
        1,
        ge=1,
        le=100_000,
        description="Evaluate AdapEmu (tenants) and AdapFu (provider, public held-out) every "
        "N rounds.",
    )
    exact_match: Literal["auto", "gsm8k", "off"] = Field(
        "auto",
        description="GSM8K exact match of AdapEmu on a tenant's held-out split: 'auto' when "
        "every held-out answer ends in 'The answer is N'.",
    )
    gsm8k_shots: int = Field(
        8, ge=0, le=8, description="Demonstrations in the GSM8K prompt (paper: 8)."
    )
    max_new_tokens: int = Field(
        128, ge=1, le=4096, description="Greedy tokens generated per exact-match question."
    )
    max_generation_examples: int = Field(
        32, ge=1, le=100_000, description="Held-out questions scored by exact match per eval."
    )
    deepspeed: DeepSpeedSection | None = Field(
        None, description="Run emulator alignment under DeepSpeed ZeRO-2/3 (default: plain torch)."
    )


class FedBiOTConfig(OffsiteFamilyConfig):
    """FedBiOT (Wu et al. 2024): last-s-layer adapter, per-round emulator alignment."""

    tenant_fields: ClassVar[tuple[str, ...]] = (*OffsiteFamilyConfig.tenant_fields, "eps")

    name: Literal["fedbiot"] = Field(description="Algorithm name.")
    adapter_size: int = Field(
        2, ge=1, le=1024, description="Adapter size s: the last s decoder layers (paper 2 or 4)."
    )
    eps: float = Field(
        1.0,
        ge=0.0,
        le=100.0,
        description="Proximal weight epsilon of Eq. 1: (eps/2)*||w_A - w_A^t||^2 "
        "(paper 1.0 GSM8K/Dolly, 0.1 code).",
    )
    align_steps: int = Field(
        10,
        ge=0,
        le=100_000,
        description="Emulator alignment steps per round, after aggregation (paper 10).",
    )
    adapter_placement: Literal["top", "edges"] = Field(
        "top",
        description="Where the adapter's adapter_size layers sit: the last ones (paper, "
        "Algorithm 2) or half first, half last (FedOT's placement; an ablation, not in the "
        "paper; adapter_size must be even).",
    )

    @model_validator(mode="after")
    def _edges_split_evenly(self) -> FedBiOTConfig:
        if self.adapter_placement == "edges" and self.adapter_size % 2:
            raise ValueError(
                f"adapter_placement='edges' splits adapter_size={self.adapter_size} layers "
                "evenly between the first and last layers; use an even adapter_size (e.g. 4 "
                "for first 2 + last 2)"
            )
        return self


class FedOTConfig(OffsiteFamilyConfig):
    """FedOT (Kuang et al. 2023): first-2 + last-2 adapter, one-shot distillation, FedAvg."""

    name: Literal["fedot"] = Field(description="Algorithm name.")


class OffsiteTuningConfig(OffsiteFamilyConfig):
    """Offsite-tuning (Xiao et al. 2023): FedOT with one tenant that holds all the data."""

    name: Literal["offsite-tuning"] = Field(description="Algorithm name.")


#: A tiny model deep enough to split into an adapter and a layer-dropped emulator.
_SPLITTABLE = {
    "model": {"source": "tiny", "arch": "llama", "hidden_size": 32, "num_layers": 6,
              "num_heads": 2, "intermediate_size": 64, "max_position_embeddings": 160},
}
_QUICK = {"dropout": 0.5, "pre_distill_steps": 1, "eval_every": 100}
ALGORITHM = AlgorithmSpec(
    sections=(FedBiOTConfig, FedOTConfig, OffsiteTuningConfig),
    smoke={
        "fedbiot": Smoke(
            {"name": "fedbiot", "adapter_size": 1, "align_steps": 1, **_QUICK},
            job=_SPLITTABLE,
            public_data=True,
        ),
        "fedot": Smoke({"name": "fedot", **_QUICK}, job=_SPLITTABLE, public_data=True),
        "offsite-tuning": Smoke(
            {"name": "offsite-tuning", **_QUICK},
            job=_SPLITTABLE,
            public_data=True,
            single_tenant=True,
        ),
    },
)
