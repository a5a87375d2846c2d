"""The local training loop every LoRA-based client step shares.

Algorithms customise it through two hooks instead of copies of the loop: a ``regularizer``
added to the loss (FedProx's and FedBiOT's proximal terms) and a ``grad_correction`` added to
the gradients after backward (SCAFFOLD's ``c - c_i``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedtune.config.job import TrainingConfig

Batch = dict[str, torch.Tensor]
Regularizer = Callable[[dict[str, nn.Parameter]], torch.Tensor]


@dataclass(frozen=True)
class TrainResult:
    """What a local training run measured."""

    loss: float  # mean training loss over the steps
    steps: int
    tokens: int  # supervised (response) tokens seen
    seconds: float  # wall time inside forward/backward/step


def plan_steps(config: TrainingConfig, num_examples: int) -> int:
    """Optimizer steps of one round: ``local_steps``, or epochs x batches per epoch."""
    if config.local_steps is not None:
        return config.local_steps
    return (config.local_epochs or 1) * max(1, math.ceil(num_examples / config.batch_size))


def batch_indices(num_examples: int, batch_size: int, steps: int, seed: int) -> Iterator[list[int]]:
    """Seeded epochs of shuffled indices, cut into ``steps`` batches (last one may be short)."""
    generator = torch.Generator().manual_seed(seed)
    produced = 0
    while produced < steps:
        order = torch.randperm(num_examples, generator=generator).tolist()
        for start in range(0, num_examples, batch_size):
            if produced == steps:
                return
            yield order[start : start + batch_size]
            produced += 1


def make_optimizer(
    params: Sequence[nn.Parameter], config: TrainingConfig
) -> torch.optim.Optimizer:
    """The client optimizer the job asks for."""
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr)
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)


def train_local(
    model: nn.Module,
    params: dict[str, nn.Parameter],
    batches: Iterator[Batch],
    config: TrainingConfig,
    *,
    seed: int,
    regularizer: Regularizer | None = None,
    grad_correction: dict[str, torch.Tensor] | None = None,
    progress: Callable[[int, float], Any] | None = None,
) -> TrainResult:
    """Train ``params`` (the only tensors with gradients) over ``batches``.

    Args:
        model: a causal LM returning ``.loss`` when given ``labels``.
        params: trainable parameters by name; everything else is frozen.
        batches: collated batches (input_ids, attention_mask, labels).
        config: optimizer, lr and weight decay.
        seed: seeds dropout so a step is reproducible.
        regularizer: extra loss term on ``params`` (e.g. a proximal term).
        grad_correction: tensors added to each named gradient after backward.
        progress: called with (step, loss) after every step.
    """
    torch.manual_seed(seed)
    optimizer = make_optimizer(list(params.values()), config)
    model.train()
    losses: list[float] = []
    tokens = 0
    started = time.perf_counter()
    for step, batch in enumerate(batches, start=1):
        optimizer.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        total = loss + regularizer(params) if regularizer is not None else loss
        total.backward()
        if grad_correction is not None:
            for name, param in params.items():
                if param.grad is not None:
                    param.grad.add_(grad_correction[name])
        optimizer.step()
        losses.append(float(loss.detach()))
        tokens += int((batch["labels"] != -100).sum())
        if progress is not None:
            progress(step, losses[-1])
    model.eval()
    seconds = time.perf_counter() - started
    mean = sum(losses) / len(losses) if losses else float("nan")
    return TrainResult(loss=mean, steps=len(losses), tokens=tokens, seconds=seconds)


def proximal_term(anchor: dict[str, torch.Tensor], weight: float) -> Regularizer:
    """``(weight/2) * ||w - w_anchor||^2`` over the named parameters (FedProx Eq. 2; FedBiOT Eq. 1)."""

    def term(params: dict[str, nn.Parameter]) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float32)
        for name, param in params.items():
            total = total + (param - anchor[name]).pow(2).sum()
        return 0.5 * weight * total

    return term
