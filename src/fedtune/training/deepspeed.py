"""A narrow DeepSpeed wrapper for the provider's heavy training phases (the only deepspeed import).

The same code runs in three places: single-process on CPU in tests and on laptops (gloo
backend, CPU accelerator), and multi-process when a step runs on several ranks
(:mod:`fedtune.engines.provider.ranks` starts them with torch's elastic launcher, which sets the rank
variables). Without a
launcher, DeepSpeed reaches for MPI unless ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` are set, so :func:`ensure_single_process_env` sets them
(a free local port) when they are absent.

Under ZeRO-3 parameters live partitioned outside forward passes; :meth:`DeepSpeedTrainer.state`
gathers them before reading. A frozen teacher (:meth:`DeepSpeedTrainer.frozen`) is partitioned
the same way under ZeRO-3, in a second engine without optimizer, since at scale it is the
largest model of the step; under ZeRO-2, which partitions only gradients and optimizer
states, a frozen model has nothing to partition and is just moved to the device. The first initialisation on a machine compiles a C++ extension
(about a minute); later ones reuse ``~/.cache/torch_extensions``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedtune.core.errors import ConfigError

log = logging.getLogger(__name__)

_RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ensure_single_process_env() -> None:
    """Set the rank variables for a one-process group when no launcher set them."""
    if all(name in os.environ for name in _RANK_VARIABLES):
        return
    if any(name in os.environ for name in ("RANK", "WORLD_SIZE")):
        missing = [n for n in _RANK_VARIABLES if n not in os.environ]
        raise ConfigError(
            f"DeepSpeed: partial distributed environment, missing {missing}",
            fix="Start the step with the deepspeed or torchrun launcher, or unset RANK and "
            "WORLD_SIZE to run in a single process.",
        )
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # A free port rather than a fixed one: other processes on the machine may hold 29500.
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def load_config_file(path: str) -> dict[str, Any]:
    """Read a DeepSpeed JSON config.

    Raises:
        ConfigError: The file is missing, not JSON, or not a JSON object.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"algorithm.deepspeed.config_path={path!r} does not exist",
            fix="Point config_path at a DeepSpeed JSON file, or use zero_stage inline.",
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"algorithm.deepspeed.config_path={path!r} cannot be read as JSON: {exc}",
            fix="Fix the JSON file (DeepSpeed's config format).",
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"algorithm.deepspeed.config_path={path!r} holds a {type(data).__name__}, not an object",
            fix='The DeepSpeed config is a JSON object such as {"zero_optimization": {"stage": 2}}.',
        )
    return data


def build_config(
    *,
    micro_batch_size: int,
    zero_stage: int | None = None,
    bf16: bool | None = None,
    base: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A DeepSpeed config: ``base`` (a JSON file's content) or inline stage/bf16 settings.

    Batch sizes the file leaves out are filled in for one gradient-accumulation step, the
    client optimizer the caller passes is allowed under ZeRO, and gradient clipping is off
    unless asked for (as in the plain-torch path).

    Raises:
        ConfigError: The ZeRO stage is not 2 or 3.
    """
    config: dict[str, Any] = dict(base or {})
    if base is None:
        config["zero_optimization"] = {"stage": zero_stage or 2}
        config["bf16"] = {"enabled": bool(bf16)}
    stage = config.get("zero_optimization", {}).get("stage", 0)
    if stage not in (2, 3):
        raise ConfigError(
            f"algorithm.deepspeed: ZeRO stage {stage!r} is not supported",
            fix="Use zero_optimization.stage 2 or 3.",
        )
    config.setdefault("train_micro_batch_size_per_gpu", micro_batch_size)
    config.setdefault("gradient_accumulation_steps", 1)
    config.setdefault("zero_allow_untested_optimizer", True)
    # DeepSpeed 0.19 clips gradients to norm 1.0 unless told otherwise; the plain-torch path
    # does not clip, and the two must train alike. A file may still ask for clipping.
    config.setdefault("gradient_clipping", 0.0)
    config.setdefault("steps_per_print", 2**31 - 1)
    return config


class DeepSpeedTrainer:
    """One model under a DeepSpeed engine: forward, backward, step, and a gathered read-out."""

    def __init__(
        self,
        model: nn.Module,
        params: Iterable[nn.Parameter],
        optimizer: torch.optim.Optimizer,
        config: Mapping[str, Any],
    ) -> None:
        ensure_single_process_env()
        import deepspeed

        if not torch.distributed.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            deepspeed.init_distributed(dist_backend=backend)
        self._deepspeed = deepspeed
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, model_parameters=list(params), config=dict(config)
        )
        self.stage = int(dict(config).get("zero_optimization", {}).get("stage", 0))
        self._config = dict(config)
        self._frozen: list[Any] = []
        log.debug("DeepSpeed engine ready (ZeRO-%d)", self.stage)

    def frozen(self, model: nn.Module) -> Any:
        """A no-gradient model to run beside the trained one (a distillation teacher).

        Under ZeRO-3 it gets an inference-only engine of the same config (its parameters
        partitioned over the ranks, gathered layer by layer in forward; in the trained
        model's dtype); otherwise it is moved to the device as it is.
        """
        if self.stage != 3:
            return model.to(self.device)
        for param in model.parameters():
            param.requires_grad_(False)
        config = {k: v for k, v in self._config.items() if k not in ("optimizer", "scheduler")}
        engine, _, _, _ = self._deepspeed.initialize(model=model, config=config)
        engine.eval()
        self._frozen.append(engine)
        return engine

    @property
    def module(self) -> nn.Module:
        """The wrapped model."""
        return self.engine.module  # type: ignore[no-any-return]

    @property
    def device(self) -> torch.device:
        """Where inputs must go."""
        return self.engine.device  # type: ignore[no-any-return]

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype DeepSpeed trains in."""
        if self.engine.bfloat16_enabled():
            return torch.bfloat16
        if self.engine.fp16_enabled():
            return torch.float16
        return torch.float32

    def __call__(self, **inputs: Any) -> Any:
        """Forward through the engine."""
        return self.engine(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward with DeepSpeed's gradient handling."""
        self.engine.backward(loss)

    def step(self) -> None:
        """Optimizer step (and zero_grad)."""
        self.engine.step()

    def state(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        """Float32 CPU copies of the named parameters, gathered first under ZeRO-3."""
        wanted = set(names)
        params = {n: p for n, p in self.module.named_parameters() if n in wanted}
        with self._deepspeed.zero.GatheredParameters(
            list(params.values()), enabled=self.stage == 3
        ):
            return {
                n: p.detach().to("cpu", torch.float32, copy=True).contiguous()
                for n, p in params.items()
            }

    def close(self) -> None:
        """Release the engines' buffers and hooks (the process group stays for reuse)."""
        for engine in self._frozen:
            engine.destroy()
        self._frozen.clear()
        self.engine.destroy()
