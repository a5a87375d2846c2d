"""The local training loop every LoRA-based client step shares.

Algorithms customise it through two hooks instead of copies of the loop: a ``regularizer``
added to the loss (FedProx's and FedBiOT's proximal terms) and a ``grad_correction`` added to
the gradients after backward (SCAFFOLD's ``c - c_i``).

A :class:`Segment` cuts the loop at a step boundary so that two processes can run one client
step one after the other (the worker pool's way of sharing a round's last tenant between
cores): the first saves everything the remaining steps read (trainable weights, optimizer
moments, the RNG, the losses so far) and raises :class:`Suspended`; the second restores it
and goes on. The arithmetic of every step is the same as in one uninterrupted loop, so the
result is bitwise equal.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import nn

from fedtune.config.job import TrainingConfig
from fedtune.training.precision import Runtime

Batch = dict[str, torch.Tensor]
Regularizer = Callable[[dict[str, nn.Parameter]], torch.Tensor]
T = TypeVar("T")
Checkpoint = tuple[dict[str, torch.Tensor], dict[str, Any]]  # tensors, JSON metadata


@dataclass
class Segment:
    """The steps of one client step's local training that this process runs.

    ``start`` steps were run elsewhere and are restored from ``load()``; at ``stop`` (None:
    the end) the state is handed to ``save`` and :class:`Suspended` is raised. ``values``
    carries what the client step computed before training (its eval loss) to the
    continuation, so it is not computed twice.
    """

    start: int
    stop: int | None
    load: Callable[[], Checkpoint]
    save: Callable[[Checkpoint], None]
    values: dict[str, Any] = field(default_factory=dict)
    _loaded: Checkpoint | None = field(default=None, repr=False)

    def restored(self) -> Checkpoint:
        """The earlier segment's state (read once); its ``values`` become this one's."""
        if self._loaded is None:
            self._loaded = self.load()
            self.values.update(self._loaded[1].get("values") or {})
        return self._loaded


class Suspended(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Local training stopped at its segment's end; the state is saved for the continuation."""

    def __init__(self, steps: int) -> None:
        super().__init__(f"local training suspended after {steps} step(s)")
        self.steps = steps


_SEGMENT: ContextVar[Segment | None] = ContextVar("fedtune_training_segment", default=None)


@contextmanager
def segment(part: Segment) -> Iterator[Segment]:
    """Run the block's (single) :func:`train_local` call as ``part``."""
    token = _SEGMENT.set(part)
    try:
        yield part
    finally:
        _SEGMENT.reset(token)


def before_training(name: str, compute: Callable[[], T]) -> T:
    """``compute()``, or its value from the segment that ran the first steps."""
    part = _SEGMENT.get()
    if part is None:
        return compute()
    if part.start and name in part.restored()[1].get("values", {}):
        return part.values[name]  # type: ignore[no-any-return]
    part.values[name] = value = compute()
    return value


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
    batches: Iterable[Batch],
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
        config: optimizer, lr and weight decay; device and precision (batches move to the
            device, forward passes run under its autocast, fp16 steps through a GradScaler).
        seed: seeds dropout so a step is reproducible.
        regularizer: extra loss term on ``params`` (e.g. a proximal term).
        grad_correction: tensors added to each named gradient after backward.
        progress: called with (step, loss) after every step.
    """
    from fedtune.training import dp_sgd  # the one hook: a tenant's own DP-SGD replaces the loop

    if (private := dp_sgd.active()) is not None:
        return private.train(model, params, batches, config, seed=seed, regularizer=regularizer,
                             grad_correction=grad_correction, progress=progress)
    torch.manual_seed(seed)
    runtime = Runtime.of(config)
    runtime.master(params)  # trained weights are fp32 whatever the model's dtype
    optimizer = make_optimizer(list(params.values()), config)
    stepper = runtime.stepper(optimizer)
    model.train()
    losses: list[float] = []
    tokens = 0
    spent = 0.0  # seconds of steps run by an earlier segment
    part = _SEGMENT.get()
    batches = iter(batches)
    if part is not None and part.start:
        losses, tokens, spent = _restore(part, params, optimizer)
        for _ in range(part.start):  # the same seeded order: skip what was trained
            next(batches)
    started = time.perf_counter()
    step = len(losses)
    forward = runtime.forward(model)
    with runtime.adapter_inputs_uncast(model):  # autocast recasts them anyway
        for batch in batches:
            if part is not None and part.stop is not None and step == part.stop:
                part.save(_checkpoint(part, params, optimizer, losses, tokens,
                                      spent + time.perf_counter() - started))
                raise Suspended(step)
            step += 1
            optimizer.zero_grad(set_to_none=True)
            with runtime.autocast():
                loss = forward(**runtime.batch(batch)).loss
            total = loss + regularizer(params) if regularizer is not None else loss
            stepper.backward(total)
            if grad_correction is not None:
                stepper.unscale()  # the correction is added to true gradients
                for name, param in params.items():
                    if param.grad is not None:
                        param.grad.add_(grad_correction[name].to(param.grad.device))
            stepper.step()
            losses.append(float(loss.detach()))
            tokens += int((batch["labels"] != -100).sum())
            if progress is not None:
                progress(step, losses[-1])
    model.eval()
    seconds = spent + time.perf_counter() - started
    mean = sum(losses) / len(losses) if losses else float("nan")
    return TrainResult(loss=mean, steps=len(losses), tokens=tokens, seconds=seconds)


def _checkpoint(
    part: Segment,
    params: dict[str, nn.Parameter],
    optimizer: torch.optim.Optimizer,
    losses: list[float],
    tokens: int,
    seconds: float,
) -> Checkpoint:
    """Everything the remaining steps read: weights, optimizer moments, RNG, losses so far."""
    tensors = {f"param/{n}": p.detach().clone() for n, p in params.items()}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"optimizer/{index}/{key}"] = torch.as_tensor(value).clone()
    tensors["rng"] = torch.get_rng_state()
    # float64 holds each Python float exactly (and a diverged step's NaN, which JSON cannot).
    tensors["losses"] = torch.tensor(losses, dtype=torch.float64)
    meta = {"steps": len(losses), "tokens": tokens, "seconds": seconds, "values": part.values}
    return tensors, meta


def _restore(
    part: Segment, params: dict[str, nn.Parameter], optimizer: torch.optim.Optimizer
) -> tuple[list[float], int, float]:
    tensors, meta = part.restored()
    if meta.get("steps") != part.start or set(params) != {
        k.removeprefix("param/") for k in tensors if k.startswith("param/")
    }:
        raise RuntimeError(
            f"the saved local-training state ({meta.get('steps')} steps) does not continue "
            f"this segment (from step {part.start})"
        )
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(tensors[f"param/{name}"])
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer/"):
            _, index, name = key.split("/", 2)
            state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})
    torch.set_rng_state(tensors["rng"])
    return tensors["losses"].tolist(), int(meta["tokens"]), float(meta["seconds"])


def proximal_term(anchor: dict[str, torch.Tensor], weight: float) -> Regularizer:
    """``(weight/2) * ||w - w_anchor||^2`` over the named parameters (FedProx Eq. 2; FedBiOT Eq. 1)."""

    placed: dict[str, torch.Tensor] = {}  # the anchor on the parameters' device, copied once

    def term(params: dict[str, nn.Parameter]) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float32)
        for name, param in params.items():
            if name not in placed:
                placed[name] = anchor[name].to(param.device)
            total = total + (param - placed[name]).pow(2).sum()
        return 0.5 * weight * total

    return term
