"""Functions that rank processes run in the launcher's tests (spawned ranks import them)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from fedtune.core.errors import DataError


def rank_sum() -> dict[str, float]:
    """Every rank adds its rank + 1: the launcher returns rank 0's view of the sum."""
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    return {"rank": float(dist.get_rank()), "sum": float(value)}


def fail_on_rank_one(kind: str) -> None:
    """Rank 1 raises (a plain bug, or a fedtune error) while rank 0 waits in a collective."""
    if dist.get_rank() == 1:
        if kind == "fedtune":
            raise DataError("record 3 has no 'output'", fix="Add the field.")
        raise ValueError("boom in rank 1")
    dist.barrier()
