"""Tiny models for tests, built offline from a config around a given tokenizer."""

from __future__ import annotations

from typing import Any

import torch

from fedtune.models import build_tiny_model


def tiny_llama_for(
    tokenizer: Any, *, num_layers: int = 2, seed: int = 0, max_positions: int = 256
) -> torch.nn.Module:
    """A hidden-32 Llama whose vocabulary and special tokens are ``tokenizer``'s."""
    return build_tiny_model(
        "llama",
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_layers=num_layers,
        num_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_positions,
        seed=seed,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
