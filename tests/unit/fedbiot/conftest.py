"""A provider on a tiny 6-layer Llama whose outputs are far from uniform, and the shipped public set."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fedtune.algorithms.fedbiot.config import FedBiOTConfig
from fedtune.algorithms.fedbiot.server import Provider
from fedtune.config.job import LoraConfig, TinyModelConfig, TrainingConfig
from fedtune.models.layers import layer_extract
from fedtune.training.context import ProviderContext

PUBLIC = Path(__file__).resolve().parents[3] / "examples" / "data" / "quickstart" / "public.jsonl"


def tiny_context(arch: str = "llama", num_layers: int = 6, **kwargs: Any) -> ProviderContext:
    """A context whose base model has sharp next-token distributions (so KL is not ~0).

    A freshly initialised model predicts almost uniformly, which makes every KL tiny; scaling
    the LM head and the residual writes makes layers and the adapter matter.
    """
    ctx = ProviderContext(
        seed=5,
        model_config=TinyModelConfig(
            source="tiny",
            arch=arch,  # type: ignore[arg-type]
            hidden_size=32,
            num_layers=num_layers,
            num_heads=2,
            intermediate_size=64,
            max_position_embeddings=256,
        ),
        lora_config=LoraConfig(r=4, alpha=8),
        training=kwargs.pop("training", None) or TrainingConfig(batch_size=4, max_seq_len=96),
        tokenizer_spec="builtin",
        num_tenants=3,
        public_data_uri=str(PUBLIC),
        **kwargs,
    )
    with torch.no_grad():
        for name, param in ctx.base_model().named_parameters():
            if name.endswith(("lm_head.weight", "o_proj.weight", "down_proj.weight", "c_proj.weight")):
                param.mul_(8.0)
    return ctx


@pytest.fixture
def make_provider() -> Callable[..., Provider]:
    """A FedBiOT provider (s=2, dropout 0.5) with algorithm fields overridden by keywords."""

    def build(ctx: ProviderContext | None = None, **fields: Any) -> Provider:
        ctx = ctx or tiny_context()
        config = FedBiOTConfig(name="fedbiot", **{"dropout": 0.5, **fields})
        split = layer_extract(ctx.model_config.num_layers, config.adapter_size, config.dropout)  # type: ignore[union-attr]
        return Provider.create(config, ctx, split)

    return build
