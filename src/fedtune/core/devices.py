"""Which device a job's models run on: ``training.device`` against what this machine has.

Kept free of torch at import time: ``fedtune validate`` and the CLI's early worker start ask
it before any heavy import, and on a machine without a GPU device node torch is never needed
to answer.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fedtune.core.errors import ConfigError

if TYPE_CHECKING:
    from fedtune.config.job import TrainingConfig


def cuda_device_count() -> int:
    """The CUDA devices this process sees (0 without CUDA)."""
    nodes = (next(Path("/dev").glob(pattern), None) for pattern in ("nvidia[0-9]*", "kfd"))
    if sys.platform == "linux" and not any(nodes):
        # No NVIDIA or ROCm device node: no GPU, and no need to import torch, which would
        # delay the workers that the CLI starts before its own imports (see prestart).
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(training: TrainingConfig) -> str:
    """``cpu`` or ``cuda`` for ``training.device`` on this machine (auto: CUDA if any).

    A local worker sees only the GPU it is pinned to (CUDA_VISIBLE_DEVICES, device 0), so
    ``cuda`` there is its own device.

    Raises:
        ConfigError: ``device: cuda`` where CUDA reports no device, or fp16 on the CPU.
    """
    count = cuda_device_count()
    if training.device == "cuda" and count == 0:
        raise ConfigError(
            "training.device='cuda', but this machine has no CUDA device "
            "(torch.cuda.is_available() is False or no GPU is visible)",
            fix="Set training.device: auto (CUDA where there is a GPU, else CPU) or cpu, or run "
            "the job where a GPU is visible (check CUDA_VISIBLE_DEVICES and the driver).",
        )
    device = "cuda" if training.device == "cuda" or (training.device == "auto" and count) else "cpu"
    if device == "cpu" and training.precision == "fp16":
        raise ConfigError(
            f"training.precision='fp16' with training.device={training.device!r} resolves to "
            "the CPU here, where fp16 autocast is slow and poorly supported",
            fix="Use training.precision: bf16 (or fp32) on CPU, or run on a machine with a GPU.",
        )
    return device
