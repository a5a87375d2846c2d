"""The provider's emulator alignment (FedBiOT Eq. 2) on public data, in torch or DeepSpeed.

Student: AdapEmu (E + A) with only E's layers trainable. Teacher: AdapFu (E* + A), frozen.
Per batch, the L2 term compares the student's activations after its last emulator layer with
the teacher's after its last E* layer (the input the adapter receives), and the KL term
compares the two models' next-token distributions; both are masked to real tokens
(:mod:`fedtune.training.distill`). The adapter is the current global one, frozen.

Only the emulator's weights are kept between phases (each phase is a pod), so the optimizer
starts fresh per phase: SGD, the paper's choice, has no state to lose; AdamW's moments
restart each phase (documented in the config).

Under several ranks (:mod:`fedtune.training.distributed`) each rank trains on its rows of
every batch, its loss weighted by its share of the batch's tokens, and gradients are
all-reduced (DDP, or the DeepSpeed engine): every rank ends with the emulator one process
would have trained. Under ZeRO-3 the frozen teacher is partitioned across the ranks too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedtune.data.tokenize import collate
from fedtune.training import distributed
from fedtune.training.distill import alignment_loss, masked_kl, masked_l2
from fedtune.training.local import Batch, batch_indices
from fedtune.training.precision import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AlignPlan:
    """How one alignment phase runs."""

    steps: int
    lr: float
    optimizer: str  # "sgd" | "adamw"
    kl_lambda: float
    normalize_l2: bool
    deepspeed: dict[str, Any] | None = None  # a full DeepSpeed config, or None for torch
    #: Device and precision (torch path; under DeepSpeed its config's bf16 decides).
    runtime: Runtime = field(default_factory=Runtime)


@dataclass(frozen=True)
class Pair:
    """Student and teacher with the hidden-state index of each one's emulator output."""

    student: nn.Module
    teacher: nn.Module
    student_position: int
    teacher_position: int


def public_batches(
    encoded: Sequence[dict[str, list[int]]], batch_size: int, steps: int, seed: int, pad_id: int
) -> Iterator[Batch]:
    """``steps`` seeded batches of public examples, epoch by epoch."""
    for idx in batch_indices(len(encoded), batch_size, steps, seed):
        yield collate([encoded[i] for i in idx], pad_id)


def _forward(model: Any, batch: Batch, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        output_hidden_states=True,
    )
    return out.hidden_states[position], out.logits


def _optimizer(params: list[nn.Parameter], plan: AlignPlan) -> torch.optim.Optimizer:
    if plan.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=plan.lr, weight_decay=0.0)
    return torch.optim.SGD(params, lr=plan.lr)


def align(
    pair: Pair, trainable: Sequence[str], batches: Iterable[Batch], plan: AlignPlan, *, seed: int
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Run ``plan.steps`` alignment steps; return the trained tensors and mean loss terms.

    Args:
        pair: Student (modified in place) and teacher.
        trainable: Student parameter names to train (the emulator layers).
        batches: At least ``plan.steps`` public batches.
        plan: Steps, optimizer, lambda, and the DeepSpeed config if any.
        seed: Seeds the step (models without dropout are deterministic anyway).

    Returns:
        Float32 copies of the trained parameters (student names) and the mean of each term.
    """
    names = set(trainable)
    params = {n: p for n, p in pair.student.named_parameters() if n in names}
    for name, param in pair.student.named_parameters():
        param.requires_grad_(name in names)
    torch.manual_seed(seed)
    runtime = plan.runtime
    if plan.deepspeed is None:
        runtime.master(params)  # the emulator trains in fp32 under a bf16/fp16 model
    optimizer = _optimizer(list(params.values()), plan)
    stepper = runtime.stepper(optimizer)
    world = distributed.World.current()
    trainer: Any = None
    run_model: Any = runtime.forward(pair.student)  # plain, or compiled (training.compile)
    teacher: Any = pair.teacher
    device = runtime.device
    if plan.deepspeed is not None:
        from fedtune.training.deepspeed import DeepSpeedTrainer

        trainer = DeepSpeedTrainer(pair.student, params.values(), optimizer, plan.deepspeed)
        run_model = trainer
        # DeepSpeed moved the student to its device (a GPU on the cluster): the frozen teacher
        # follows it (partitioned under ZeRO-3), and so do the batches.
        teacher = trainer.frozen(pair.teacher)
        device = trainer.device
    elif world.sharded:
        from torch.nn.parallel import DistributedDataParallel

        device = world.device()
        pair.student.to(device)
        pair.teacher.to(device)
        ids = [device.index] if device.type == "cuda" else None
        run_model = DistributedDataParallel(pair.student, device_ids=ids)
    pair.student.train()
    sums: dict[str, float] = {}
    steps = 0
    try:
        for cpu_batch in batches:
            if steps == plan.steps:
                break
            share = 1.0
            if world.sharded:
                cpu_batch, share = distributed.shard_rows(cpu_batch, world)
            batch = {k: v.to(device) for k, v in cpu_batch.items()}
            mask = batch["attention_mask"]
            with torch.no_grad(), runtime.autocast():
                teacher_hidden, teacher_logits = _forward(teacher, batch, pair.teacher_position)
            with runtime.autocast():
                student_hidden, student_logits = _forward(run_model, batch, pair.student_position)
            loss, parts = alignment_loss(
                student_hidden=student_hidden,
                teacher_hidden=teacher_hidden,
                student_logits=student_logits if plan.kl_lambda else None,
                teacher_logits=teacher_logits if plan.kl_lambda else None,
                mask=mask,
                kl_lambda=plan.kl_lambda,
                normalize=plan.normalize_l2,
            )
            if world.sharded:
                loss = loss * distributed.gradient_scale(share, world)
                parts = distributed.combine_means(parts, share)
            if trainer is not None:
                trainer.backward(loss)
                trainer.step()
            else:
                optimizer.zero_grad(set_to_none=True)
                stepper.backward(loss)
                stepper.step()
            for key, value in parts.items():
                sums[key] = sums.get(key, 0.0) + value
            steps += 1
        if trainer is not None:
            trained = trainer.state(names)
        else:
            trained = {n: p.detach().to("cpu", torch.float32).clone() for n, p in params.items()}
    finally:
        if trainer is not None:
            trainer.close()
        pair.student.eval()
        for param in pair.student.parameters():
            param.requires_grad_(False)
    means = {k: v / steps for k, v in sums.items()} if steps else {}
    log.debug("aligned the emulator for %d step(s): %s", steps, means)
    return trained, means


def measure(pair: Pair, batches: Iterable[Batch], *, normalize_l2: bool) -> dict[str, float]:
    """Token-weighted L2 and KL of Eq. 2 on held-out batches (no training)."""
    from fedtune.eval._model_utils import model_device
    from fedtune.training.precision import model_autocast

    totals = {"l2": 0.0, "kl": 0.0}
    tokens = 0.0
    device = model_device(pair.student)
    with torch.no_grad(), model_autocast(pair.student):
        for cpu_batch in batches:
            batch = {k: v.to(device) for k, v in cpu_batch.items()}
            mask = batch["attention_mask"]
            count = float(mask.sum())
            teacher_hidden, teacher_logits = _forward(pair.teacher, batch, pair.teacher_position)
            student_hidden, student_logits = _forward(pair.student, batch, pair.student_position)
            totals["l2"] += count * float(
                masked_l2(student_hidden, teacher_hidden, mask, normalize=normalize_l2)
            )
            totals["kl"] += count * float(masked_kl(teacher_logits, student_logits, mask))
            tokens += count
    if not tokens:
        return {"l2": math.nan, "kl": math.nan}
    return {k: v / tokens for k, v in totals.items()}
