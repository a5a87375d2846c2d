"""Rank shards of a batch: their weighted, averaged gradients are the whole batch's gradient.

The reference is the one-process gradient of Eq. 2's token-mean loss on the whole batch; the
ranks are simulated in one process (what each would compute on its rows, then the average an
all-reduce takes), for uneven shards and for a batch with fewer rows than ranks.
"""

from __future__ import annotations

import pytest
import torch

from fedtune.training.distill import alignment_loss
from fedtune.training.distributed import World, gradient_scale, shard_rows


def _batch(lengths: list[int], width: int = 6) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(len(lengths))
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    return {"input_ids": torch.randn(len(lengths), width, 4, generator=generator), "attention_mask": mask}


def _loss(weight: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    x = batch["input_ids"]
    hidden = x @ weight
    logits = hidden @ weight.T
    loss, _ = alignment_loss(
        student_hidden=hidden,
        teacher_hidden=x.flip(-1),
        student_logits=logits,
        teacher_logits=x,
        mask=batch["attention_mask"],
        kl_lambda=0.5,
    )
    return loss


@pytest.mark.parametrize(
    ("lengths", "size"),
    [([6, 2, 5, 1, 3], 2), ([6, 2, 5, 1, 3], 3), ([5, 2], 3)],
    ids=["uneven-2-ranks", "uneven-3-ranks", "fewer-rows-than-ranks"],
)
def test_averaged_shard_gradients_equal_the_whole_batch_gradient(lengths: list[int], size: int) -> None:
    batch = _batch(lengths)
    weight = torch.randn(4, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
    (reference,) = torch.autograd.grad(_loss(weight, batch), weight)
    summed = torch.zeros_like(weight)
    shares = []
    for rank in range(size):
        world = World(rank=rank, size=size)
        rows, share = shard_rows(batch, world)
        shares.append(share)
        (grad,) = torch.autograd.grad(_loss(weight, rows) * gradient_scale(share, world), weight)
        summed += grad
    torch.testing.assert_close(summed / size, reference, rtol=1e-5, atol=1e-7)
    assert sum(shares) == pytest.approx(1.0)
    unweighted = sum(torch.autograd.grad(_loss(weight, shard_rows(batch, World(r, size))[0]), weight)[0] for r in range(size)) / size
    assert not torch.allclose(unweighted, reference, rtol=1e-3)  # the weighting is what matters


def test_a_rank_without_rows_runs_one_row_with_no_weight() -> None:
    rows, share = shard_rows(_batch([4, 2]), World(rank=2, size=3))
    assert rows["attention_mask"].shape[0] == 1 and share == 0.0


def test_one_process_is_a_world_of_one_writer() -> None:
    world = World.current()
    assert (world.rank, world.size, world.writer, world.sharded) == (0, 1, True, False)
