"""Tiny model settings shared by the models tests (hidden 32, 2 layers, vocab 300)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

from fedtune.models import build_tiny_model

ARCHS = ["llama", "gpt2"]


def tiny_kwargs(**overrides: Any) -> dict[str, Any]:
    """Arguments of build_tiny_model for a model that runs in milliseconds."""
    kwargs: dict[str, Any] = {
        "vocab_size": 300,
        "hidden_size": 32,
        "num_layers": 2,
        "num_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
        "seed": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    kwargs.update(overrides)
    return kwargs


def tiny(arch: str, **overrides: Any) -> PreTrainedModel:
    return build_tiny_model(arch, **tiny_kwargs(**overrides))  # type: ignore[arg-type]


def logits(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits  # type: ignore[no-any-return]


def sample_ids() -> torch.Tensor:
    """A fixed batch of two 12-token sequences of ordinary (non-special) ids."""
    return torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(7))
