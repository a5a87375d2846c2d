"""Model sections: a tiny model built from a config, or a Hugging Face directory.

Used by the job's ``model`` (the base model) and by algorithm sections that name a second
model (FedPT's ``large_model``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fedtune.config.base import StrictModel


class TinyModelConfig(StrictModel):
    """A small decoder built from a config with seeded weights (laptops, tests, CI)."""

    source: Literal["tiny"] = Field(description="Build a tiny model from this config.")
    arch: Literal["llama", "gpt2"] = Field("llama", description="Decoder shape.")
    hidden_size: int = Field(64, ge=8, le=8192, description="Hidden width.")
    num_layers: int = Field(4, ge=1, le=128, description="Number of decoder layers.")
    num_heads: int = Field(4, ge=1, le=128, description="Attention heads (must divide hidden).")
    intermediate_size: int = Field(128, ge=8, le=32768, description="MLP width.")
    max_position_embeddings: int = Field(512, ge=16, le=131072, description="Context length.")
    init_seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of the initial weights.")

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> TinyModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}; "
                "pick num_heads that divides hidden_size"
            )
        return self


class PretrainedModelConfig(StrictModel):
    """A Hugging Face format directory (local path, file:// or s3:// URI)."""

    source: Literal["pretrained"] = Field(description="Load a Hugging Face directory.")
    uri: str = Field(
        min_length=1,
        max_length=2048,
        description="Path or URI of the provider's directory. Only provider phases read it; "
        "tenants are never given it.",
    )
    tenant_uri: str | None = Field(
        None,
        max_length=2048,
        description="Where tenants read the base weights (FedIT family): a copy the provider "
        "makes readable to tenants, e.g. a public mirror. Algorithms that never give tenants "
        "the full model (fedbiot, fedot, offsite-tuning) refuse it.",
    )
