"""Held-out language-modelling loss: mean cross-entropy per target token.

Batches follow the Hugging Face causal-LM convention: ``labels`` are aligned with
``input_ids`` (the model's prediction at position t is scored against ``labels[t + 1]``) and
``-100`` marks tokens that carry no loss (prompt, padding). The mean is over all target tokens
of all batches, so a batch with many response tokens weighs more than one with few, unlike a
mean of per-batch means.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fedtune.core.errors import DataError
from fedtune.eval._model_utils import eval_mode, model_device

IGNORE_INDEX = -100


def lm_eval_loss(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]]) -> float:
    """Token-weighted mean cross-entropy of ``model`` on ``batches``.

    Args:
        model: A causal LM whose forward returns an object with ``.logits`` (B, T, V).
        batches: Mappings with ``input_ids`` and ``labels`` (B, T) and optionally
            ``attention_mask``.

    Returns:
        Sum of token losses over the number of tokens whose label is not -100.

    Raises:
        DataError: A batch lacks ``input_ids`` or ``labels``, their shapes differ, or no
            batch holds a single target token.
    """
    device = model_device(model)
    total_loss = 0.0
    total_tokens = 0
    with eval_mode(model):
        for index, batch in enumerate(batches):
            missing = [key for key in ("input_ids", "labels") if key not in batch]
            if missing:
                raise DataError(
                    f"evaluation batch {index} lacks {missing} (has {sorted(batch)})",
                    fix="Build batches with the training collator, which adds labels.",
                )
            input_ids = batch["input_ids"].to(device)
            labels = batch["labels"].to(device)
            if labels.shape != input_ids.shape:
                raise DataError(
                    f"evaluation batch {index}: labels shape {tuple(labels.shape)} differs from "
                    f"input_ids shape {tuple(input_ids.shape)}",
                    fix="Labels must be aligned with input_ids (the model shifts them).",
                )
            mask = batch.get("attention_mask")
            logits = model(
                input_ids=input_ids, attention_mask=None if mask is None else mask.to(device)
            ).logits
            # Position t predicts token t+1; float32 keeps the sum exact under bf16 models.
            shifted_logits = logits[:, :-1, :].float()
            targets = labels[:, 1:]
            total_loss += F.cross_entropy(
                shifted_logits.reshape(-1, shifted_logits.size(-1)),
                targets.reshape(-1),
                ignore_index=IGNORE_INDEX,
                reduction="sum",
            ).item()
            total_tokens += int((targets != IGNORE_INDEX).sum().item())
    if total_tokens == 0:
        raise DataError(
            "the evaluation batches hold no target token (every label is -100 or there are none)",
            fix="Check the evaluation split is not empty and responses are not cut off by "
            "max_length.",
        )
    return total_loss / total_tokens
