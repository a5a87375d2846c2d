"""Which rank of a step this process is (a world of one without a process group).

Both sides ask it: a provider step run on several ranks (:mod:`fedtune.training.distributed`)
and the step bodies that let only rank 0 write state (:mod:`fedtune.engines.steps`). It holds
no training code, so asking it brings no provider module into a tenant's process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    """This process's rank among ``size`` ranks of a step."""

    rank: int = 0
    size: int = 1

    @classmethod
    def current(cls) -> World:
        """The initialised process group's rank and size, else a world of one."""
        if dist.is_available() and dist.is_initialized():
            return cls(rank=dist.get_rank(), size=dist.get_world_size())
        return cls()

    @property
    def writer(self) -> bool:
        """Rank 0 alone writes state, logs metrics and writes the step's outputs."""
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        """More than one rank shares the work."""
        return self.size > 1

    def device(self) -> torch.device:
        """Where this rank computes: its own GPU under NCCL, else the CPU (gloo)."""
        if dist.is_initialized() and dist.get_backend() == "nccl":
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")
