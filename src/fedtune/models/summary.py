"""A one-line-per-field summary of a model for logs and run metadata."""

from __future__ import annotations

from typing import Any

from peft import PeftModel
from torch import nn


def describe(model: nn.Module) -> dict[str, Any]:
    """Architecture, depth, width and parameter counts of a (possibly PEFT-wrapped) model.

    Returns:
        ``{"arch", "layers", "hidden", "vocab", "params_total", "params_trainable", "peft"}``;
        shared (tied) parameters are counted once.
    """
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    config = getattr(base, "config", None)
    params = list(model.parameters())  # parameters() yields a tied tensor only once
    return {
        "arch": getattr(config, "model_type", type(base).__name__),
        "layers": getattr(config, "num_hidden_layers", None),
        "hidden": getattr(config, "hidden_size", None),
        "vocab": getattr(config, "vocab_size", None),
        "params_total": sum(p.numel() for p in params),
        "params_trainable": sum(p.numel() for p in params if p.requires_grad),
        "peft": isinstance(model, PeftModel),
    }
