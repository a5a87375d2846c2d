"""Which device a job's models run on: ``training.device`` against what this machine has.

Kept free of torch at import time: ``fedtune validate`` and the CLI's early worker start ask
it before any heavy import, and on a machine without a GPU device node torch is never needed
to answer.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fedtune.core.errors import ConfigError

BACKEND_ENV = "FEDTUNE_COMPILE_BACKEND"
"""The ``torch.compile`` backend of ``training.compile`` (default inductor; the CPU tests use
aot_eager, which traces the same graphs without generating kernels)."""

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
    check_acceleration(training.compile, training.kernels, device)
    return device


def check_acceleration(compile_forward: bool, kernels: str, device: str) -> None:
    """Refuse ``training.compile`` / ``training.kernels`` that this machine cannot run on
    ``device`` (``cpu`` or ``cuda``), before a model is built.

    Raises:
        ConfigError: ``kernels: liger`` off CUDA or without liger-kernel installed;
            ``compile`` on the CPU without a C++ compiler, or on CUDA without Triton.
    """
    if kernels == "liger":
        if device != "cuda":
            raise ConfigError(
                f"training.kernels: liger needs a CUDA GPU, but the job trains on {device} "
                "(Liger-Kernel's kernels are Triton GPU kernels)",
                fix="Set training.kernels: none on this machine, or run where a GPU is visible "
                "with training.device: auto or cuda.",
            )
        if importlib.util.find_spec("liger_kernel") is None:
            raise ConfigError(
                "training.kernels: liger, but the liger-kernel package is not installed",
                fix="`pip install liger-kernel` in the image or environment that trains, or set "
                "training.kernels: none.",
            )
    if compile_forward and compile_backend() == "inductor":
        if device == "cpu" and _cxx_compiler() is None:
            raise ConfigError(
                "training.compile: true on the CPU, but no C++ compiler is on PATH (torch "
                "inductor builds C++ kernels; looked for $CXX, g++, c++, clang++)",
                fix="Install one (e.g. `apt-get install g++`) or set training.compile: false.",
            )
        if device == "cuda" and importlib.util.find_spec("triton") is None:
            raise ConfigError(
                "training.compile: true on CUDA, but the triton package is not installed "
                "(torch inductor generates Triton kernels)",
                fix="Install the triton build that matches torch, or set training.compile: false.",
            )


def compile_backend() -> str:
    """The ``torch.compile`` backend: ``$FEDTUNE_COMPILE_BACKEND``, else inductor."""
    return os.environ.get(BACKEND_ENV) or "inductor"


def _cxx_compiler() -> str | None:
    names = [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
    return next((path for name in names if name and (path := shutil.which(name))), None)
