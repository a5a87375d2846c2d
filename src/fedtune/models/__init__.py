"""Models: tiny offline builds, Hugging Face loading and saving, LoRA helpers, tokenizers.

Functions take the narrow values they need (sizes, paths, LoRA hyperparameters), never a whole
job config.

Importing this package imports none of them: each name below loads its submodule on first use
(PEP 562), because the submodules import torch, transformers and PEFT (seconds per process) and
a step that only moves tensors, such as a KFP aggregate task, needs none of that.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedtune.models.loading import check_model_dir, load_pretrained, save_pretrained_dir
    from fedtune.models.lora import (
        DEFAULT_TARGETS,
        adapter_shapes,
        adapter_state,
        apply_lora,
        load_adapter,
        merge_and_export,
        save_adapter,
        set_adapter_state,
        trainable_parameters,
    )
    from fedtune.models.summary import describe
    from fedtune.models.tiny import ARCHS, Arch, build_tiny_model, tiny_config
    from fedtune.models.tokenizer import load_tokenizer, read_info, train_tokenizer

_HOME = {
    "describe": "summary",  # a module of another name: an imported submodule would shadow the function
    **dict.fromkeys(("check_model_dir", "load_pretrained", "save_pretrained_dir"), "loading"),
    **dict.fromkeys(
        (
            "DEFAULT_TARGETS",
            "adapter_shapes",
            "adapter_state",
            "apply_lora",
            "load_adapter",
            "merge_and_export",
            "save_adapter",
            "set_adapter_state",
            "trainable_parameters",
        ),
        "lora",
    ),
    **dict.fromkeys(("ARCHS", "Arch", "build_tiny_model", "tiny_config"), "tiny"),
    **dict.fromkeys(("load_tokenizer", "read_info", "train_tokenizer"), "tokenizer"),
}

__all__ = [
    "ARCHS",
    "DEFAULT_TARGETS",
    "Arch",
    "adapter_shapes",
    "adapter_state",
    "apply_lora",
    "build_tiny_model",
    "check_model_dir",
    "describe",
    "load_adapter",
    "load_pretrained",
    "load_tokenizer",
    "merge_and_export",
    "read_info",
    "save_adapter",
    "save_pretrained_dir",
    "set_adapter_state",
    "tiny_config",
    "train_tokenizer",
    "trainable_parameters",
]


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
