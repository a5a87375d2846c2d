"""Tiny Llama and GPT-2 models built offline from a config, with seeded weights.

Laptop runs, tests and CI cannot download weights, so every model they use is built here from
a handful of numbers. The same arguments and seed always give bitwise-identical weights.
"""

from __future__ import annotations

import logging
from typing import Literal, get_args

import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
)

from fedtune.core.errors import ModelError

logger = logging.getLogger(__name__)

Arch = Literal["llama", "gpt2"]
ARCHS: tuple[str, ...] = get_args(Arch)


def _check_shape_args(
    *,
    arch: str,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    special_ids: dict[str, int],
) -> None:
    """Collect every inconsistent argument and raise one ModelError naming them all."""
    problems: list[str] = []
    if arch not in ARCHS:
        problems.append(f"arch={arch!r} is not one of {list(ARCHS)}")
    for name, value in (
        ("vocab_size", vocab_size),
        ("hidden_size", hidden_size),
        ("num_layers", num_layers),
        ("num_heads", num_heads),
        ("intermediate_size", intermediate_size),
        ("max_position_embeddings", max_position_embeddings),
    ):
        if value < 1:
            problems.append(f"{name}={value} must be >= 1")
    if num_heads >= 1 and hidden_size % num_heads != 0:
        problems.append(f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}")
    elif arch == "llama" and num_heads >= 1 and (hidden_size // num_heads) % 2 != 0:
        # Rotary embeddings rotate pairs of channels, so each head needs an even width.
        problems.append(
            f"head width hidden_size/num_heads={hidden_size // num_heads} must be even for llama"
        )
    for name, token_id in special_ids.items():
        if not 0 <= token_id < vocab_size:
            problems.append(f"{name}={token_id} is outside the vocabulary [0, {vocab_size})")
    if problems:
        raise ModelError(
            "cannot build the tiny model: " + "; ".join(problems),
            fix="Correct the model section of the job file (sizes and special token ids).",
        )


def tiny_config(
    arch: Arch,
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    bos_token_id: int,
    eos_token_id: int,
    pad_token_id: int,
) -> PretrainedConfig:
    """The Hugging Face config of a tiny model (validated; no weights).

    Dropout is off for both architectures: Llama has none by default, and switching GPT-2's off
    too keeps the two comparable and local training reproducible from the seed alone.
    """
    _check_shape_args(
        arch=arch,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        special_ids={
            "bos_token_id": bos_token_id,
            "eos_token_id": eos_token_id,
            "pad_token_id": pad_token_id,
        },
    )
    if arch == "llama":
        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_heads,
            intermediate_size=intermediate_size,
            max_position_embeddings=max_position_embeddings,
            tie_word_embeddings=False,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
        )
    return GPT2Config(
        vocab_size=vocab_size,
        n_embd=hidden_size,
        n_layer=num_layers,
        n_head=num_heads,
        n_inner=intermediate_size,
        n_positions=max_position_embeddings,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )


def build_tiny_model(
    arch: Arch,
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    seed: int,
    bos_token_id: int,
    eos_token_id: int,
    pad_token_id: int,
    dtype: torch.dtype = torch.float32,
) -> PreTrainedModel:
    """Build a causal LM in eval mode whose weights depend only on the arguments.

    Args:
        arch: ``"llama"`` or ``"gpt2"``.
        vocab_size: Rows of the embedding and LM head; at least the tokenizer's size.
        hidden_size: Model width; divisible by ``num_heads``.
        num_layers: Decoder layers.
        num_heads: Attention heads (Llama: as many key/value heads).
        intermediate_size: Width of the MLP.
        max_position_embeddings: Longest sequence the model accepts.
        seed: Seed of the weight initialisation.
        bos_token_id: Begin-of-sequence id, inside the vocabulary.
        eos_token_id: End-of-sequence id, inside the vocabulary.
        pad_token_id: Padding id, inside the vocabulary.
        dtype: Dtype the weights are created (and initialised) in.

    Returns:
        A freshly initialised ``PreTrainedModel``.

    Raises:
        ModelError: An argument is out of range or the sizes do not fit together.
    """
    config = tiny_config(
        arch,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    # fork_rng restores the caller's RNG afterwards: building a model must not shift the random
    # stream of whatever training or sampling code runs next.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: PreTrainedModel = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=dtype
        )
    model.eval()  # type: ignore[no-untyped-call]
    logger.debug(
        "built tiny %s: hidden=%d layers=%d vocab=%d seed=%d",
        arch,
        hidden_size,
        num_layers,
        vocab_size,
        seed,
    )
    return model
