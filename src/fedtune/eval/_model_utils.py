"""Small helpers shared by the model-based metrics (loss, generation, multiple choice)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Evaluate without dropout or gradients (under autocast to a bf16/fp16 model's dtype),
    then give the model back in its former mode.

    Evaluation often runs between training steps (FedBiOT evaluates every round), so leaving
    the model in eval mode would silently turn dropout off for the rest of training.
    """
    from fedtune.training.precision import model_autocast

    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), model_autocast(model):
            yield
    finally:
        model.train(was_training)


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a parameterless module)."""
    for param in model.parameters():
        return param.device
    return torch.device("cpu")
