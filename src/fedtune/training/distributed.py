"""Data parallelism inside one provider step: a rank's rows of a batch, and how the ranks'
token means add up to the one-process mean (which rank this is: :mod:`fedtune.training.world`).

A multi-rank step (:mod:`fedtune.engines.provider.ranks`) runs the same deterministic step on every
rank: each draws the same seeded batches and keeps the rows ``rank::world`` of each. The
alignment losses are means over real tokens (:mod:`fedtune.training.distill`), so rank ``r``
weighs its mean by its share of the batch's real tokens, ``n_r / n``; the data-parallel
all-reduce averages gradients over ``W`` ranks, hence the loss is scaled by ``W * n_r / n``.
The sum over ranks is then the gradient of the whole batch's token mean, exactly (up to
float summation order): equal-size shards are not needed. A rank whose shard is empty (a
batch with fewer rows than ranks) runs a row with weight 0 so that it still joins the
all-reduce.

Without an initialised process group everything here is the one-process identity, and the
training loops do not call it at all, so a single-rank step is bit for bit what it was.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from fedtune.training.local import Batch
from fedtune.training.world import World

__all__ = ["World", "gradient_scale", "shard_rows"]


def shard_rows(batch: Batch, world: World) -> tuple[Batch, float]:
    """This rank's rows of a collated batch and its share of the batch's real tokens.

    Rows are taken after collation, so every rank keeps the one-process padding: a row's
    activations are those it has in the whole batch.
    """
    mask = batch["attention_mask"]
    rows = list(range(world.rank, int(mask.shape[0]), world.size))
    if not rows:  # fewer rows than ranks: run one row, weighted 0, to join the all-reduce
        return {k: v[:1] for k, v in batch.items()}, 0.0
    total = float(mask.sum())
    return {k: v[rows] for k, v in batch.items()}, float(mask[rows].sum()) / total


def gradient_scale(share: float, world: World) -> float:
    """Factor on a rank's token-mean loss so that averaged gradients are the batch's."""
    return share * world.size


def combine_means(parts: dict[str, float], share: float) -> dict[str, float]:
    """The whole batch's token means from every rank's (``sum_r share_r * mean_r``)."""
    names = sorted(parts)
    values = torch.tensor([parts[n] * share for n in names], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        values = values.to(World.current().device())
    dist.all_reduce(values)
    return {n: float(v) for n, v in zip(names, values.cpu().tolist(), strict=True)}
